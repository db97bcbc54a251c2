"""The traffic side of the calibration: INIT per function, the idle time and the prices.

A plan records the calibration it was made with; plans made before the traffic parameters
existed lack them, so `traffic_calibration` takes them from the given (or packaged) calibration
file instead and says so. `calibrated_cold_document` writes what `moelambda calibrate --cold`
measured into the file, as `planner.compute.calibrated_document` does for U_j.
"""

from __future__ import annotations

import copy
from datetime import date
from decimal import Decimal
from typing import Any

import numpy as np

from ground import frontdoor
from ground.coldstart import InitModel
from ground.errors import CalibrationError
from ground.frontdoor import BATCHER_MEMORY_MB
from ground.plan import Plan
from planner.calibration import Calibration, ColdStartReference, load_calibration
from planner.replay import calibration_of
from planner.traffic.managed import managed_prices
from planner.traffic.simulate import FrontDoor, Platform
from planner.traffic.workflow import Functions

__all__ = [
    "FRONT_DOOR_FIELDS",
    "MANAGED_FIELDS",
    "TRAFFIC_FIELDS",
    "front_door_for",
    "calibrated_cold_document",
    "init_model",
    "platform_for",
    "traffic_calibration",
]

TRAFFIC_FIELDS = (
    "init_image_start_s",
    "init_limit_s",
    "init_billed",
    "idle_reclaim_s",
    "provisioned_concurrency_prices",
    "scheduler_invocation_usd",
    "cold_start_reference",
)
# The front door's limits and prices: filled like the traffic fields; a calibration without
# them simulates the front door's batching by the policy as given, unpriced (with a note).
FRONT_DOOR_FIELDS = (
    "sqs_request_usd",
    "sqs_request_chunk_bytes",
    "sqs_message_max_bytes",
    "sqs_receive_max_messages",
    "sqs_long_poll_s",
    "sqs_idle_pollers",
    "esm_batching_window_max_s",
    "esm_batch_size_max",
    "esm_batch_size_max_without_window",
    "start_execution_s",
    "batcher_import_s",
)
# Lambda Managed Instances' prices: filled like the traffic fields; without them the planner
# offers no managed capacity (`planner.traffic.managed`).
MANAGED_FIELDS = ("managed_instances_prices", "ec2_instance_prices")


def traffic_calibration(
    plan: Plan, calibration: Calibration | None = None
) -> tuple[Calibration, str]:
    """(the plan's calibration with every traffic field, where those fields came from).

    The plan's own values win; missing ones come from `calibration` (default: the packaged
    file), so a plan made before `moelambda calibrate --cold` can still be simulated.
    """
    own = calibration_of(plan)
    fields = TRAFFIC_FIELDS + FRONT_DOOR_FIELDS + MANAGED_FIELDS
    if all(getattr(own, name) is not None for name in fields):
        return own, "plan"
    other = calibration or load_calibration()
    update = {n: getattr(other, n) for n in fields if getattr(own, n) is None}
    # The filled values keep their provenance (the kinds of source the bill's notes name).
    provenance = own.provenance | {n: other.provenance[n] for n in update if n in other.provenance}
    where = str(other.source_path or "the calibration file")
    return own.model_copy(update=update | {"provenance": provenance}), where


def init_model(calibration: Calibration) -> InitModel:
    """The INIT model of `calibration`.

    Raises:
        CalibrationError: A traffic parameter is missing (the measured INIT above all), naming
            it and the command that fills it.
    """
    missing = [n for n in TRAFFIC_FIELDS if getattr(calibration, n) is None]
    if missing:
        where = calibration.source_path or "the calibration file"
        measured = "cold_start_reference" in missing
        raise CalibrationError(
            f"{where} lacks the traffic parameters {', '.join(missing)}.",
            "run `moelambda calibrate --cold` to measure the handlers' INIT"
            if measured
            else f"add them to {where} (see the packaged planner/data/calibration.json).",
        )
    ref = calibration.cold_start_reference
    assert ref is not None and calibration.init_image_start_s is not None
    assert calibration.init_limit_s is not None
    return InitModel(
        image_start_s=calibration.init_image_start_s,
        python_start_s=ref.python_start_s,
        import_s=dict(ref.import_s),
        load_fixed_s=ref.load_fixed_s,
        load_s_per_byte=ref.load_s_per_byte,
        config_objects=ref.config_objects,
        config_bytes=ref.config_bytes,
        manifest_bytes=ref.manifest_bytes,
        s3_delay_s=calibration.s3_access_delay_s,
        s3_bandwidth_bytes_per_s=calibration.s3_bandwidth_bytes_per_s,
        limit_s=calibration.init_limit_s,
    )


def front_door_for(calibration: Calibration, static_bytes: int) -> FrontDoor | None:
    """The front door's limits and prices, and its batcher's INIT (None: not calibrated);
    `static_bytes` is what the plan's Tasks carry beside the input
    (`ground.driver.remote_table_bytes`)."""
    c = calibration
    if any(getattr(c, n) is None for n in FRONT_DOOR_FIELDS) or c.init_image_start_s is None:
        return None
    assert c.batcher_import_s is not None and c.start_execution_s is not None
    return FrontDoor(
        window_limit_s=float(c.esm_batching_window_max_s),  # type: ignore[arg-type]
        records_max=int(c.esm_batch_size_max),  # type: ignore[arg-type]
        records_max_without_window=int(c.esm_batch_size_max_without_window),  # type: ignore[arg-type]
        sqs_request_usd=float(c.sqs_request_usd),  # type: ignore[arg-type]
        chunk_bytes=int(c.sqs_request_chunk_bytes),  # type: ignore[arg-type]
        receive_max=int(c.sqs_receive_max_messages),  # type: ignore[arg-type]
        idle_pollers=int(c.sqs_idle_pollers),  # type: ignore[arg-type]
        long_poll_s=float(c.sqs_long_poll_s),  # type: ignore[arg-type]
        batcher_memory_mb=float(BATCHER_MEMORY_MB),
        batcher_init_s=c.init_image_start_s + c.batcher_import_s,
        start_s=c.start_execution_s,
        put_s=c.s3_access_delay_s,
        input_limit_bytes=frontdoor.inline_input_limit(
            c.step_functions_payload_bytes, static_bytes
        ),
        s3_put_usd=c.s3_put_request_usd,
        s3_get_usd=c.s3_get_request_usd,
    )


def platform_for(
    calibration: Calibration,
    functions: Functions | None,
    arch: str,
    *,
    static_bytes: int,
    idle_s: float | None = None,
) -> Platform:
    """The `Platform` of a deployment's functions: each one's INIT, the idle time (the
    calibration's assumption unless `idle_s` is given), the prices of `arch` (Lambda
    Managed Instances' with the instance types of `arch`) and the front door, whose inline
    input leaves `static_bytes` (`ground.driver.remote_table_bytes` of the plan). Without
    `functions`, the front door and the prices alone (`simulate.front_door_only`)."""
    model = init_model(calibration)
    phases = np.array(
        [
            model.phases(role, float(wb), int(h))
            for role, wb, h in zip(
                functions.role, functions.weight_bytes, functions.hosted, strict=True
            )
        ]
        if functions is not None
        else np.zeros((0, 2))
    )
    idle = calibration.idle_reclaim_s
    assert idle is not None and calibration.scheduler_invocation_usd is not None
    assert calibration.init_limit_s is not None and calibration.init_billed is not None
    pc = (calibration.provisioned_concurrency_prices or {}).get(arch)
    price = calibration.price(arch)
    return Platform(
        init_s=phases[:, 0],
        load_s=phases[:, 1],
        init_limit_s=calibration.init_limit_s,
        init_billed=calibration.init_billed,
        idle_s=idle.assumed_s if idle_s is None else float(idle_s),
        gb_second_usd=price.gb_second_usd,
        request_usd=price.request_usd,
        ping_s=calibration.warm_start_s,
        scheduler_invocation_usd=calibration.scheduler_invocation_usd,
        billing_mb_per_gb=calibration.billing_mb_per_gb,
        provisioned_allocated_usd=None if pc is None else pc.allocated_gb_second_usd,
        provisioned_duration_usd=None if pc is None else pc.duration_gb_second_usd,
        front_door=front_door_for(calibration, static_bytes),
        managed=managed_prices(calibration, arch),
    )


def _decimals(value: Any) -> Any:
    """Floats to 4 significant digits as decimals, recursively (the file's precision)."""
    if isinstance(value, float):
        return Decimal(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _decimals(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decimals(v) for v in value]
    return value


def calibrated_cold_document(
    document: dict[str, Any], reference: ColdStartReference, today: date
) -> dict[str, Any]:
    """A copy of the calibration `document` with `cold_start_reference` measured; only its
    value, source (its kind: "measured") and date change."""
    updated = copy.deepcopy(document)
    entry = updated["parameters"].get("cold_start_reference")
    if entry is None:
        raise CalibrationError(
            "the calibration file has no cold_start_reference entry to fill.",
            "start from the packaged planner/data/calibration.json, which has one.",
        )
    entry |= {
        "value": _decimals(reference.model_dump()),
        "source": f"measured by `moelambda calibrate --cold` on {reference.cpu_model}, torch "
        f"{reference.torch_version}, {reference.repeats} fresh processes per role",
        "source_kind": "measured",
        "as_of": today.isoformat(),
    }
    return updated
