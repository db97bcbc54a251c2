"""`moelambda run-local --front-door N` as a call: a batch sent as N requests through a traffic
plan's SQS queue and batcher on moto, each request's output checked against the monolithic
model, and the front door's billed requests against the planned ones.

`run_plan_locally` (runtime/local.py) starts one execution itself; a deployment fed by the
front door never does: requests go to the queue and the batcher groups them into executions
by the plan's batch policy (`ground.frontdoor`). This runs that path with the same handlers.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

    from ground.plan import Plan
    from moe import MoEModel

__all__ = ["front_door_plan", "run_front_door_locally"]


def front_door_plan(plan: Path) -> Plan:
    """The plan at `plan`, if it has a front door (a batch policy from `plan --traffic`).

    Raises:
        UsageError: It was planned for one batch.
    """
    from ground.plan import Plan

    document = Plan.load(plan)
    if document.traffic is None:
        raise UsageError(
            f"'{plan}' has no front door: it was planned for one batch.",
            "make the plan with `moelambda plan --traffic SPEC --slo-p99 S`, or leave "
            "--front-door out.",
        )
    return document


def run_front_door_locally(
    plan: Path,
    model: MoEModel,
    requests: list[np.ndarray],
    *,
    arrivals_s: list[float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Send `requests` through the plan's front door on moto and check every output.

    The stack is the one `moelambda synth` emits for the plan with every capacity policy set
    to none: warmers, provisioned concurrency and managed instances keep a stream's
    environments warm, and a local run is metered warm anyway. The event source mapping is
    played in virtual time (`pipeline.local.run_front_door`): nothing sleeps for the window.

    Args:
        plan: A plan made with `moelambda plan --traffic` (it has a batch policy).
        model: The plan's model, loaded.
        requests: Token ids, one (windows, tokens per window) array per request.
        arrivals_s: Each request's arrival, seconds, sorted. Defaults to None: all at 0.
        progress: Called with a message as each step starts.

    Returns:
        The status; per request its execution and largest difference from the monolithic
        output; the executions and the deliveries (request indices); the front door's metered
        usage against the planned one and whether they are equal; the wall time.

    Raises:
        UsageError: The plan has no traffic block (no front door).
    """
    import numpy as np

    from cdk.app import DEFAULT_STACK, build_app
    from functions.local import run_front_door
    from ground.plan import FunctionCapacity
    from moe import export_model
    from pipeline.stacks import flat_template
    from runtime.local import _reference

    say = progress or (lambda _: None)
    document = front_door_plan(plan)
    assert document.traffic is not None
    say("running the monolithic model on each request")
    references = [_reference(model, ids, document.model.experts)[0] for ids in requests]
    bare = document.traffic.model_copy(
        update={
            "capacity": [
                FunctionCapacity(function=c.function, policy="none")
                for c in document.traffic.capacity
            ],
            "managed_instance_type": None,
            "managed_instances": 0,
        }
    )
    with tempfile.TemporaryDirectory(prefix="moelambda-front-door-") as tmp:
        root = Path(tmp)
        say("exporting weights and synthesising the stack with its front door")
        export_model(model, root / "weights")
        source = document.model_copy(update={"traffic": bare}).save(root / "plan.json")
        build_app(source, root / "cdk.out", stack_name=DEFAULT_STACK)
        template = flat_template(root / "cdk.out", DEFAULT_STACK)
        say(f"sending {len(requests)} request(s) to the queue on moto")
        started = time.perf_counter()
        result = run_front_door(template, root / "weights", requests, arrivals_s, metered=True)
        wall_s = time.perf_counter() - started
    runs = result["requests"]
    execution_of = {rid: e for e, members in enumerate(result["executions"]) for rid in members}
    per_request = [
        {
            "request": run["request"],
            "status": run["status"],
            "tokens": int(ids.size),
            "execution": execution_of.get(run["request"]),  # index in "executions"
            "max_abs_diff_vs_monolithic": (
                float(np.abs(run["output"] - ref).max()) if "output" in run else None
            ),
        }
        for run, ids, ref in zip(runs, requests, references, strict=True)
    ]
    metered, planned = result["front_door_usage"], result["front_door_planned"]
    keys = [k for k in planned if k != "executions"]
    failed = [r for r in per_request if r["status"] != "SUCCEEDED"]
    diffs = [d for r in per_request if (d := r["max_abs_diff_vs_monolithic"]) is not None]
    broken = failed or result["errors"] or result["failed_messages"]
    return {
        "status": "FAILED" if broken else "SUCCEEDED",
        "requests": per_request,
        "max_abs_diff_vs_monolithic": max(diffs) if diffs else None,
        "executions": result["executions"],
        "deliveries": result["deliveries"],
        "batch_policy": {
            "max_batch_tokens": document.traffic.max_batch_tokens,
            "max_wait_s": document.traffic.max_wait_s,
        },
        "front_door_metered": metered,
        "front_door_planned": planned,
        "metered_equals_planned": {k: metered[k] for k in keys} == {k: planned[k] for k in keys},
        "errors": result["errors"],
        "failed_messages": result["failed_messages"],
        "access_denied": [
            {"function": who, "action": action, "resource": resource}
            for who, action, resource in result["denied"]
        ],
        "wall_s": round(wall_s, 3),
    }
