"""The one writer of a `Plan` document.

Every shape (`planner.batch_shapes`: the workflow's `planner.build.make_plan`, the driver's and
one function's `planner.deployments.driver_plan`, a generating driver's
`planner.deployments.generation_plan`) and every hardware kind (`planner.hardware.gpu_plan`)
decides its layers, totals and blocks, and hands them here: the model's reference, the
calibration the plan was priced with and the document's version are written in one place, so
no two shapes can write them differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ground.plan import ModelRef, Plan

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import DriverPlan, GenerationPlan, LayerPlan, Totals, TrafficPlan
    from planner.calibration import Calibration

__all__ = ["write_plan"]


def write_plan(
    manifest: Manifest,
    calibration: Calibration,
    *,
    solver: str,
    workflow: str,
    objective: str,
    nonmoe_memory_mb: int,
    optimal: bool | None,
    arch: str,
    direct_payload_bytes: int,
    counts_source: dict[str, Any],
    layers: list[LayerPlan],
    totals: Totals,
    deployment: str = "workflow",
    driver: DriverPlan | None = None,
    generation: GenerationPlan | None = None,
    traffic: TrafficPlan | None = None,
) -> Plan:
    """The validated `Plan` of a shape's decisions on `manifest`'s model, priced with
    `calibration` (carried without its provenance: the plan prices its own bill again)."""
    keep = set(ModelRef.model_fields)
    return Plan(
        solver=solver,
        workflow=workflow,  # type: ignore[arg-type]
        objective=objective,  # type: ignore[arg-type]
        nonmoe_memory_mb=int(nonmoe_memory_mb),
        optimal=optimal,
        arch=arch,  # type: ignore[arg-type]
        direct_payload_bytes=int(direct_payload_bytes),
        counts_source=counts_source,
        model=ModelRef(**{k: v for k, v in manifest.model_dump().items() if k in keep}),
        calibration=calibration.model_dump(mode="json", exclude={"provenance"}),
        layers=layers,
        totals=totals,
        deployment=deployment,  # type: ignore[arg-type]
        driver=driver,
        generation=generation,
        traffic=traffic,
    )
