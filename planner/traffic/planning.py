"""Planning for a request stream: batch policy, MoE deployment and capacity, under a p99 SLO.

`plan_for_traffic` searches, for the stream it is given:
1. the front door's batch policy: the most tokens per batch from `CAPS` and the longest wait
   from `WAITS` (only waits below the SLO);
2. for each, the MoE deployment of a batch of that many tokens with the batch SLO left after
   the wait (SLO - wait), made by the same planner as `moelambda plan` (`planner.deploy`);
   consecutive waits reuse the plan while its latency fits (a plan optimal at a looser SLO is
   optimal at any tighter one it still meets);
3. for each, a capacity policy: none, a warmer every interval of `WARMER_INTERVALS_S` (at most
   the low end of the idle-time range, so a warmed environment survives whichever idle time in
   that range holds), provisioned concurrency, or Lambda Managed Instances for every function
   of the stack (one capacity provider per stack: `planner.traffic.managed` prices it), each
   function's concurrency (or managed environments, at least one) set to a quantile
   (`LEVELS`) of the environments it had in use at its invocations in the simulation without a
   policy;
and simulates every combination over the whole stream (`simulate`), keeping the cheapest bill
of the period whose p99 latency meets the SLO with no refused batch, both at the assumed idle
time and at the low end of its range (`idle_reclaim_s.low_s`: the idle time is an assumption,
and a plan that only holds if environments live 10 minutes is fragile); the bill is the one
at the assumed idle time (managed environments are never reclaimed, so for them the second
simulation only confirms the first). SnapStart is not a candidate (the calibration file says
why).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ground.driver import remote_table_bytes
from ground.errors import InfeasibleError
from ground.managed import environment_memory_mb
from ground.plan import FunctionCapacity, Plan, TrafficPlan
from ground.topology import topology
from planner.calibration import Calibration
from planner.traffic.platform import platform_for
from planner.traffic.simulate import BatchPolicy, Capacity, Platform, TrafficResult, simulate
from planner.traffic.spec import Arrivals
from planner.traffic.workflow import WorkflowModel, workflow_model

__all__ = [
    "CAPS",
    "LEVELS",
    "WAITS",
    "WARMER_INTERVALS_S",
    "TrafficChoice",
    "capacity_candidates",
    "fastest_latency",
    "moe_plan_at",
    "plan_for_traffic",
    "steady_state_plan",
]

CAPS = (512, 1024, 2048, 4096, 8192, 16384)
# Whole seconds: the front door deploys its wait as the event source mapping's batching window,
# which takes whole seconds (`ground.frontdoor.deployed_window_s`); a shorter wait would be
# planned as one thing and run as another.
WAITS = (0.0, 1.0, 2.0, 5.0)
LEVELS = (0.5, 0.9, 0.99, 1.0)
WARMER_INTERVALS_S = (120.0, 300.0)  # whole minutes: EventBridge Scheduler's rate

PlanAt = Callable[[int, float], Plan]  # (tokens per batch, batch SLO) -> the MoE plan


@dataclass(frozen=True, eq=False)
class TrafficChoice:
    """The chosen plan (with its traffic block), its simulation, and every candidate tried."""

    plan: Plan
    result: TrafficResult
    candidates: list[dict[str, Any]]
    seconds: float


def _levels(hist: np.ndarray, level: float) -> np.ndarray:
    """Per function, the fewest environments that covered `level` of its invocations."""
    counts = hist.sum(axis=1)
    cdf = np.cumsum(hist, axis=1) / np.maximum(counts, 1)[:, None]
    k = (cdf < level - 1e-12).sum(axis=1)
    return np.where(counts > 0, np.maximum(k, 1), 0)


def capacity_candidates(
    base: TrafficResult,
    platform: Platform,
    *,
    intervals: tuple[float, ...],
    memory_mb: np.ndarray | None = None,
) -> list[tuple[str, list[Capacity]]]:
    """Capacity policies to try, from the environments each function used without one.

    Managed candidates need Lambda Managed Instances' prices and `memory_mb` (F,), each
    function's planned memory, to know an instance type holds its environments.
    """
    out: list[tuple[str, list[Capacity]]] = []
    seen: set[tuple[Any, ...]] = set()

    def add(label: str, policies: list[Capacity]) -> None:
        key = tuple(
            (c.kind, c.provisioned, c.warmer_interval_s, c.warmer_concurrency, c.environments)
            for c in policies
        )
        if key not in seen and any(c.kind != "none" for c in policies):
            seen.add(key)
            out.append((label, policies))

    for level in LEVELS:
        k = _levels(base.environments_in_use, level)
        for interval in intervals:
            add(
                f"warmer every {interval:g} s, p{level * 100:g} environments",
                [Capacity("warmer", 0, interval, int(n)) if n else Capacity() for n in k],
            )
        if platform.provisioned_allocated_usd is not None:
            add(
                f"provisioned, p{level * 100:g} environments",
                [Capacity("provisioned", int(n)) if n else Capacity() for n in k],
            )
        managed = np.maximum(k, 1)
        if (
            platform.managed is not None
            and memory_mb is not None
            and platform.managed.choose(memory_mb, managed) is not None
        ):
            add(
                f"managed, p{level * 100:g} environments",
                [Capacity("managed", environments=int(n)) for n in managed],
            )
    return out


def _row(
    max_tokens: int, wait: float, label: str, result: TrafficResult, slo: float
) -> dict[str, Any]:
    q = result.quantiles()
    meets = result.refused_batches == 0 and q["p99"] is not None and q["p99"] <= slo
    return {
        "max_batch_tokens": max_tokens,
        "max_wait_s": wait,
        "capacity": label,
        "p99_s": q["p99"],
        "attainment": result.attainment(slo),
        "cold_starts": int(sum(result.cold_starts.values())),
        "total_usd": result.bill_usd["total_usd"],
        "per_million_tokens_usd": result.bill_usd["per_million_tokens_usd"],
        "refused_batches": result.refused_batches,
        "meets_slo": meets,
    }


def _signature(plan: Plan) -> tuple[Any, ...]:
    driver = (
        None
        if plan.driver is None
        else (plan.nonmoe_memory_mb, tuple(tuple(x) for x in plan.driver.local))
    )
    return (
        (plan.deployment, driver)
        + tuple(
            (
                layer.method,
                layer.beta,
                tuple((e.memory_mb, e.replicas, tuple(e.hosted)) for e in layer.experts),
            )
            for layer in plan.layers
        )
        + (plan.totals.tokens, plan.workflow)
    )


def plan_for_traffic(
    plan_at: PlanAt,
    arrivals: Arrivals,
    slo_p99_s: float,
    calibration: Calibration,
    arch: str,
    *,
    idle_s: float | None = None,
    caps: tuple[int, ...] = CAPS,
    waits: tuple[float, ...] = WAITS,
    progress: Callable[[str], None] | None = None,
) -> TrafficChoice:
    """The cheapest batch policy, MoE plan and capacity meeting `slo_p99_s` on `arrivals`.

    Args:
        plan_at: Makes the MoE plan of a batch of n tokens under a batch SLO (`moe_plan_at`).
        arrivals: The stream to plan for; every candidate is simulated over all of it.
        slo_p99_s: The per-request p99 latency to meet, seconds.
        calibration: With every traffic parameter (`platform.traffic_calibration`).
        arch: Lambda architecture of the plans.
        idle_s: Idle seconds before reclaim. Default: the calibration's assumption.
        caps, waits: Batch policies to try.

    Raises:
        InfeasibleError: No candidate meets the SLO; names the best p99 found and its policy.
    """
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    idle = calibration.idle_reclaim_s
    assert idle is not None
    intervals = tuple(i for i in WARMER_INTERVALS_S if i <= idle.low_s) or (60.0,)
    # The idle time is an assumption: a choice must also meet the SLO if environments are
    # reclaimed at the low end of the measured range (unless the caller fixed the idle time).
    robust = idle.low_s if idle_s is None and idle.low_s < idle.assumed_s else None
    largest = int(arrivals.tokens.max()) if arrivals.requests else 1
    models: dict[tuple[Any, ...], tuple[WorkflowModel, Platform]] = {}
    rows: list[dict[str, Any]] = []
    best: tuple[float, Plan, BatchPolicy, list[Capacity] | None, TrafficResult, str] | None = None
    closest: dict[str, Any] | None = None
    for cap in caps:
        plan: Plan | None = None
        for wait in sorted(w for w in waits if w < slo_p99_s):
            budget = slo_p99_s - wait
            if plan is None or plan.totals.latency_s > budget:
                say(f"planning batches of {cap:,} tokens within {budget:.3f} s")
                try:
                    plan = plan_at(cap, budget)
                except InfeasibleError:
                    break  # longer waits leave even less time
            key = _signature(plan)
            if key not in models:
                model = workflow_model(plan, max(cap, largest))
                models[key] = (
                    model,
                    platform_for(
                        calibration,
                        model.functions,
                        arch,
                        static_bytes=remote_table_bytes(plan),
                        idle_s=idle_s,
                    ),
                )
            model, platform = models[key]
            policy = BatchPolicy(cap, wait)
            say(f"simulating {cap:,} tokens, wait {wait:g} s: no capacity policy")
            base = simulate(model, arrivals, policy, platform)
            tried = [("none", None, base)]
            for label, capacity in capacity_candidates(
                base, platform, intervals=intervals, memory_mb=model.functions.memory_mb
            ):
                say(f"simulating {cap:,} tokens, wait {wait:g} s: {label}")
                tried.append(
                    (label, capacity, simulate(model, arrivals, policy, platform, capacity))
                )
            for label, capacity, result in tried:
                row = _row(cap, wait, label, result, slo_p99_s)
                rows.append(row)
                if row["meets_slo"] and (best is None or row["total_usd"] < best[0]):
                    if robust is not None:  # it must hold at the low end of the idle range too
                        low = replace(platform, idle_s=robust)
                        say(
                            f"simulating {cap:,} tokens, wait {wait:g} s: {label}, "
                            f"idle {robust:g} s"
                        )
                        stressed = _row(
                            cap, wait, label, simulate(model, arrivals, policy, low, capacity),
                            slo_p99_s,
                        )  # fmt: skip
                        row["p99_at_low_idle_s"] = stressed["p99_s"]
                        row["meets_slo"] = stressed["meets_slo"]
                    if row["meets_slo"]:
                        best = (row["total_usd"], plan, policy, capacity, result, label)
                p99 = row["p99_s"]
                if p99 is not None and row.get("p99_at_low_idle_s") is not None:
                    p99 = max(p99, row["p99_at_low_idle_s"])  # the p99 that bound it
                    row["binding_p99_s"] = p99
                if (
                    p99 is not None
                    and row["refused_batches"] == 0
                    and (closest is None or p99 < closest["binding_p99_s"])
                ):
                    closest = row | {"binding_p99_s": p99}
    if best is None:
        if closest is None:
            raise InfeasibleError(
                f"no batch size from {caps[0]:,} to {caps[-1]:,} tokens has an MoE plan within "
                f"the p99 SLO of {slo_p99_s:g} s.",
                "raise --slo-p99, or plan smaller batches.",
            )
        raise InfeasibleError(
            f"no batch, MoE and capacity policy meets the p99 SLO of {slo_p99_s:g} s on this "
            f"traffic: the best p99 is {closest['binding_p99_s']:.3f} s (batches of "
            f"{closest['max_batch_tokens']:,} tokens, wait {closest['max_wait_s']:g} s, "
            f"capacity: {closest['capacity']}).",
            f"pass --slo-p99 {math.ceil(closest['binding_p99_s'] * 1000) / 1000:.3f} or more "
            "(the p99 counts the low end of the idle-time range too).",
        )
    _, plan, policy, capacity, result, label = best
    model = models[_signature(plan)][0]
    platform = models[_signature(plan)][1]
    chosen = Plan.model_validate(
        plan.model_dump()
        | {
            "traffic": TrafficPlan(
                traffic=arrivals.describe(),
                slo_p99_s=slo_p99_s,
                max_batch_tokens=policy.max_tokens,
                max_wait_s=policy.max_wait_s,
                idle_reclaim_s=platform.idle_s,
                capacity=_function_capacity(model, capacity, platform),
                simulated=result.summary(slo_p99_s) | {"capacity": label},
                managed_instance_type=result.managed.get("instance_type"),
                managed_instances=result.managed.get("instances", 0),
            ).model_dump()
        }
    )
    return TrafficChoice(chosen, result, rows, time.perf_counter() - started)


def _function_capacity(
    model: WorkflowModel, capacity: list[Capacity] | None, platform: Platform
) -> list[FunctionCapacity]:
    policies = capacity or [Capacity()] * model.functions.count
    managed = platform.managed
    return [
        FunctionCapacity(
            function=name,
            policy=c.kind,  # type: ignore[arg-type]
            provisioned_concurrency=c.provisioned if c.kind == "provisioned" else 0,
            warmer_interval_s=c.warmer_interval_s if c.kind == "warmer" else None,
            warmer_concurrency=c.warmer_concurrency if c.kind == "warmer" else 0,
            managed_environments=c.environments if c.kind == "managed" else 0,
            managed_memory_mb=environment_memory_mb(float(mb), managed.mb_per_vcpu)
            if c.kind == "managed" and managed is not None
            else None,
        )
        for name, c, mb in zip(
            model.functions.names, policies, model.functions.memory_mb, strict=True
        )
    ]


def moe_plan_at(
    manifest: Any,
    counts: np.ndarray,
    counts_tokens: int,
    calibration: Calibration,
    *,
    arch: str = "x86_64",
    workflow: str | None = None,
    objective: str = "full",
    solver: str = "exact",
    methods: tuple[Any, ...] | None = None,
    pack: str = "auto",
    dist: Any = None,
    confidence: float = 0.0,
    counts_source: dict[str, Any] | None = None,
    deployment: str = "workflow",
) -> PlanAt:
    """What `moelambda plan` does for one batch size and SLO, as a function of the two: the
    predicted counts (of a batch of `counts_tokens`) scaled to the batch, planned by
    `planner.deploy.plan_packed` (packing, workflow type, confidence) and written as a Plan;
    a `deployment` of "monolithic" or "driver" plans that shape instead
    (`planner.deployments.plan_driver_shape`, on the predicted counts)."""
    from planner.build import instance_for, make_plan
    from planner.deploy import pack_sizes, plan_packed
    from planner.instance import Method

    chosen_methods = tuple(Method) if methods is None else methods

    def plan_at(tokens: int, slo_s: float) -> Plan:
        scaled = np.asarray(counts, dtype=float) * tokens / counts_tokens
        source = dict(counts_source or {}) | {"scaled_to_tokens": tokens}
        if topology(deployment).driven:
            from planner.deployments import plan_driver_shape

            base = instance_for(
                manifest,
                scaled,
                calibration,
                tokens=tokens,
                arch=arch,
                workflow=workflow or "express",
            )
            return plan_driver_shape(
                deployment,
                base,
                manifest,
                calibration,
                slo_s,
                source,
                choose_workflow=workflow is None,
            )[0]
        inst = instance_for(
            manifest,
            scaled,
            calibration,
            tokens=tokens,
            arch=arch,
            workflow=workflow or "express",
            objective=objective,
        )
        inst, confident, solution, _, _ = plan_packed(
            inst,
            pack_sizes(pack, inst.experts),
            None if dist is None else dist.scaled(tokens),
            confidence,
            slo_s,
            solver,
            chosen_methods,
            False,
            workflow is None,
            calibration,
        )
        if inst.workflow == "express" and solution.latency > calibration.express_max_duration_s:
            raise InfeasibleError(
                f"batches of {tokens:,} tokens take {solution.latency:.1f} s, over an Express "
                "workflow's limit.",
                "plan smaller batches or a Standard workflow.",
            )
        if confident is not None:
            source["confidence"] = confident.describe()
        return make_plan(inst, solution, manifest, calibration, slo_s=slo_s, counts_source=source)

    return plan_at


def steady_state_plan(
    plan_at: PlanAt, fastest_s: Callable[[int], float], slo_s: float, tokens: int = 10240
) -> Plan:
    """Today's plan for a per-request SLO: `moelambda plan` of a batch of `tokens` with the SLO
    as its batch SLO, or, where no plan of that batch meets it, with the smallest batch SLO
    that one does, as a user following the planner's advice would: the fastest point plan's
    latency (`fastest_s(tokens)`), relaxed by 2% steps while a confidence level still finds
    it infeasible (up to twice it)."""
    try:
        return plan_at(tokens, slo_s)
    except InfeasibleError as error:
        fastest = fastest_s(tokens) * (1 + 1e-6)
        for factor in (1.0, *np.geomspace(1.02, 2.0, 36)):
            try:
                return plan_at(tokens, fastest * factor)
            except InfeasibleError:
                continue
        raise error


def fastest_latency(
    manifest: Any, counts: np.ndarray, counts_tokens: int, cal: Calibration
) -> Callable[[int], float]:
    """`fastest_s` for `steady_state_plan`: the smallest latency of a batch of n tokens with
    one expert per function (a plan at that SLO exists; packing may only be cheaper)."""
    from planner.build import instance_for
    from planner.exact import solve_frontier

    def fastest_s(tokens: int) -> float:
        scaled = np.asarray(counts, dtype=float) * tokens / counts_tokens
        return solve_frontier(instance_for(manifest, scaled, cal, tokens=tokens)).min_latency()

    return fastest_s
