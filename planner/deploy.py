"""The cheapest deployment of one batch: what `moelambda plan` decides, as functions.

`plan_packed` plans an instance for each number of experts per function, with or without a
confidence level, picks the Step Functions workflow type the latency allows, and keeps the
cheapest; when nothing is feasible it raises an `InfeasibleError` that names the binding
constraint (latency and the smallest feasible SLO, a payload or memory limit, Lambda's timeout,
the Map's width). Every command that plans (plan, compare, choose) calls these, so they all make
the same plan from the same counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ground.errors import InfeasibleError, UsageError

__all__ = [
    "Progress",
    "infeasible",
    "pack_sizes",
    "plan_instance",
    "plan_packed",
    "solve",
    "why_empty",
]

Progress = Callable[[str], None]


def plan_instance(
    inst: Any,
    dist: Any,
    confidence: float,
    slo_s: float | None,
    solver: str,
    methods: tuple[Any, ...],
    whole: bool,
    choose_workflow: bool,
    cal: Any,
) -> tuple[Any, Any, Any, Any]:
    """(instance, confident plan or None, solution, curve): the plan `moelambda plan` makes."""
    confident = None
    if confidence > 0:
        inst, confident = _confident(inst, dist, confidence, slo_s, solver, methods)
    solution, frontier = solve(inst, solver, methods, slo_s, whole)
    if choose_workflow and solution.latency > cal.express_max_duration_s:
        # The request does not fit an Express execution: plan it as a Standard workflow.
        inst = dataclasses.replace(inst, workflow="standard")
        if confident is not None:
            inst, confident = _confident(inst, dist, confidence, slo_s, solver, methods)
        solution, frontier = solve(inst, solver, methods, slo_s, whole)
    return inst, confident, solution, frontier


def pack_sizes(pack: str, experts: int) -> list[int]:
    """Experts per function `--pack` asks for: every divisor of `experts` for auto."""
    from planner.packing import group_sizes

    sizes = group_sizes(experts)
    if pack == "auto":
        return sizes
    if not pack.isdigit() or int(pack) not in sizes:
        raise UsageError(
            f"--pack {pack!r} is not 'auto' or a number of experts per function that divides "
            f"the model's {experts} experts.",
            f"pass --pack auto, or one of {', '.join(map(str, sizes))} (1: one expert per "
            "function).",
        )
    return [int(pack)]


def plan_packed(
    inst: Any, sizes: list[int], *args: Any, progress: Progress | None = None
) -> tuple[Any, Any, Any, Any, list[dict[str, Any]]]:
    """`plan_instance` for each number of experts per function in `sizes` (groups balanced
    by predicted tokens), the cheapest kept; ties keep the fewer experts per function.

    Returns its result and, per size, the cost or why there was no plan. With no plan at any
    size, the first size's reason is raised.
    """
    from planner.packing import balanced_groups, pack

    best, tried, first_error = None, [], None
    for size in sizes:
        candidate = inst if size == 1 else pack(inst, balanced_groups(inst.counts, size))
        label = f"{size} expert{'s' if size > 1 else ''} per function"
        if progress is not None:
            progress(f"planning {label}")
        try:
            result = plan_instance(candidate, *args)
        except InfeasibleError as error:
            first_error = first_error or error
            tried.append({"experts_per_function": size, "cost_usd": None, "why": str(error)})
            continue
        cost = result[2].cost
        tried.append({"experts_per_function": size, "cost_usd": cost, "why": None})
        if best is None or cost < best[2].cost * (1 - 1e-12):
            best = result
    if best is None:
        assert first_error is not None
        raise first_error
    return (*best, tried)


def _confident(
    inst: Any,
    dist: Any,
    confidence: float,
    slo_s: float | None,
    solver: str,
    methods: tuple[Any, ...],
) -> tuple[Any, Any]:
    """The instance at the quantile counts the confident plan chose, and that plan."""
    from planner.confidence import plan_with_confidence, with_counts

    def solve_one(candidate: Any) -> Any:
        try:
            return solve(candidate, solver, methods, slo_s, False)[0]
        except InfeasibleError:
            return None

    confident = plan_with_confidence(
        dist, confidence, slo_s, lambda counts: with_counts(inst, counts), solve_one
    )
    return confident.inst, confident


def why_empty(inst: Any, methods: tuple[Any, ...]) -> InfeasibleError:
    """No option at all: name the payload limit if only direct was allowed, else memory."""
    from planner.instance import MB, Method

    wide = inst.experts > inst.map_max_concurrency  # a Map would queue: only direct fans out
    if wide and Method.DIRECT not in methods:
        return InfeasibleError(
            f"{inst.experts} experts per layer exceed an inline Map's "
            f"{inst.map_max_concurrency:g} concurrent iterations, so only direct fans out.",
            "allow --method direct (or leave --method out).",
        )
    if methods == (Method.DIRECT,) or wide:
        because = (
            f" ({inst.experts} experts per layer exceed an inline Map's "
            f"{inst.map_max_concurrency:g} concurrent iterations, so only direct fans out)"
            if wide and methods != (Method.DIRECT,)
            else ""
        )
        shard = math.ceil(float(inst.counts.max()) / inst.max_replicas)
        payload = shard * max(inst.token_bytes_in, inst.token_bytes_out)
        return InfeasibleError(
            f"direct transfer cannot carry this batch{because}: the busiest expert's shard of "
            f"{shard:,} tokens ({payload:,.0f} bytes, split over {inst.max_replicas} replicas) "
            f"exceeds the {inst.direct_payload_bytes:,}-byte payload limit.",
            "plan for fewer --tokens"
            + (
                "."
                if because
                else ", or drop --method direct (the S3 methods have no payload limit)."
            ),
        )
    timeout = _timeout_binds(inst, methods)
    if timeout is not None:
        return timeout
    need = inst.expert_bytes.max() / MB + inst.runtime_mb
    return InfeasibleError(
        f"no memory option holds the largest expert ({need:,.0f} MB with the runtime, before "
        f"tokens) with its tokens, even over {inst.max_replicas} replicas (largest option "
        f"{inst.memory_mb.max():,.0f} MB).",
        "add a larger memory option or raise max_replicas in the calibration file, or plan "
        "for fewer --tokens.",
    )


def _timeout_binds(inst: Any, methods: tuple[Any, ...]) -> InfeasibleError | None:
    """The error naming Lambda's timeout when it alone leaves some layer without a plan."""
    from planner.costmodel import option_grid

    relaxed = dataclasses.replace(inst, max_timeout_s=math.inf)

    def plannable(candidate: Any, layer: int) -> bool:
        for method in methods:
            betas = np.asarray(candidate.betas if method.label == "pipelined" else (1,))
            feasible = option_grid(candidate, layer, method, betas)[2]
            if feasible.any(axis=(2, 3)).all(axis=1).any():  # some beta serves every expert
                return True
        return False

    for layer in range(inst.layers):
        if plannable(relaxed, layer) and not plannable(inst, layer):
            busiest = int(np.argmax(inst.counts[layer]))
            return InfeasibleError(
                f"no plan of layer {layer} fits Lambda's {inst.max_timeout_s:g} s timeout: its "
                f"busiest expert ({inst.counts[layer, busiest]:,.0f} tokens) runs longer even "
                f"over {inst.max_replicas} replicas at every memory size.",
                "plan for fewer --tokens per batch, or raise max_replicas in the calibration "
                "file.",
            )
    return None


def infeasible(
    inst: Any, frontier: Any, slo_s: float | None, methods: tuple[Any, ...]
) -> InfeasibleError:
    """Name the binding constraint and the smallest SLO that can be met."""
    if not math.isfinite(frontier.min_latency()):
        return why_empty(inst, methods)
    fastest = frontier.min_latency()
    return InfeasibleError(
        f"no plan meets the SLO of {slo_s:.3f} s: the binding constraint is latency. The "
        f"fastest plan takes {fastest:.3f} s, of which {inst.fixed_s():.3f} s are the head, "
        "tail and non-MoE layer functions that no MoE decision changes.",
        f"pass --slo {math.ceil(fastest * 1000) / 1000:.3f} or more (or a --throughput of at "
        f"most {inst.tokens / fastest:,.0f} tokens/s), or plan for fewer --tokens.",
        smallest_slo_s=fastest,
    )


def solve(
    inst: Any, solver: str, methods: tuple[Any, ...], slo_s: float | None, whole: bool
) -> Any:
    """The solution and the curve: the whole curve when `whole` (for --pareto), else only the
    part that can hold the optimum at this SLO, which is much faster on large instances."""
    from planner.exact import solve_bounded, solve_frontier
    from planner.milp import solve_milp, solve_milp_mixed
    from planner.ods import solve_ods

    frontier = solve_frontier(inst, methods) if whole else solve_bounded(inst, slo_s, methods)
    if solver == "exact":
        solution = frontier.best(slo_s)
    elif solver == "milp":
        solution = (
            solve_milp(inst, methods[0], slo_s)
            if len(methods) == 1
            else solve_milp_mixed(inst, slo_s)
        )
    else:
        solution = (
            solve_milp(inst, methods[0], slo_s) if len(methods) == 1 else solve_ods(inst, slo_s)
        )
    if solution is None:
        raise infeasible(inst, frontier, slo_s, methods)
    return solution, frontier
