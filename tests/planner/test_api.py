"""The calls behind `plan`, `compare`, `plan --traffic`, `backtest`, `bo` and `calibrate --cold`,
made from Python: each gives the numbers its command prints with --json for the same inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moe import MoEModel, describe_model
from moelambda.cli import app
from planner import (
    Plan,
    counts_for_plan,
    load_calibration,
    plan_deployment,
    serverless_best,
    shape_counts_for_plan,
    write_pareto,
)
from predictor import PredictedCounts

runner = CliRunner()


def _cli(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def _without(summary: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in (*keys, "seconds")}


def test_plan_deployment_is_the_plan_command(
    counts: Path, minilm: MoEModel, tmp_path: Path
) -> None:
    out, curve = tmp_path / "cli.json", tmp_path / "cli.csv"
    printed = _cli("plan", "--counts", str(counts), "--out", str(out), "--slo", "12",
                   "--pareto", str(curve), "--json")  # fmt: skip
    planning = counts_for_plan(counts=counts, tokens=10240)
    planned = plan_deployment(
        describe_model(minilm), planning, load_calibration(), slo_s=12, whole_curve=True
    )
    assert planned.summary["seconds"] >= 0
    assert _without(planned.summary) == _without(printed, "plan", "pareto")
    assert planned.plan.model_dump() == Plan.load(out).model_dump()
    files = write_pareto(tmp_path / "api.csv", planned)
    assert files == [str(tmp_path / "api.csv"), str(tmp_path / "api.png")]
    assert (tmp_path / "api.csv").read_text() == curve.read_text()


def test_serverless_best_is_compares_lambda_side(counts: Path, minilm: MoEModel) -> None:
    from gpu.api import compare_serverless_gpu

    printed = _cli("compare", "--counts", str(counts), "--slo", "60", "--rps", "1", "--json")
    manifest = describe_model(minilm)
    best = serverless_best(
        manifest, counts_for_plan(counts=counts, tokens=10240), load_calibration(), 60
    )
    comparison = compare_serverless_gpu(
        PredictedCounts.load(counts).array(),
        manifest,
        lambda_cost_usd=best.plan.totals.bill_usd["total_usd"],
        lambda_latency_s=best.plan.totals.latency_s,
        tokens=10240,
        slo_s=60,
        rps=1,
        lambda_deployment=best.summary["deployment"],
        lambda_candidates=best.summary["candidates"],
    )
    assert comparison.summary == printed
    # every shape is listed beside the GPUs, the cheapest as Lambda's side
    listed = {c["deployment"]: c for c in printed["serverless_candidates"]}
    assert set(listed) == {"monolithic", "driver", "workflow"}
    cheapest = min((c for c in listed.values() if c["feasible"]),
                   key=lambda c: c["cost_per_million_tokens_usd"])  # fmt: skip
    assert printed["serverless"]["deployment"] == cheapest["deployment"]


def test_a_shape_plans_from_python_as_at_the_command_line(tmp_path: Path) -> None:
    """Mixtral's shape (32 layers of 8 experts) plans in a second or two; OLMoE's (16 of 64),
    which test_shape_cli.py plans, in 10 to 30 s on 2 cores, twice here."""
    printed = _cli("plan", "--shape", "mixtral", "--tokens", "1024", "--out",
                   str(tmp_path / "p.json"), "--json")  # fmt: skip
    planning = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=1024)
    assert planning.manifest is not None and planning.model is None
    planned = plan_deployment(planning.manifest, planning, load_calibration())
    assert _without(planned.summary) == _without(printed, "plan")


def test_plan_traffic_is_plan_with_traffic(counts: Path, minilm: MoEModel, tmp_path: Path) -> None:
    from planner.traffic.api import plan_traffic

    # CPU functions only: `--hardware auto` (the default) is `planner.hardware.gpu_plan
    # .plan_traffic_on_hardware`, which adds the GPU-backed candidates to this plan
    stream = ("--traffic", "poisson:0.05", "--hours", "1", "--slo-p99", "30", "--hardware", "cpu")
    printed = _cli("plan", "--counts", str(counts), *stream, "--out",
                   str(tmp_path / "p.json"), "--json")  # fmt: skip
    choice, summary = plan_traffic(
        describe_model(minilm),
        counts_for_plan(counts=counts, tokens=10240),
        load_calibration(),
        traffic="poisson:0.05",
        hours=1,
        slo_p99_s=30,
    )
    assert _without(summary) == _without(printed, "plan")
    saved = Plan.load(tmp_path / "p.json")
    ours, theirs = choice.plan.model_dump(mode="json"), saved.model_dump(mode="json")
    for plan in (ours, theirs):
        plan["traffic"]["simulated"].pop("wall_s")  # the simulation's own run time
    assert ours == theirs


def test_backtest_and_bo_from_python(tmp_path_factory: pytest.TempPathFactory) -> None:
    from moelambda.cli._app import manifest_of_trace
    from planner.backtest import backtest_plans, plot_backtest
    from planner.bo import BoSettings, EpsilonGreedy, compare_strategies
    from predictor import RoutingTrace

    traces = tmp_path_factory.mktemp("api-trace") / "trace"
    _cli("profile", "--tokens", "5120", "--out", str(traces), "--json")
    trace = RoutingTrace.load(traces)
    manifest, cal = manifest_of_trace(trace), load_calibration()

    args = ("--traces", str(traces), "--tokens", "512", "--batches", "4", "--json")
    printed = _cli("backtest", *args)
    summary = backtest_plans(trace, manifest, cal, tokens=512, batches=4)
    assert summary == printed
    swept = backtest_plans(trace, manifest, cal, tokens=512, batches=2, plot_sweep=True)
    assert plot_backtest(tmp_path_factory.mktemp("plot") / "b.png", swept).stat().st_size > 0

    bo = ("--traces", str(traces), "--tokens", "1280", "--test-batches", "2", "--iterations",
          "3", "--q", "32", "--strategies", "multi-eps,none", "--json")  # fmt: skip
    report = _cli("bo", *bo)
    settings = BoSettings(
        tokens=1280,
        test_batches=2,
        iterations=3,
        methods=("multi-eps", "none"),
        config=EpsilonGreedy(q=32),
    )
    ours = compare_strategies(trace, manifest, cal, settings)
    for name in ("multi-eps", "none"):
        assert ours["methods"][name]["final_cost_usd"] == report["methods"][name]["final_cost_usd"]
    assert ours["oracle_cost_usd"] == report["oracle_cost_usd"]


def test_calibrate_cold_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.coldstart as cold
    from planner import default_calibration_path
    from tests.traffic.test_coldstart import _samples

    monkeypatch.setattr(cold, "reference_export", lambda out, progress=None: out)
    monkeypatch.setattr(cold, "measure_cold", lambda root, repeats, progress=None: _samples())
    printed = _cli("calibrate", "--cold", "--out", str(tmp_path / "cli.json"), "--json")
    ours = cold.calibrate_cold(default_calibration_path(), tmp_path / "api.json", 3)
    assert _without(ours, "file", "background_cpus") == _without(
        printed, "file", "background_cpus"
    )
    written = json.loads((tmp_path / "api.json").read_text())["parameters"]
    assert written["cold_start_reference"]["value"]["import_s"]["head"] == pytest.approx(3.2)
