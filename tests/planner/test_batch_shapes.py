"""The deployment shapes are a registry: a shape registered in one line is planned beside the
others, listed among the candidates, chosen when it is the cheapest, and refused by name where
the options say it cannot serve (`planner.batch_shapes`)."""

from __future__ import annotations

import dataclasses

import pytest

from ground.errors import UsageError
from planner import batch_shapes, load_calibration
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
            update={"totals": totals.model_copy(update={"bill_usd": bill})}
        )
        return dataclasses.replace(done, plan=cheaper)


@pytest.fixture()
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(batch_shapes.SHAPES, "toy", _HalfPriceWorkflow())


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
