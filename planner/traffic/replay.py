"""A plan over a request stream: its policies, and one call that simulates it and reports.

A plan made with `--traffic` carries its batch policy and a capacity policy per function, and
is deployed behind the batching front door (`ground.frontdoor`); any other plan is served as
today's steady-state plan is deployed: no front door, one execution per arriving request
(requests arriving at the same instant share one, up to the plan's batch), no capacity policy.
A generating plan (`Plan.generation`) serves each request in its own driver invocation, a
prefill and its decode steps (`planner.traffic.generation`). `simulate_plan` is what
`moelambda traffic` prints.
"""

from __future__ import annotations

import time
from typing import Any

from ground.driver import remote_table_bytes
from ground.errors import CalibrationError, UsageError
from ground.plan import Plan
from planner.calibration import Calibration
from planner.traffic.platform import platform_for, traffic_calibration
from planner.traffic.simulate import BatchPolicy, Capacity, simulate
from planner.traffic.spec import Arrivals
from planner.traffic.workflow import workflow_model

__all__ = ["capacity_of", "policies_of", "simulate_plan"]


def capacity_of(plan: Plan) -> list[Capacity] | None:
    """The plan's capacity policy per function (None: none anywhere)."""
    if plan.traffic is None:
        return None
    return [
        Capacity(
            kind=c.policy,
            provisioned=c.provisioned_concurrency,
            warmer_interval_s=c.warmer_interval_s or 0.0,
            warmer_concurrency=c.warmer_concurrency,
            environments=c.managed_environments,
        )
        for c in plan.traffic.capacity
    ]


def policies_of(plan: Plan) -> tuple[BatchPolicy, list[Capacity] | None, float | None]:
    """(batch policy, capacity per function, per-request SLO) a plan is served with."""
    if plan.traffic is not None:
        t = plan.traffic
        return BatchPolicy(t.max_batch_tokens, t.max_wait_s), capacity_of(plan), t.slo_p99_s
    return BatchPolicy(plan.totals.tokens, 0.0, front_door=False), None, plan.totals.slo_s


def simulate_plan(
    plan: Plan,
    arrivals: Arrivals,
    *,
    slo_s: float | None = None,
    idle_s: float | None = None,
    max_batch_tokens: int | None = None,
    max_wait_s: float | None = None,
    calibration: Calibration | None = None,
    reserve: bool = True,
) -> dict[str, Any]:
    """Simulate `plan` over `arrivals` and report (the JSON of `moelambda traffic`).

    Args:
        plan: The deployment.
        arrivals: The request stream.
        slo_s: Per-request SLO for the attainment. Default: the plan's p99 SLO, else its
            batch SLO, else none.
        idle_s: Idle seconds before reclaim. Default: the calibration's assumption.
        max_batch_tokens, max_wait_s: Override the plan's batch policy.
        calibration: Where traffic parameters the plan lacks come from (default: packaged).
        reserve: Whether the stack reserves each expert function's `max_replicas` of
            concurrency, as `synth` does unless `--no-reserve-concurrency`.

    Raises:
        UsageError: A non-positive override; a batch override, or a stream without generated
            tokens, for a generating plan.
        CalibrationError: A traffic parameter is missing, or provisioned concurrency has no
            price for the plan's architecture.
    """
    if plan.stream is not None:  # workers batching over a queue: no batch policy to override
        from planner.stream import simulate_stream_plan

        if max_batch_tokens is not None or max_wait_s is not None:
            raise UsageError(
                "a stream plan's workers batch its requests continuously: it has no batch "
                "policy to override.",
                "drop --max-batch-tokens and --max-wait.",
            )
        return simulate_stream_plan(plan, arrivals, calibration)
    if plan.generation is not None:
        from planner.traffic.generation import generation_report

        if max_batch_tokens is not None or max_wait_s is not None:
            raise UsageError(
                "a generating plan serves each request in its own driver invocation: it has "
                "no front door to batch behind.",
                "drop --max-batch-tokens and --max-wait.",
            )
        return generation_report(
            plan, arrivals, slo_s=slo_s, idle_s=idle_s, calibration=calibration, reserve=reserve
        )
    started = time.perf_counter()
    policy, capacity, plan_slo = policies_of(plan)
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise UsageError(f"--max-batch-tokens {max_batch_tokens} < 1.", "pass 1 or more.")
    if max_wait_s is not None and max_wait_s < 0:
        raise UsageError(f"--max-wait {max_wait_s} is negative.", "pass 0 or more seconds.")
    if idle_s is not None and not idle_s > 0:
        raise UsageError(f"--idle-s {idle_s} is not positive.", "pass e.g. --idle-s 300.")
    policy = BatchPolicy(
        policy.max_tokens if max_batch_tokens is None else int(max_batch_tokens),
        policy.max_wait_s if max_wait_s is None else float(max_wait_s),
        # Batching asked for by an override goes through the front door, as deployed.
        front_door=policy.front_door or max_batch_tokens is not None or max_wait_s is not None,
    )
    slo = slo_s if slo_s is not None else plan_slo
    cal, where = traffic_calibration(plan, calibration)
    largest = int(arrivals.tokens.max()) if arrivals.requests else 1
    model = workflow_model(plan, max(policy.max_tokens, largest))
    platform = platform_for(
        cal, model.functions, plan.arch, static_bytes=remote_table_bytes(plan), idle_s=idle_s
    )
    if capacity and any(c.kind == "provisioned" for c in capacity):
        if platform.provisioned_allocated_usd is None:
            raise CalibrationError(
                f"the plan provisions concurrency on {plan.arch}, which the calibration has no "
                "provisioned-concurrency prices for.",
                "add them under provisioned_concurrency_prices, or plan for x86_64.",
            )
    if capacity and any(c.kind == "managed" for c in capacity) and platform.managed is None:
        raise CalibrationError(
            f"the plan runs functions on Lambda Managed Instances on {plan.arch}, which the "
            "calibration has no instance prices for.",
            "add managed_instances_prices and ec2_instance_prices of that architecture.",
        )
    result = simulate(model, arrivals, policy, platform, capacity, reserve=reserve)
    summary = result.summary(slo)
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    summary["simulation_s"] = round(result.wall_s, 3)
    return {
        "plan": plan.solver,
        "traffic": arrivals.describe(),
        **summary,
        "batch_policy": {
            "max_tokens": policy.max_tokens,
            "max_wait_s": policy.max_wait_s,
            "front_door": policy.front_door,
        },
        "capacity": "none"
        if capacity is None
        else {
            name: c.kind if c.kind == "none" else c.__dict__
            for name, c in zip(model.functions.names, capacity, strict=True)
            if c.kind != "none"
        },
        "idle_reclaim_s": platform.idle_s,
        "init_s": {
            name: round(float(s), 4)
            for name, s in zip(model.functions.names, platform.cold_s()[0], strict=True)
        },
        "largest_batch_served": model.feasible_tokens,
        "reserved_concurrency": reserve,
        "traffic_parameters_from": where,
    }
