"""A generating plan over a request stream: each request a prefill and its decode steps.

A plan made with `--slo-ttft/--slo-tpot` (it carries `generation`) serves a decoder: a request
of P context tokens generating G tokens is one invocation of its driver (`ground.generation`),
a prefill of the P tokens, then G - 1 decode steps of one token. Requests are not batched
together (each invocation decodes one sequence; admitting arrivals into a running batch is
continuous batching, not built). Per request, from the plan's own model:

    TTFT = the prefill of P tokens (`workflow.workflow_model`: the driver request at that size,
           interpolated on its grid) + the cold starts it waited on
    TPOT = one decode step of one sequence (`planner.generation.plan_decode`)
    end-to-end = TTFT + (G - 1) TPOT
    bill = the prefill's bill at P tokens + (G - 1) x a step's bill; INIT and what cold starts
           make the driver wait are billed as `simulate` bills them

Cold starts: every function's environments are simulated as `simulate` does a driver plan
(`_kernels.run_pools`, one row per request): the driver's environment is held for the whole
generation, so concurrent requests need their own; a remote expert's environment for its
prefill call. The decode steps' remote calls reuse the environments the prefill warmed (every
expert with predicted tokens is called in a prefill), and how long they hold them (a round trip
per step) is not simulated; all cold starts therefore fall in the prefill, before the first
token.

Refused requests (counted, not served, not billed; the JSON says how many and why):
- the generation, TTFT + (G - 1) TPOT warm, outlasts one invocation: Lambda's timeout, or
  Express's duration when the plan's one-state workflow is Express. A long generation is
  refused, not continued in a new invocation with its KV cache in S3: `moelambda generate`
  refuses such a request the same way before it starts;
- the driver cannot hold the request's KV cache, P + G tokens (`GenerationPlan.kv_cache_mb`
  per planned token), beside its runtime, stages, local experts and the prompt's activations;
- a remote expert's share of the prompt needs more replicas than its cap (as `simulate`).

Failed requests (served, billed whole, their tokens not counted): a remote expert throttled
past the state machine's last retry (as in `simulate`), and a generation that cold starts and
throttling push past the invocation's limit (timed out; the driver's own INIT counted in it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.coldstart import retry_waits
from ground.driver import remote_table_bytes
from ground.errors import UsageError
from ground.plan import Plan
from planner.generation import plan_decode
from planner.traffic._kernels import run_pools
from planner.traffic.platform import platform_for, traffic_calibration
from planner.traffic.simulate import Platform, _capacity_arrays, _waiting_gb_s
from planner.traffic.spec import Arrivals
from planner.traffic.workflow import BILL_ITEMS, WorkflowModel, manifest_of_plan, workflow_model

if TYPE_CHECKING:
    from planner.calibration import Calibration

__all__ = ["GenerationTraffic", "generation_limits", "generation_report", "simulate_generation"]

REFUSALS = ("over_time_limit", "over_memory", "over_replicas")


@dataclass(frozen=True, eq=False)
class GenerationTraffic:
    """A simulated period of a generating plan: per request (inf or nan where not served),
    why requests were refused, and the bill."""

    ttft_s: np.ndarray  # (requests,) inf where refused or failed
    tpot_s: np.ndarray  # nan where refused, failed or generating a single token
    e2e_s: np.ndarray  # inf where refused or failed
    refused: dict[str, np.ndarray]  # REFUSALS -> (requests,) bool, first reason only
    failed: dict[str, np.ndarray]  # throttled past the last retry, timed out: (requests,) bool
    input_tokens: int  # context tokens of the requests served to the end
    output_tokens: int  # their generated tokens
    bill_usd: dict[str, float]
    cold_starts: dict[str, int]
    peak_environments: dict[str, int]
    time_limit_s: float
    period_s: float
    idle_s: float  # idle seconds before an environment is reclaimed
    parameters_from: str  # where the traffic parameters came from (the plan, or a file)
    wall_s: float

    @property
    def served(self) -> np.ndarray:
        return np.isfinite(self.e2e_s)

    def summary(self, slo_s: float | None) -> dict[str, Any]:
        """The JSON object `moelambda traffic --json` prints for a generating plan: quantiles
        of the served requests; the SLO (end to end) is missed by refused ones too."""
        requests = int(self.e2e_s.size)
        refused = {name: int(mask.sum()) for name, mask in self.refused.items()}
        refused_all = sum(refused.values())
        return {
            "requests": requests,
            "served": int(self.served.sum()),
            "refused": refused | {"total": refused_all},
            "refused_fraction": refused_all / requests if requests else 0.0,
            "failed": {name: int(mask.sum()) for name, mask in self.failed.items()},
            "time_limit_s": self.time_limit_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "period_s": self.period_s,
            "ttft_s": _quantiles(self.ttft_s),
            "tpot_s": _quantiles(self.tpot_s),
            "e2e_s": _quantiles(self.e2e_s),
            "slo_s": slo_s,
            "slo_attainment": None
            if slo_s is None or not requests
            else float(np.mean(self.e2e_s <= slo_s)),
            "cold_starts": {
                "count": int(sum(self.cold_starts.values())),
                "per_function": {n: c for n, c in self.cold_starts.items() if c},
            },
            "peak_environments": self.peak_environments,
            "bill_usd": self.bill_usd,
            "idle_reclaim_s": self.idle_s,
            "traffic_parameters_from": self.parameters_from,
            "wall_s": round(self.wall_s, 3),
        }


def _quantiles(values: np.ndarray) -> dict[str, float | None]:
    """p50, p99 and max of the finite values (None when there are none): observed values."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"p50": None, "p99": None, "max": None}
    qs = np.quantile(finite, [0.5, 0.99, 1.0], method="inverted_cdf")
    return {k: float(v) for k, v in zip(("p50", "p99", "max"), qs, strict=True)}


def generation_limits(plan: Plan) -> tuple[float, float, float, float]:
    """(seconds one invocation may run, the driver's fixed MB, its MB per prompt token of
    activations, per token of KV cache) of a generating plan: what a request must fit.

    The invocation is Lambda's timeout, or Express's duration under an Express workflow. The
    driver's fixed memory is its runtime, stages and local experts; the prompt's activations
    grow with its tokens (`DriverPlan.activations_mb` of the planned batch), the KV cache with
    the context and the generated tokens (`GenerationPlan.kv_cache_mb` over B (P + G)).
    """
    gen, driver, cal = plan.generation, plan.driver, plan.calibration
    assert gen is not None and driver is not None
    limit = float(cal["max_timeout_s"])
    if plan.workflow == "express":
        limit = min(limit, float(cal["express_max_duration_s"]))
    fixed = float(cal["driver_runtime_mb"]) + driver.weights_mb
    activations = driver.activations_mb / plan.totals.tokens
    kv = gen.kv_cache_mb / (gen.batch_sequences * (gen.prompt_tokens + gen.new_tokens))
    return limit, fixed, activations, kv


def _refusals(
    plan: Plan, model: WorkflowModel, context: np.ndarray, generated: np.ndarray, run_s: np.ndarray
) -> tuple[dict[str, np.ndarray], float]:
    """(each request's first reason to be refused, the invocation's limit): replicas, memory,
    then time, so a request counts once."""
    limit, fixed_mb, activations_mb, kv_mb = generation_limits(plan)
    need_mb = fixed_mb + activations_mb * context + kv_mb * (context + generated)
    over_replicas = context > model.feasible_tokens
    over_memory = ~over_replicas & (need_mb > plan.nonmoe_memory_mb + 1e-9)
    over_time = ~over_replicas & ~over_memory & (run_s > limit)
    refused = dict(zip(REFUSALS, (over_time, over_memory, over_replicas), strict=True))
    return refused, limit


def simulate_generation(
    plan: Plan,
    arrivals: Arrivals,
    calibration: Calibration | None = None,
    *,
    idle_s: float | None = None,
    reserve: bool = True,
) -> GenerationTraffic:
    """Replay `arrivals` through a generating `plan` (see the module docstring).

    Args:
        plan: A plan with a `generation` block (`moelambda plan --slo-ttft/--slo-tpot`).
        arrivals: The stream; its `generated` tokens per request are required.
        calibration: Where traffic parameters the plan lacks come from (default: packaged).
        idle_s: Idle seconds before reclaim. Defaults to None: the calibration's assumption.
        reserve: Whether the stack reserves each expert function's `max_replicas`.

    Raises:
        UsageError: The plan does not generate, or the stream does not say what each request
            generates.
    """
    started = time.perf_counter()
    if plan.generation is None:  # only a generating deployment has one (`Plan` checks)
        raise UsageError(
            "the plan does not generate: it was not planned with --slo-ttft/--slo-tpot.",
            "plan a decoder with --slo-ttft and --slo-tpot, or simulate it as a batch plan.",
        )
    if arrivals.generated is None:
        raise UsageError(
            f"the traffic {arrivals.source.get('spec', '')!r} does not say how many tokens each "
            "request generates, which a generating plan needs.",
            "give the CSV a GeneratedTokens column (as the Azure trace has), or pass azure-conv, "
            "poisson:RATE or diurnal:PEAK,TROUGH (they draw it from the Azure trace).",
        )
    context = arrivals.tokens.astype(np.int64)
    generated = arrivals.generated.astype(np.int64)
    steps = generated - 1
    model = workflow_model(plan, int(context.max()) if context.size else 1)
    cal, where = traffic_calibration(plan, calibration)
    platform = platform_for(
        cal, model.functions, plan.arch, static_bytes=remote_table_bytes(plan), idle_s=idle_s
    )
    tpot, step_usd, _ = plan_decode(plan, manifest_of_plan(plan))
    ttft_warm = model.at(model.latency_s, context)
    refused, limit = _refusals(plan, model, context, generated, ttft_warm + steps * tpot)
    idx = np.flatnonzero(~np.any(np.stack(list(refused.values())), axis=0))
    delay, failed, stage_delay, cold_b, cold_p, peak = _pools(
        model, platform, arrivals, idx, context[idx], steps[idx] * tpot, reserve=reserve
    )
    timed_out = ~failed & (ttft_warm[idx] + delay + steps[idx] * tpot > limit)
    done = idx[~failed & ~timed_out]
    ttft = np.full(context.size, np.inf)
    ttft[done] = ttft_warm[done] + delay[~failed & ~timed_out]
    e2e = ttft + np.where(np.isfinite(ttft), steps * tpot, 0.0)
    tpot_each = np.full(context.size, np.nan)
    tpot_each[done[steps[done] > 0]] = tpot
    fns, rate = model.functions, platform.gb_second_usd
    gb = fns.memory_mb / platform.billing_mb_per_gb
    tokens = context[idx]
    bill = {
        f"prefill_{name}": float(model.at(model.bill_usd[name], tokens).sum())
        for name in BILL_ITEMS
    }
    bill["decode_usd"] = float(steps[idx].sum()) * step_usd
    billed_init_s = platform.cold_s()[1]
    init_gb_s = ((cold_b + cold_p) * billed_init_s * gb).sum() if platform.init_billed else 0.0
    bill["init_usd"] = float(init_gb_s * rate)
    bill["cold_wait_usd"] = float(
        _waiting_gb_s(model, stage_delay, gb) * rate + model.express_usd_per_s * delay.sum()
    )
    bill["total_usd"] = sum(bill.values())
    input_tokens, output_tokens = int(context[done].sum()), int(generated[done].sum())
    input_usd = bill["total_usd"] - bill["decode_usd"]
    bill["per_million_input_usd"] = input_usd / input_tokens * 1e6 if input_tokens else 0.0
    bill["per_million_output_usd"] = (
        bill["decode_usd"] / output_tokens * 1e6 if output_tokens else 0.0
    )
    failures = {}
    for name, mask in (("throttled", failed), ("timed_out", timed_out)):
        failures[name] = np.zeros(context.size, dtype=bool)
        failures[name][idx[mask]] = True
    return GenerationTraffic(
        ttft_s=ttft,
        tpot_s=tpot_each,
        e2e_s=e2e,
        refused=refused,
        failed=failures,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        bill_usd=bill,
        cold_starts={n: int(cold_b[f] + cold_p[f]) for f, n in enumerate(fns.names)},
        peak_environments={n: int(peak[f]) for f, n in enumerate(fns.names)},
        time_limit_s=limit,
        period_s=arrivals.period_s,
        idle_s=platform.idle_s,
        parameters_from=where,
        wall_s=time.perf_counter() - started,
    )


def _pools(
    model: WorkflowModel,
    platform: Platform,
    arrivals: Arrivals,
    idx: np.ndarray,
    context: np.ndarray,
    decode_s: np.ndarray,
    *,
    reserve: bool,
) -> tuple[np.ndarray, ...]:
    """`run_pools` over the served requests, one grid row each: the prefill's starts and
    billed seconds at its context, the driver's extended by its decode steps."""
    fns = model.functions
    n = idx.size
    offset = np.zeros((n + 1, fns.count))
    duration = np.zeros((n + 1, fns.count))
    offset[:n] = model.at(model.offset_s, context)
    duration[:n] = model.at(model.duration_s, context)
    duration[:n, fns.role.index("driver")] += decode_s
    provisioned, interval, pings, reserved, _ = _capacity_arrays(None, fns.reserved)
    if not reserve:
        reserved = np.zeros_like(reserved)
    wait_s, _ = platform.cold_s()
    delay, failed, stage_delay, cold_b, cold_p, _, _, peak, _ = run_pools(
        np.ascontiguousarray(arrivals.times_s[idx], dtype=np.float64),
        np.arange(n, dtype=np.int64),
        np.zeros(n),
        context.astype(np.int64),
        fns.stage,
        offset,
        duration,
        model.replicas,
        wait_s,
        provisioned,
        reserved,
        np.asarray(retry_waits(), dtype=float),
        platform.idle_s,
        interval,
        pings,
        platform.ping_s,
        arrivals.period_s,
    )
    return delay, failed, stage_delay, cold_b, cold_p, peak


def generation_report(
    plan: Plan,
    arrivals: Arrivals,
    *,
    slo_s: float | None = None,
    idle_s: float | None = None,
    calibration: Calibration | None = None,
    reserve: bool = True,
) -> dict[str, Any]:
    """`simulate_generation` of `plan` over `arrivals`, reported: what `moelambda traffic
    --json` prints for a generating plan (`planner.traffic.simulate_plan` calls it).

    Args:
        plan: A generating plan.
        arrivals: The stream, with the tokens each request generates.
        slo_s: End-to-end SLO per request for the attainment. Defaults to None: none.
        idle_s: Idle seconds before reclaim. Defaults to None: the calibration's assumption.
        calibration: Where traffic parameters the plan lacks come from (default: packaged).
        reserve: Whether the stack reserves each expert function's `max_replicas`.
    """
    result = simulate_generation(plan, arrivals, calibration, idle_s=idle_s, reserve=reserve)
    assert plan.generation is not None and arrivals.generated is not None
    return {
        "plan": plan.solver,
        "traffic": arrivals.describe() | {"generated_tokens": int(arrivals.generated.sum())},
        "planned_for": plan.generation.model_dump(),
        **result.summary(slo_s),
        "reserved_concurrency": reserve,
    }
