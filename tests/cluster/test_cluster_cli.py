"""`moelambda cluster simulate|compare` and `bench cluster`: the issue's fields and refusals."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from moelambda.cli import app


def test_cluster_simulate_cli_reports_the_issue_s_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = CliRunner()
    result = runner.invoke(app, ["cluster", "simulate", "--scheduler", "edf", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    issue = "scheduler jobs deadline_ratio avg_jct_s p95_jct_s makespan_s preemptions"
    assert list(summary) == [*issue.split(), "gpu_utilisation", "wall_s"]
    assert summary["jobs"] == 195 and summary["deadline_ratio"] == 23 / 195
    assert 0 < summary["gpu_utilisation"] <= 1 and summary["preemptions"] > 0  # elastic EDF
    for args, error in (
        (["--scheduler", "nosuch"], "unknown --scheduler"),
        (["--cluster", "n0"], "neither a shape"),
        (["--trace", str(tmp_path / "none.csv")], "neither a shipped trace"),
        (["--gpu-type", "A100"], "no curve for"),
        (["--slot", "0"], "not positive"),
    ):
        refused = runner.invoke(app, ["cluster", "simulate", *args])
        assert refused.exit_code == 2 and error in " ".join(refused.output.split()), args


def test_cluster_compare_runs_several_schedulers_and_plots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plot = tmp_path / "c.png"
    args = ["cluster", "compare", "--schedulers", "edf,tiresias", "--plot", str(plot), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert [r["scheduler"] for r in rows] == ["edf", "tiresias"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    refused = CliRunner().invoke(app, ["cluster", "compare", "--schedulers", "edf,nosuch"])
    assert refused.exit_code == 2 and "unknown --scheduler" in refused.output


def test_bench_cluster_sets_each_run_beside_the_artifacts() -> None:
    args = ["bench", "cluster", "--schedulers", "edf,tiresias", "--traces", "cluster01", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [(r["scheduler"], r["trace"], r["cluster"]) for r in runs] == [
        ("edf", "cluster01", "n64g8"),
        ("tiresias", "cluster01", "n64g8"),
    ]
    for row in runs:  # the artifact's runs: EDF 298, Tiresias 787 of 1,595
        assert row["matches_artifact"] and row["met"] == row["artifact_met"]
        assert row["target_s"] == 60.0 and row["wall_s"] > 0
    refused = CliRunner().invoke(app, ["bench", "cluster", "--traces", "nosuch"])
    assert refused.exit_code == 2 and "no settings for trace" in refused.output


def test_rubick_runs_on_its_own_workloads_and_families_do_not_mix() -> None:
    runner = CliRunner()
    args = ["cluster", "simulate", "--scheduler", "rubick", "--trace", "naive", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["jobs"] == 10 and summary["deadline_ratio"] is None
    assert summary["avg_jct_s"] == pytest.approx(895.6, rel=0.01)  # the artifact's own run
    mixed = runner.invoke(app, ["cluster", "compare", "--schedulers", "rubick,edf"])
    assert mixed.exit_code == 2 and "different artifacts" in " ".join(mixed.output.split())


def test_lyra_replays_a_generated_trace_and_takes_demand_from_a_gpu_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A short generated trace; with --gpu-plan the inference cluster's hourly demand is the
    plan's GPUs times the copies a diurnal request rate needs (peaking in the evening)."""
    from gpu.plan import GpuLayerPlan, GpuPlan, Hosted

    runner = CliRunner()
    small = ["--days", "1", "--jobs", "600", "--json"]
    result = runner.invoke(app, ["cluster", "simulate", "--scheduler", "lyra-gandiva", *small])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["scheduler"] == "lyra-gandiva"
    layer = GpuLayerPlan(
        layer=0,
        placement=[[Hosted(expert=e, share=1.0)] for e in range(4)],
        order="rank",
        a2a_rounds=0,
        a2a_s=0.0,
        lower_bound_s=0.0,
        layer_s=0.0,
    )
    plan = GpuPlan(
        scheduler="lina",
        model={"name": "minilm", "experts": 4, "top_k": 2},
        gpu_types=["T4"] * 4,
        tokens=512,
        layers=[layer],
        total_s=0.5,
        cost_per_million_tokens_usd=0.0,
    )
    plan.save(tmp_path / "plan.json")
    args = ["cluster", "simulate", "--scheduler", "lyra", *small]
    run = runner.invoke(
        app, [*args, "--gpu-plan", str(tmp_path / "plan.json"), "--peak-rps", "50"]
    )
    assert run.exit_code == 0, run.output
    from cluster.replay import LyraOptions

    demand = {
        rps: LyraOptions(1.0, 600, 0, tmp_path / "plan.json", rps).inference_demand()
        for rps in (5.0, 50.0)
    }
    assert demand[5.0].shape == (24,) and (demand[5.0] % 4 == 0).all()  # whole 4-GPU copies
    assert demand[50.0].max() > demand[5.0].max() and demand[50.0].argmax() >= 19  # evening peak
    for extra, error in (
        (["--gpu-plan", str(tmp_path / "plan.json")], "needs --peak-rps"),
        (["--trace", "elasticVpollux_e"], "its own generated trace on its own clusters"),
    ):
        refused = runner.invoke(app, [*args, *extra])
        assert refused.exit_code == 2 and error in " ".join(refused.output.split()), extra


def test_bench_lyra_measures_the_lead_under_each_assumption() -> None:
    """One row per assumption, each with both schemes' mean JCT and the lead between them."""
    args = ["bench", "lyra", "--days", "1", "--jobs", "1000", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    rows = summary["rows"]
    assert rows[0]["assumptions"] == "as built" and len(rows) == 7
    for row in rows:
        assert row["lead"] == pytest.approx(row["baseline_jct_s"] / row["lyra_jct_s"])
    assert summary["thesis"] == {"baseline_jct_s": 16610, "lyra_jct_s": 11236}
    refused = CliRunner().invoke(app, ["bench", "lyra", "--days", "0"])
    assert refused.exit_code == 2
