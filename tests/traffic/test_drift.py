"""Drift: the gates' EMF routing records, reading them back, and `replan`'s verdict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from functions.metrics import emit, expert_counts_record
from ground.errors import UsageError
from moelambda.cli import app
from planner.drift import REFIT_MIN_ROUTED, SAVING_THRESHOLD, read_metrics, replan
from planner.traffic.workflow import _per_expert_counts
from tests.traffic.plans import tiny_plan

runner = CliRunner()


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    return tiny_plan(tokens=2048, slo_s=30.0)  # every method, as replan plans


def _write(path: Path, counts: np.ndarray, batches: int = 3) -> Path:
    for b in range(batches):
        for layer, row in enumerate(counts):
            emit(expert_counts_record(layer, row, f"r{b}"), str(path))
    return path


def test_a_record_is_cloudwatch_emf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = expert_counts_record(2, np.array([5, 0, 7]), "abc")
    (directive,) = record["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "moelambda" and directive["Dimensions"] == [["Layer"]]
    assert [m["Name"] for m in directive["Metrics"]] == [f"Expert{e:02d}Tokens" for e in range(3)]
    assert record["Layer"] == "2" and record["Expert02Tokens"] == [7.0]  # Powertools' samples
    assert record["request_id"] == "abc"
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    emit(record, None)  # a local run without a metrics file writes nothing anywhere
    path = tmp_path / "m.jsonl"
    emit(record, str(path))
    assert json.loads(path.read_text()) == record


def test_read_metrics_sums_and_skips_other_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", np.array([[1, 2, 3, 4], [4, 3, 2, 1]]), batches=2)
    with path.open("a") as handle:
        handle.write("START RequestId: x\n" + json.dumps({"_aws": {}, "x": 1}) + "\n")
    counts, records = read_metrics(path, 2, 4)
    assert counts.tolist() == [[2, 4, 6, 8], [8, 6, 4, 2]] and records.tolist() == [2, 2]
    # A record with plain numbers (EMF allows both; the gates wrote these before Powertools).
    plain = {
        "_aws": {"CloudWatchMetrics": [{"Namespace": "moelambda", "Dimensions": [["Layer"]]}]},
        "Layer": "0",
        **{f"Expert{e:02d}Tokens": 1 for e in range(4)},
    }
    with path.open("a") as handle:
        handle.write(json.dumps(plain) + "\n")
    counts, records = read_metrics(path, 2, 4)
    assert counts.tolist() == [[3, 5, 7, 9], [8, 6, 4, 2]] and records.tolist() == [3, 2]
    with pytest.raises(UsageError, match="3 layers of 4"):
        read_metrics(_write(tmp_path / "b", np.ones((3, 5))), 3, 4)
    (tmp_path / "empty").write_text("nothing\n")
    with pytest.raises(UsageError, match="no routing record"):
        read_metrics(tmp_path / "empty", 2, 4)


def test_no_drift_keeps_the_plan(plan) -> None:  # type: ignore[no-untyped-def]
    report, new = replan(plan, _per_expert_counts(plan) * 5)
    assert report["max_drift"] == pytest.approx(0.0, abs=1e-12)
    assert new is not None and report["current"]["meets_slo"]
    assert abs(report["saves_fraction"]) < SAVING_THRESHOLD
    assert report["advice"] == "keep today's plan"


def test_drift_is_priced_and_the_new_plan_is_never_dearer(plan) -> None:  # type: ignore[no-untyped-def]
    planned = _per_expert_counts(plan)
    skewed = planned[:, ::-1].copy()  # the popular experts became the unpopular ones
    report, new = replan(plan, skewed)
    assert report["max_drift"] > 0.05 and new is not None
    if report["current"]["refused"] or not report["current"]["meets_slo"]:
        assert report["restores_slo"]
    else:
        assert report["new"]["cost_usd"] <= report["current"]["cost_usd"] * (1 + 1e-9)
    assert new.totals.slo_s == plan.totals.slo_s and new.totals.tokens == plan.totals.tokens


def test_replan_cli(plan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan_path = plan.save(tmp_path / "plan.json")
    metrics = _write(tmp_path / "m.jsonl", _per_expert_counts(plan)[:, ::-1].round())
    args = ["replan", "--plan", str(plan_path), "--metrics", str(metrics)]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "new.json"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["records_per_layer"] == [3, 3] and report["written"].endswith("new.json")
    again = runner.invoke(app, [*args, "--out", str(tmp_path / "new.json")])
    assert again.exit_code == 2 and "already exists" in again.output
    missing = runner.invoke(app, ["replan", "--plan", str(plan_path), "--metrics", "nope"])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_routing_far_from_the_plan_over_enough_tokens_suggests_refitting(plan) -> None:  # type: ignore[no-untyped-def]
    """All of a layer's tokens on one expert is not the text the routers were fitted on; the
    same shares over a few hundred assignments may be sampling noise, and a native model has
    no fit to redo."""
    moefied = plan.model_copy(
        update={"model": plan.model.model_copy(update={"moefy": {"fit_corpus": "wiki"}})}
    )
    planned = _per_expert_counts(plan)
    one_expert = np.zeros_like(planned)
    one_expert[:, 0] = REFIT_MIN_ROUTED
    report, _ = replan(moefied, one_expert)
    refit = report["refit"]
    assert refit is not None and refit["fit_corpus"] == "wiki"
    assert refit["layers"] == [i for i, d in enumerate(report["drift_per_layer"]) if d >= 0.2]
    assert refit["layers"] and "refit it on recent requests" in refit["advice"]
    one_expert[:, 0] = REFIT_MIN_ROUTED - 1
    assert replan(moefied, one_expert)[0]["refit"] is None
    assert replan(plan, one_expert * 2)[0]["refit"] is None  # no MoEfication to refit
    assert replan(moefied, planned * 100)[0]["refit"] is None  # as planned
