"""Smoke tests of every `moelambda bench` command on a small instance: each runs, prints its
JSON contract, and its measured numbers are numbers (the targets are checked by `make bench`
on the full sizes, not here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelambda.cli import app

runner = CliRunner()


def _bench(*args: str) -> dict:
    result = runner.invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def trace16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short 16-expert MiniLM trace: what the planner bench takes its popularity from."""
    out = tmp_path_factory.mktemp("bench") / "t16"
    args = ["profile", "--experts", "16", "--tokens", "2048", "--out", str(out), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_bench_profiler() -> None:
    summary = _bench("profiler", "--tokens", "512", "--repeats", "1")
    assert summary["tokens_per_s"] > 0


def test_bench_predictor(trace16: Path) -> None:
    summary = _bench(
        "predictor", "--traces", str(trace16), "--batches", "1", "--predict-batches", "1"
    )
    assert summary["build_tables_s"] > 0 and summary["table_entries"] > 0
    assert summary["methods"] and all(r["predict_s"] >= 0 for r in summary["methods"].values())
    assert isinstance(summary["meets_targets"], bool)


def test_bench_planner_solvers_agree_on_one_layer(trace16: Path) -> None:
    summary = _bench(
        "planner",
        "--traces",
        str(trace16),
        "--layers",
        "1",
        "--tokens",
        "1024",
        "--time-limit",
        "20",
    )
    assert summary["instance"]["layers"] == 1 and len(summary["slos"]) == 3
    assert summary["exact_target_s"] == 0.25 and summary["exact_speedup_vs_ods"] > 0
    for entry in summary["slos"]:
        exact = entry["solvers"]["exact"]
        assert exact["feasible"] and exact["latency_s"] <= entry["slo_s"] * (1 + 1e-9)
        assert entry["exact_vs_ods"] <= 1 + 1e-9  # never costlier than ODS
        if entry["solvers"]["milp"]["optimal"]:
            assert entry["exact_equals_milp"]
        packed = entry["packed"]
        assert packed["by_size"]["1"] == pytest.approx(exact["cost_usd"], rel=1e-12)
        assert set(packed["by_size"]) == {"1", "2", "4", "8", "16"}
        assert packed["cost_usd"] == min(v for v in packed["by_size"].values() if v is not None)
    assert summary["packed_never_worse"] is True


def test_bench_gpu(trace16: Path) -> None:
    summary = _bench("gpu", "--traces", str(trace16), "--samples", "20")
    assert summary["bvn_makespan_equals_bound"] is True and summary["bvn_samples"] == 20
    ratio = summary["coloc_heuristic_over_opt"]
    assert 1.0 <= ratio["mean"] <= ratio["max"]
    orders = summary["orders"]
    assert set(orders) == {"rank", "sjf", "rcs", "aurora"}
    assert all(orders["aurora"] <= orders[name] * (1 + 1e-9) for name in orders)
