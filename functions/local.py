"""The project's handlers for the local runner (`pipeline.local`), which does not import them.

`LocalHandlers` gives the runner what it needs of functions/: each handler by its template
name, a function's environment and invoker for one call (`functions.config.local`), the direct
gate's retry of throttling, the weights a warm container holds, and the S3 clients to drop
after a run. `run_workflow` is `pipeline.local.run_workflow` with them passed in.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from functions import config

if TYPE_CHECKING:
    import numpy as np

    from ground.placement import Placement
    from pipeline.faults import Faults

__all__ = ["LocalHandlers", "run_front_door", "run_workflow"]

Invoker = Callable[[str, dict[str, Any]], Any]


class LocalHandlers:
    """The handlers of functions/ as `pipeline.local.Handlers`."""

    def resolve(self, handler: str) -> Callable[[dict[str, Any], Any], Any]:
        """The handler function of a template's `Handler` (e.g. functions.head.lambda_handler)."""
        module, _, attr = handler.rpartition(".")
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]

    def environment(
        self, env: Mapping[str, str], invoker: Invoker | None = None
    ) -> AbstractContextManager[None]:
        """`functions.config.local`: the handler sees `env` and invokes through `invoker`."""
        return config.local(env, invoker=invoker)

    def retry_throttled(self, invoke: Invoker) -> Invoker:
        """`functions.config.retry_throttled`."""
        return config.retry_throttled(invoke)

    def warm(self, role: str, env: Mapping[str, str]) -> None:
        """Load the stage of a function of `role` into the process-wide weights cache (the
        cleanup function loads none)."""
        from functions import warm

        if role in ("cleanup", "batcher"):
            return
        with config.local(env):
            warm.load_own_weights(role)

    def drop_clients(self) -> None:
        """`functions.common.drop_local_clients`."""
        from functions.common import drop_local_clients

        drop_local_clients()


def run_workflow(
    template: dict[str, Any],
    weights_dir: Path,
    requests: list[np.ndarray | dict[str, Any]],
    *,
    timeout_s: float = 600.0,
    metered: bool = False,
    faults: Faults | None = None,
    metrics_file: Path | None = None,
    on_planned_device: bool = False,
    placements: Mapping[str, Placement] | None = None,
) -> dict[str, Any]:
    """`pipeline.local.run_workflow` running the project's own handlers (`LocalHandlers`).

    Args:
        template: The synthesised CloudFormation template (`pipeline.stacks.flat_template`).
        weights_dir: The exported weights (`moelambda export`).
        requests: Token ids, one array per execution, or an execution's input (a dict).
        timeout_s: Seconds every execution may take in all. Defaults to 600.
        metered: Warm every function first and count what AWS would bill. Defaults to False.
        faults: Faults to inject (`pipeline.faults`). Defaults to None (none).
        metrics_file: Where the gates append their routing metrics (EMF lines), as on Lambda
            they print them. Defaults to None (not written).
        on_planned_device: Run GPU-backed functions on their planned device (a GPU here)
            instead of this machine's CPU. Defaults to False.
        placements: Functions' planned placements by label, where the template does not
            carry them (a plan synthesised without its capacity). Defaults to None.

    Returns:
        See `pipeline.local.run_workflow`.
    """
    from pipeline.local import run_workflow as run

    return run(
        template,
        weights_dir,
        requests,
        handlers=LocalHandlers(),
        timeout_s=timeout_s,
        metered=metered,
        faults=faults,
        metrics_file=metrics_file,
        on_planned_device=on_planned_device,
        placements=placements,
    )


def run_front_door(
    template: dict[str, Any],
    weights_dir: Path,
    requests: list[np.ndarray],
    arrivals_s: list[float] | None = None,
    *,
    timeout_s: float = 600.0,
    metered: bool = False,
    metrics_file: Path | None = None,
    calibration: Path | None = None,
) -> dict[str, Any]:
    """`pipeline.local.run_front_door` running the project's own handlers: `requests` sent
    through the template's SQS queue and batcher (the plan must be made with `--traffic`).

    Args:
        template: The synthesised CloudFormation template of a traffic plan.
        weights_dir: The exported weights (`moelambda export`).
        requests: Token ids, one (windows, tokens per window) array per request.
        arrivals_s: Each request's arrival in seconds, sorted (virtual time: the event
            source's window groups them, nothing sleeps). Defaults to None: all at 0.
        timeout_s: Seconds every execution may take in all. Defaults to 600.
        metered: Warm every function first and count what AWS would bill, the front door's
            requests apart. Defaults to False.
        metrics_file: Where the gates append their routing metrics. Defaults to None.
        calibration: The calibration file whose SQS limits apply. Defaults to None: packaged.

    Returns:
        See `pipeline.local.run_front_door`.
    """
    from pipeline.local import run_front_door as run
    from planner.calibration import load_calibration

    cal = load_calibration(calibration)
    limits = {
        "sqs_request_chunk_bytes": cal.sqs_request_chunk_bytes,
        "sqs_receive_max_messages": cal.sqs_receive_max_messages,
    }
    if None in limits.values():
        raise ValueError(f"{cal.source_path} lacks the front door's SQS limits")
    return run(
        template,
        weights_dir,
        requests,
        arrivals_s,
        handlers=LocalHandlers(),
        limits=limits,  # type: ignore[arg-type]
        timeout_s=timeout_s,
        metered=metered,
        metrics_file=metrics_file,
    )
