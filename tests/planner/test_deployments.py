"""`plan` weighs the deployment shapes: every candidate listed, the cheapest meeting the SLO
written, the ones that cannot run named with their reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ground.plan import Plan
from moelambda.cli import app
from planner import load_calibration
from planner.api import PlanOptions, plan_deployment, shape_counts_for_plan

runner = CliRunner()


def test_plan_lists_every_shape_and_writes_the_cheapest(counts: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", "--counts", str(counts), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    listed = {c["deployment"]: c for c in summary["candidates"]}
    assert set(listed) == {"monolithic", "driver", "workflow"}
    keys = {"deployment", "bill_usd", "latency_s", "feasible", "local_experts", "functions"}
    assert all(keys | {"reason"} <= set(c) for c in listed.values())
    cheapest = min((c for c in listed.values() if c["feasible"]), key=lambda c: c["bill_usd"])
    assert summary["deployment"] == cheapest["deployment"]
    plan = Plan.load(out)
    assert plan.deployment == summary["deployment"]
    assert plan.totals.bill_usd["total_usd"] == pytest.approx(cheapest["bill_usd"])
    assert plan.candidates == summary["candidates"]
    assert listed["monolithic"]["functions"] == 1 and listed["monolithic"]["local_experts"] == 24
    assert listed["workflow"]["local_experts"] == 0
    # MiniLM fits one function, which pays no transition, S3 round trip or expert start
    assert listed["monolithic"]["bill_usd"] < listed["workflow"]["bill_usd"] / 5
    # an SLO below the monolithic function's smallest: the faster shapes remain
    tight = listed["monolithic"]["smallest_slo_s"] * 0.9
    result = runner.invoke(
        app,
        ["plan", "--counts", str(counts), "--out", str(out), "--force", "--slo", str(tight)]
        + ["--json"],
    )
    if result.exit_code == 0:
        fast = json.loads(result.stdout)
        assert fast["deployment"] != "monolithic" and fast["latency_s"] <= tight * (1 + 1e-9)
        mono = next(c for c in fast["candidates"] if c["deployment"] == "monolithic")
        assert not mono["feasible"] and "fastest takes" in mono["reason"]
    else:
        assert result.exit_code == 2 and "no deployment shape" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--deployment", "serverful"], "unknown --deployment"),
        (["--deployment", "driver", "--method", "s3"], "--method is an option of the fan-out"),
        (["--deployment", "monolithic", "--objective", "experts"], "--objective experts is"),
        (["--deployment", "driver", "--pack", "2"], "--pack 2 is an option"),
    ],
)
def test_a_shape_that_contradicts_the_options_exits_2(
    counts: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["plan", "--counts", str(counts), "--out", str(out), *extra])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not out.exists()


def test_workflow_only_options_plan_the_workflow_alone(counts: Path, tmp_path: Path) -> None:
    for extra in (["--method", "s3"], ["--objective", "experts"], ["--pack", "2"]):
        out = tmp_path / "p.json"
        result = runner.invoke(
            app, ["plan", "--counts", str(counts), "--out", str(out), "--force", "--json", *extra]
        )
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["deployment"] == "workflow", extra
        assert [c["deployment"] for c in summary["candidates"]] == ["workflow"]


def test_mixtral_is_too_large_for_one_function_and_its_driver_fits_its_memory() -> None:
    """The issue's real-scale case: monolithic refused with its reason, a driver or the
    workflow chosen, and the driver's local experts within its memory."""
    cal = load_calibration()
    planning = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=10240)
    assert planning.manifest is not None
    planned = plan_deployment(
        planning.manifest, planning, cal, options=PlanOptions(concurrency_quota=100_000)
    )
    listed = {c["deployment"]: c for c in planned.summary["candidates"]}
    assert not listed["monolithic"]["feasible"]
    assert "weights 93.4 GB > 10,240 MB" in listed["monolithic"]["reason"]
    assert planned.summary["deployment"] in ("driver", "workflow")
    assert listed["driver"]["feasible"] and listed["workflow"]["feasible"]
    # the driver is several times faster than the fan-out (its smallest SLO too)
    assert listed["driver"]["smallest_slo_s"] < listed["workflow"]["smallest_slo_s"] / 2
    driver = planned.shapes["driver"]
    assert driver.driver is not None and driver.nonmoe_memory_mb <= 10240
    held = cal.driver_runtime_mb + driver.driver.weights_mb + driver.driver.activations_mb
    assert held <= driver.nonmoe_memory_mb
    local = sum(len(x) for x in driver.driver.local)
    assert local == listed["driver"]["local_experts"] and 0 < local < 32 * 8
    # at an SLO the workflow cannot meet, the driver is what is deployed
    slo = (listed["driver"]["smallest_slo_s"] + listed["workflow"]["smallest_slo_s"]) / 2
    tight = plan_deployment(
        planning.manifest,
        planning,
        cal,
        slo_s=slo,
        options=PlanOptions(concurrency_quota=100_000),
    )
    assert tight.summary["deployment"] == "driver" and tight.plan.totals.latency_s <= slo
