"""Traffic: request streams, cold starts and warm pools over time, and planning for them.

`load_arrivals` reads a traffic spec; `workflow_model` evaluates a plan's cost model over batch
sizes; `simulate` replays a stream through it (the front door's batching, execution
environments per function, cold starts, the bill); `simulate_plan` does all of it for a Plan;
`simulate_workers` replays a decoder's stream through continuously batching workers (a stream
plan's, `planner.stream`).
"""

from __future__ import annotations

from planner.traffic.replay import capacity_of, policies_of, simulate_plan
from planner.traffic.simulate import (
    BatchPolicy,
    Capacity,
    FrontDoor,
    Platform,
    TrafficResult,
    simulate,
)
from planner.traffic.spec import BUNDLED, Arrivals, load_arrivals, period_hours
from planner.traffic.workers import WorkerPrices, WorkerSpec, WorkersResult, simulate_workers
from planner.traffic.workflow import WorkflowModel, workflow_model

__all__ = [
    "BUNDLED",
    "Arrivals",
    "BatchPolicy",
    "Capacity",
    "FrontDoor",
    "Platform",
    "TrafficResult",
    "WorkerPrices",
    "WorkerSpec",
    "WorkersResult",
    "WorkflowModel",
    "capacity_of",
    "load_arrivals",
    "period_hours",
    "policies_of",
    "simulate",
    "simulate_plan",
    "simulate_workers",
    "workflow_model",
]
