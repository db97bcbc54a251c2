"""`moelambda predict`: the JSON contract, the planner's counts file, saved tables, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from moelambda.cli import app
from predictor import PredictedCounts, RoutingTrace

from .synthetic import make_trace

runner = CliRunner()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("predict") / "trace"
    result = runner.invoke(app, ["profile", "--tokens", "2560", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out


def test_json_contract_counts_plot_and_tables(traces: Path, tmp_path: Path) -> None:
    counts, plot, tables = tmp_path / "counts.json", tmp_path / "p.png", tmp_path / "tables"
    args = ["predict", "--traces", str(traces), "--eval-tokens", "512", "--repeats", "2"]
    files = ["--counts-out", str(counts), "--plot", str(plot), "--tables-out", str(tables)]
    result = runner.invoke(app, [*args, *files, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {"bayes", "lina-token", "lina-path", "history"} <= set(summary["methods"])
    assert summary["default"] in summary["methods"]
    for entry in summary["methods"].values():
        assert {
            "mean_abs_diff",
            "topk_accuracy",
            "underestimate_rate",
            "profile_s",
            "predict_s",
            "coverage_90",
            "coverage_99",
            "model_error_per_layer",
        } <= set(entry)
        assert 0 <= entry["topk_accuracy"] <= 1 and entry["mean_abs_diff"] >= 0
        assert 0 <= entry["coverage_90"] <= entry["coverage_99"] <= 1
        assert len(entry["model_error_per_layer"]) == 6
    written = PredictedCounts.load(counts)
    # The distribution rides along: quantiles grow with q; its shape is the residuals'.
    assert written.has_distribution and len(written.model_error) == 6
    low, mid, high = (written.quantile(q) for q in (0.05, 0.5, 0.99))
    assert (low <= mid + 1e-9).all() and (mid <= high + 1e-9).all() and (high > mid).any()
    assert len(written.residual_z) == 24 * 1  # the other repeat's (layer, expert) counts
    normal = written.model_copy(update={"residual_z": None})  # without residuals: the normal's
    assert np.allclose(normal.quantile(0.5), np.clip(written.array(), 0, 512))
    assert written.method == summary["default"] and written.tokens == 512
    assert np.allclose(written.array().sum(axis=1), 512 * 2, atol=0.01)
    assert [sum(row) for row in written.real] == [1024] * 6
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert (tables / "tables.npz").is_file()

    # Saved tables predict batches of the same model; lina-path needs a trace, so it is left out.
    again = runner.invoke(app, [*args, "--tables", str(tables), "--json"])
    assert again.exit_code == 0, again.output
    assert "lina-path" not in json.loads(again.stdout)["methods"]

    # Outputs are never overwritten without --force, and nothing else is written meanwhile.
    before = counts.read_bytes()
    refused = runner.invoke(app, [*args, "--counts-out", str(counts)])
    assert refused.exit_code == 2 and "already exists" in refused.output
    assert counts.read_bytes() == before


def test_bad_input_exits_2(traces: Path, tmp_path: Path) -> None:
    real = RoutingTrace.load(traces)
    tables = tmp_path / "tables8"
    other = make_trace(real.token_ids, real.experts % 2, num_experts=8, window=128, vocab=30522)
    other.meta["model"] = real.meta["model"]
    other.save(tmp_path / "e8")
    ok = runner.invoke(
        app,
        [
            "predict",
            "--traces",
            str(tmp_path / "e8"),
            "--eval-tokens",
            "256",
            "--repeats",
            "1",
            "--tables-out",
            str(tables),
        ],
    )
    assert ok.exit_code == 0, ok.output
    cases = [
        (["--traces", str(traces), "--tables", str(tables)], "experts = 8, but the trace has 4"),
        (["--traces", str(traces), "--eval-tokens", "102400"], "more than the trace holds"),
        (["--traces", str(traces), "--eval-tokens", "2048"], "too few to hold out"),
        (["--traces", str(traces), "--eval-tokens", "200"], "not a whole number"),
        (["--traces", str(traces), "--eval-tokens", "0"], "less than one"),
        (["--traces", str(tmp_path / "none")], "no routing trace"),
        (["--traces", str(traces), "--predictors", "lina"], "no prediction method 'lina'"),
        (["--traces", str(traces), "--methods", "lina"], "--methods is now --predictors"),
        (["--traces", str(traces), "--predictors", "x", "--methods", "y"], "the same option"),
        (
            [
                "--traces",
                str(tmp_path / "e8"),
                "--tables",
                str(tables),
                "--predictors",
                "lina-path",
                "--eval-tokens",
                "256",
            ],
            "lina-path learns from the profiling trace",
        ),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["predict", *args, "--counts-out", str(tmp_path / "c.json")])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
        assert not (tmp_path / "c.json").exists()
