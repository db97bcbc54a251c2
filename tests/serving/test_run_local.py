"""`moelambda run-local`: the synthesised state machine, executed by moto, equals the model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from moelambda.cli import app
from predictor import PredictedCounts

runner = CliRunner()


def test_every_method_through_the_synthesised_workflow(tmp_path: Path) -> None:
    shares = np.random.default_rng(0).dirichlet(np.ones(4), size=6)
    counts = tmp_path / "counts.json"
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=256,
        method="test",
        counts=(shares * 512).round(2).tolist(),
    ).save(counts)
    plan = tmp_path / "plan.json"
    made = runner.invoke(
        app, ["plan", "--counts", str(counts), "--tokens", "256", "--out", str(plan)]
    )
    assert made.exit_code == 0, made.output
    doc = json.loads(plan.read_text())
    for layer, method in zip(doc["layers"], ["s3", "pipelined", "direct"] * 2, strict=True):
        layer["method"], layer["beta"] = method, 4 if method == "pipelined" else 1
        layer["experts"][0]["replicas"] = 2
    plan.write_text(json.dumps(doc))

    result = runner.invoke(app, ["run-local", "--plan", str(plan), "--requests", "2", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED" and summary["requests"] == 2
    assert summary["max_abs_diff_vs_monolithic"] <= 1e-4
    assert summary["intermediates_left"] == 0
    assert len(summary["per_function_seconds"]) == 1 + 6 * 5 + 1  # head, layers+experts, tail
