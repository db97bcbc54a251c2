"""The deployment shapes are a registry: a shape registered in one line (its planner shape in
`planner.batch_shapes`, its topology in `ground.topology`) is planned beside the others, listed
among the candidates, chosen when it is the cheapest, written, read back and re-scored as its
topology runs, and refused by name where the options say it cannot serve."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pydantic import ValidationError

from ground import topology
from ground.errors import UsageError
from ground.plan import Plan
from ground.topology import Topology
from planner import batch_shapes, evaluate_plan, load_calibration
from planner.api import PlanOptions, plan_deployment, shape_counts_for_plan
from planner.batch_shapes import SHAPES, ShapePlanned, ShapeRequest, shapes_for


@dataclasses.dataclass(frozen=True)
class _HalfPriceWorkflow:
    """A toy shape: the fan-out workflow's functions, planned as the workflow is, whose bill is
    half of it (what a cheaper way of running the same functions would be)."""

    name: str = "toy"
    workflow_options: bool = False
    generates: bool = False

    def plan(self, request: ShapeRequest) -> ShapePlanned:
        done = SHAPES["workflow"].plan(request)
        totals = done.plan.totals
        bill = {k: v / 2 for k, v in totals.bill_usd.items()}
        cheaper = done.plan.model_copy(
            update={"totals": totals.model_copy(update={"bill_usd": bill}), "deployment": "toy"}
        )
        return dataclasses.replace(done, plan=cheaper)


@pytest.fixture()
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(batch_shapes.SHAPES, "toy", _HalfPriceWorkflow())
    toy_runs = Topology("toy", driven=False, expert_functions="all", what="a toy workflow")
    monkeypatch.setitem(topology.TOPOLOGIES, "toy", toy_runs)


@pytest.mark.usefixtures("toy")
def test_a_registered_shape_is_weighed_and_chosen_when_cheapest() -> None:
    counts = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=256)
    assert counts.manifest is not None
    planned = plan_deployment(counts.manifest, counts, load_calibration())
    listed = {c["deployment"]: c for c in planned.summary["candidates"]}
    assert set(listed) == {"monolithic", "driver", "workflow", "toy"}
    feasible = {name: c["bill_usd"] for name, c in listed.items() if c["feasible"]}
    assert planned.summary["deployment"] == "toy" == min(feasible, key=feasible.__getitem__)
    assert listed["toy"]["bill_usd"] == pytest.approx(listed["workflow"]["bill_usd"] / 2)
    # written, read back and re-scored as its topology runs: the workflow's functions
    plan = Plan.model_validate_json(planned.plan.model_dump_json())
    assert plan.deployment == "toy" and not plan.topology.driven
    assert listed["toy"]["functions"] == len(plan.topology.function_names(plan.layers))
    counts_now = np.asarray(counts.counts, dtype=float)
    again = evaluate_plan(plan, counts.manifest, counts_now, counts.tokens)
    assert "head" in again.seconds and again.latency_s == pytest.approx(plan.totals.latency_s)


def test_a_plan_names_a_known_deployment() -> None:
    counts = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=256)
    assert counts.manifest is not None
    planned = plan_deployment(
        counts.manifest, counts, load_calibration(), options=PlanOptions(deployment="workflow")
    )
    document = planned.plan.model_dump() | {"deployment": "layered"}
    with pytest.raises(ValidationError, match="unknown deployment 'layered': one of workflow"):
        Plan.model_validate(document)


@pytest.mark.usefixtures("toy")
def test_a_registered_shape_is_refused_where_its_traits_say_so() -> None:
    assert "toy" in shapes_for(PlanOptions())
    assert "toy" not in shapes_for(PlanOptions(method="s3"))  # the workflow's own option
    assert "toy" not in shapes_for(PlanOptions(slo_tpot_s=1.0))  # it does not generate
    counts = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=256)
    assert counts.manifest is not None
    with pytest.raises(UsageError, match="--method is an option of the fan-out workflow"):
        plan_deployment(
            counts.manifest,
            counts,
            load_calibration(),
            options=PlanOptions(deployment="toy", method="s3"),
        )
