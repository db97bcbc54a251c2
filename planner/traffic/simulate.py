"""The deployment over a request stream: a discrete-event simulation of batches and environments.

1. The front door batches requests (`BatchPolicy`: at most `max_tokens` per batch, at most
   `max_wait_s` after a batch opens; `_kernels.batch_requests` states the exact rule).
2. Each batch is one workflow execution. Its warm latency, its bill by item, and each function's
   start and billed seconds are the plan's cost model at the batch's size (`workflow.py`).
3. Each function has a pool of execution environments (`ground.coldstart`: one invocation at
   a time, most recently used first, reclaimed after the idle time, provisioned ones always
   there, warmers' pings like any invocation). An invocation that finds no idle environment
   starts one and waits its INIT; the batch's later stages wait for the slowest function of
   each stage (`_kernels.run_pools`).
4. A request's latency is its wait in the batcher plus its batch's warm latency plus the cold
   and throttling delays of its batch. A batch larger than the plan can serve (an expert's
   real tokens need more replicas than its cap) is refused, one throttled past the state
   machine's last retry fails; their requests count as missing every SLO.
5. The bill of the period: the batches' bills (cost model), INIT billed at the functions' rate,
   what cold starts make others wait (a direct gate billed while its experts start; a pipelined
   replica billed while its gate starts; an Express execution's longer duration), provisioned
   concurrency (its allocation, less the lower duration rate of the invocations it serves), and
   warmers (a request, a warm start's duration and a scheduler invocation per ping).

Approximations, each named where it is made: the workflow's timings are the cost model's and
interpolated between grid sizes; a stage's functions start cold independently; a direct gate's
environment is held for its warm duration only; a pipelined layer's replicas are sequenced after
their gate's cold start (they start with it, so this overstates a cold gate's delay when the
replicas are cold too); a throttled invocation's retries wait their mean jittered time; the
bill counts a failed execution whole; the front door's own cost (the SQS batching function) is
not modelled. An expert function's reserved concurrency (its `max_replicas`, as the stack
reserves it) throttles invocations beyond it (`ground.coldstart`); the summary names the
functions that reached their reservation (`reserved_concurrency_reached`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ground.coldstart import init_phase, retry_waits
from planner.traffic._kernels import batch_requests, run_pools
from planner.traffic.spec import Arrivals
from planner.traffic.workflow import BILL_ITEMS, WorkflowModel

__all__ = [
    "BatchPolicy",
    "Capacity",
    "Platform",
    "TrafficResult",
    "batches_of",
    "simulate",
]


@dataclass(frozen=True)
class BatchPolicy:
    """How the front door turns requests into executions."""

    max_tokens: int
    max_wait_s: float


@dataclass(frozen=True)
class Capacity:
    """One function's capacity policy: none, a warmer, or provisioned concurrency.

    A warmer pings `warmer_concurrency` environments every `warmer_interval_s`; provisioned
    concurrency keeps `provisioned` environments initialised for the whole period. `reserved`
    replaces the stack's reserved concurrency of the function (None: the plan's).
    """

    kind: str = "none"
    provisioned: int = 0
    warmer_interval_s: float = 0.0
    warmer_concurrency: int = 0
    reserved: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("none", "warmer", "provisioned"):
            raise ValueError(f"unknown capacity policy {self.kind!r}")


@dataclass(frozen=True)
class Platform:
    """The platform facts a simulation needs beyond the plan: INIT per function and prices.

    `init_s` (F,) is each function's INIT (`ground.coldstart.InitModel`), `idle_s` the assumed
    idle time before reclaim; prices are USD per GB-second or per call.
    """

    init_s: np.ndarray  # (F,) the INIT phase, under the limit
    init_limit_s: float
    init_billed: bool
    idle_s: float
    gb_second_usd: float
    request_usd: float
    ping_s: float
    scheduler_invocation_usd: float
    billing_mb_per_gb: float
    provisioned_allocated_usd: float | None = None  # per GB-second; None: not sourced
    provisioned_duration_usd: float | None = None
    load_s: np.ndarray | None = None  # (F,) the first call's weight load (None: 0)

    def cold_s(self) -> tuple[np.ndarray, np.ndarray]:
        """(seconds a new environment delays its first invocation, seconds it bills): the
        INIT phase under its limit (`ground.coldstart.init_phase`) plus the first load."""
        phase = np.array([init_phase(float(s), self.init_limit_s) for s in self.init_s])
        load = np.zeros(self.init_s.size) if self.load_s is None else self.load_s
        return phase[:, 0] + load, phase[:, 1] + load


@dataclass(frozen=True, eq=False)
class TrafficResult:
    """What a simulated period gives: per request, per function and the bill."""

    latency_s: np.ndarray  # (requests,) inf where the batch was refused
    batch_of: np.ndarray  # (requests,) batch index
    batch_tokens: np.ndarray  # (batches,)
    cold_starts: dict[str, int]  # per function: batches' and pings' cold starts
    peak_environments: dict[str, int]
    environments_in_use: np.ndarray  # (F, 256) histogram at the functions' invocations
    bill_usd: dict[str, float]
    refused_batches: int
    failed_batches: int  # still throttled after the state machine's last retry
    over_reserved: dict[str, dict[str, int]]  # function -> peak environments and reservation
    tokens: int
    period_s: float
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def quantiles(self) -> dict[str, float | None]:
        """p50, p95, p99, max of request latency (None where refused requests make it
        unbounded), as observed values (the empirical quantile)."""
        if self.latency_s.size == 0:
            return {"p50": None, "p95": None, "p99": None, "max": None}
        qs = np.quantile(self.latency_s, [0.5, 0.95, 0.99, 1.0], method="inverted_cdf")
        return {
            k: (float(v) if np.isfinite(v) else None)
            for k, v in zip(("p50", "p95", "p99", "max"), qs, strict=True)
        }

    def attainment(self, slo_s: float | None) -> float | None:
        """Share of requests served within `slo_s` (None without an SLO)."""
        if slo_s is None or self.latency_s.size == 0:
            return None
        return float(np.mean(self.latency_s <= slo_s))

    def summary(self, slo_s: float | None) -> dict[str, Any]:
        """The JSON object `moelambda traffic --json` prints."""
        cold = {name: n for name, n in self.cold_starts.items() if n}
        return {
            "requests": int(self.latency_s.size),
            "batches": int(self.batch_tokens.size),
            "refused_batches": self.refused_batches,
            "failed_batches": self.failed_batches,
            "tokens": self.tokens,
            "period_s": self.period_s,
            "latency_s": self.quantiles(),
            "slo_s": slo_s,
            "slo_attainment": self.attainment(slo_s),
            "cold_starts": {"count": int(sum(self.cold_starts.values())), "per_function": cold},
            "peak_environments": self.peak_environments,
            "reserved_concurrency_reached": self.over_reserved,
            "bill_usd": self.bill_usd,
            "wall_s": round(self.wall_s, 3),
            "notes": self.notes,
        }


def batches_of(arrivals: Arrivals, policy: BatchPolicy) -> tuple[np.ndarray, ...]:
    """(first request of each batch plus the end, dispatch seconds, tokens) of `arrivals`."""
    return batch_requests(
        np.ascontiguousarray(arrivals.times_s, dtype=np.float64),
        np.ascontiguousarray(arrivals.tokens, dtype=np.int64),
        int(policy.max_tokens),
        float(policy.max_wait_s),
    )


def _capacity_arrays(
    capacity: list[Capacity] | None, reserved: np.ndarray
) -> tuple[np.ndarray, ...]:
    count = reserved.size
    policies = capacity or [Capacity()] * count
    if len(policies) != count:
        raise ValueError(f"{len(policies)} capacity policies for {count} functions")
    provisioned = np.array([c.provisioned if c.kind == "provisioned" else 0 for c in policies])
    interval = np.array([c.warmer_interval_s if c.kind == "warmer" else 0.0 for c in policies])
    pings = np.array([c.warmer_concurrency if c.kind == "warmer" else 0 for c in policies])
    limit = np.array(
        [r if c.reserved is None else c.reserved for c, r in zip(policies, reserved, strict=True)]
    )
    return (
        provisioned.astype(np.int64),
        interval.astype(float),
        pings.astype(np.int64),
        limit.astype(np.int64),
    )


def simulate(
    model: WorkflowModel,
    arrivals: Arrivals,
    policy: BatchPolicy,
    platform: Platform,
    capacity: list[Capacity] | None = None,
    *,
    reserve: bool = True,
) -> TrafficResult:
    """Replay `arrivals` through the deployment `model` describes (see the module docstring).

    Args:
        model: The plan's workflow over batch sizes (`workflow.workflow_model`).
        arrivals: The request stream.
        policy: The front door's batching.
        platform: INIT per function, the idle time and prices.
        capacity: One policy per function (`model.functions` order). Defaults to None: none.
        reserve: Whether the stack reserves concurrency (each expert function's
            `max_replicas`, or its capacity's `reserved`), which throttles invocations beyond
            it. Defaults to True, as `moelambda synth` emits the stack; False is
            `--no-reserve-concurrency`.
    """
    started = time.perf_counter()
    fns = model.functions
    provisioned, interval, ping_count, reserved = _capacity_arrays(capacity, fns.reserved)
    if not reserve:
        reserved = np.zeros_like(reserved)
    if provisioned.any() and platform.provisioned_allocated_usd is None:
        raise ValueError("provisioned concurrency without its prices")
    first, dispatch, size = batches_of(arrivals, policy)
    batch_of = np.repeat(np.arange(size.size), np.diff(first))
    served = size <= model.feasible_tokens
    wait_s, billed_init_s = platform.cold_s()
    tokens = size[served]
    grid_i, grid_w = model.interpolate(tokens)
    delay_served, failed, stage_delay, cold_b, cold_p, pings, pc_seconds, peak, hist = run_pools(
        dispatch[served],
        grid_i,
        grid_w,
        tokens.astype(np.int64),
        fns.stage,
        model.offset_s,
        model.duration_s,
        model.replicas,
        wait_s,
        provisioned,
        reserved,
        np.asarray(retry_waits(), dtype=float),
        platform.idle_s,
        interval,
        ping_count,
        platform.ping_s,
        arrivals.period_s,
    )
    warm = model.at(model.latency_s, tokens)
    finish = np.full(size.size, np.inf)
    finish[served] = np.where(failed, np.inf, dispatch[served] + warm + delay_served)
    latency = finish[batch_of] - arrivals.times_s
    gb = fns.memory_mb / platform.billing_mb_per_gb
    rate = platform.gb_second_usd
    bill = {name: float(model.at(model.bill_usd[name], tokens).sum()) for name in BILL_ITEMS}
    init_gb_s = ((cold_b + cold_p) * billed_init_s * gb).sum() if platform.init_billed else 0.0
    bill["init_usd"] = float(init_gb_s * rate)
    bill["cold_wait_usd"] = float(
        _waiting_gb_s(model, stage_delay, gb) * rate
        + model.express_usd_per_s * float(delay_served.sum())
    )
    period = arrivals.period_s
    if platform.provisioned_allocated_usd is not None:
        assert platform.provisioned_duration_usd is not None
        allocated = float((provisioned * gb).sum() * period * platform.provisioned_allocated_usd)
        credit = float((pc_seconds * gb).sum() * (platform.provisioned_duration_usd - rate))
        bill["provisioned_usd"] = allocated + credit
    else:
        bill["provisioned_usd"] = 0.0
    bill["warmers_usd"] = float(
        (
            pings
            * (
                platform.request_usd
                + platform.ping_s * gb * rate
                + platform.scheduler_invocation_usd
            )
        ).sum()
    )
    bill["total_usd"] = sum(bill.values())
    total_tokens = arrivals.total_tokens
    bill["per_million_tokens_usd"] = (
        bill["total_usd"] / total_tokens * 1e6 if total_tokens else 0.0
    )
    names = fns.names
    notes = []
    if policy.max_wait_s > 0:
        notes.append(
            "the front door that holds requests for a batch (a queue and its batching "
            "function) is not in the bill: it is not part of the deployed stack yet"
        )
    return TrafficResult(
        latency_s=latency,
        batch_of=batch_of,
        batch_tokens=size,
        cold_starts={n: int(cold_b[f] + cold_p[f]) for f, n in enumerate(names)},
        peak_environments={n: int(peak[f]) for f, n in enumerate(names)},
        environments_in_use=hist,
        bill_usd=bill,
        refused_batches=int((~served).sum()),
        failed_batches=int(failed.sum()),
        over_reserved={
            n: {"peak": int(peak[f]), "reserved": int(reserved[f])}
            for f, n in enumerate(names)
            if reserved[f] and peak[f] >= reserved[f]
        },
        tokens=total_tokens,
        period_s=period,
        wall_s=time.perf_counter() - started,
        notes=notes,
    )


def _waiting_gb_s(model: WorkflowModel, stage_delay: np.ndarray, gb: np.ndarray) -> float:
    """GB-s billed while functions wait on others' cold starts: a direct gate on its experts'
    stage, a pipelined replica (all of its replicas) on its gate's stage."""
    fns = model.functions
    total = 0.0
    for f in np.flatnonzero(fns.waits_on_next_stage):
        total += stage_delay[fns.stage[f] + 1] * gb[f]
    for f in np.flatnonzero(fns.waits_on_previous_stage):
        total += stage_delay[fns.stage[f] - 1] * gb[f] * int(model.replicas[-1, f])
    return float(total)
