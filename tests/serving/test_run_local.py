"""The synthesised state machine, executed by moto with the real handlers, equals the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cdk.app import build_app
from moe import MoEModel, export_model
from moelambda.cli import app
from pipeline.local import run_workflow
from predictor import PredictedCounts

runner = CliRunner()
METHODS = ["s3", "pipelined", "direct"] * 2
TEXT = "Serverless functions bill by the millisecond, so idle experts cost nothing."


@pytest.fixture(scope="module")
def mixed_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MiniLM plan whose six layers use each method twice, expert 0 with two replicas."""
    tmp = tmp_path_factory.mktemp("plan")
    shares = np.random.default_rng(0).dirichlet(np.ones(4), size=6)
    counts = tmp / "counts.json"
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=256,
        method="test",
        counts=(shares * 512).round(2).tolist(),
    ).save(counts)
    plan = tmp / "plan.json"
    made = runner.invoke(
        app, ["plan", "--counts", str(counts), "--tokens", "256", "--out", str(plan)]
    )
    assert made.exit_code == 0, made.output
    doc = json.loads(plan.read_text())
    for layer, method in zip(doc["layers"], METHODS, strict=True):
        layer["method"], layer["beta"] = method, 4 if method == "pipelined" else 1
        layer["experts"][0]["replicas"] = 2
    plan.write_text(json.dumps(doc))
    return plan


@pytest.fixture(scope="module")
def template(mixed_plan: Path) -> dict[str, Any]:
    return build_app(mixed_plan, mixed_plan.parent / "cdk.out").stacks[0].template


@pytest.fixture(scope="module")
def weights(minilm: MoEModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights") / "w"
    export_model(minilm, root)
    return root


def test_every_method_through_the_synthesised_workflow(mixed_plan: Path) -> None:
    """Eight concurrent executions, every method, replicas > 1: all equal the monolithic model.

    Several executions are not metered: the meter compares one execution with the plan.
    """
    result = runner.invoke(
        app, ["run-local", "--plan", str(mixed_plan), "--text", TEXT, "--requests", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED" and summary["requests"] == 8
    assert summary["metered"] is summary["planned"] is summary["bill"] is None
    assert summary["max_abs_diff_vs_monolithic"] <= 1e-4
    assert summary["intermediates_left"] == 0
    functions = summary["predicted_vs_measured"]["functions"]
    # head, tail, six layer functions, and every expert the request's tokens reached
    assert {"head", "tail", *(f"layer{i:02d}" for i in range(6))} <= functions.keys()
    assert set(functions) == set(summary["per_function_seconds"]) - {"cleanup"}
    for name, entry in functions.items():
        assert entry["calls"] >= 8 or "/expert" in name, name
        if entry["predicted_s"] is not None:
            assert 0 < entry["predicted_s"] < 10 and entry["measured_s"] > 0, (name, entry)
    request = summary["predicted_vs_measured"]["request"]
    assert request["predicted_s"] > functions["head"]["predicted_s"] and request["measured_s"] > 0


@pytest.mark.parametrize("layer", [0, 1, 2], ids=lambda i: METHODS[i])
def test_a_failing_expert_fails_the_execution_with_its_cause_and_no_leftovers(
    layer: int, minilm: MoEModel, weights: Path, template: dict[str, Any], tmp_path: Path
) -> None:
    broken = tmp_path / "weights"
    shutil.copytree(weights, broken)
    missing = broken / "layers" / f"{layer:02d}" / "experts" / "01.safetensors"
    missing.unlink()
    ids = minilm.tokenizer(["a request that reaches every expert"], return_tensors="pt")
    ids = ids["input_ids"].numpy()
    (run,) = run_workflow(template, broken, [ids], timeout_s=120)["requests"]
    assert run["status"] == "FAILED"
    assert run["error"] == ("ModelError" if METHODS[layer] == "direct" else "ExpertFailed")
    assert f"weights/layers/{layer:02d}/experts/01.safetensors is missing" in run["cause"]
    assert run["intermediates_left"] == 0


@pytest.mark.parametrize("extra", [["--tokens", "256"], ["--corpus", "wiki"]])
def test_text_and_a_corpus_batch_are_exclusive(extra: list[str], tmp_path: Path) -> None:
    """One window of --text or a batch of --tokens from --corpus: asking for both is an error."""
    result = runner.invoke(
        app, ["run-local", "--plan", str(tmp_path / "absent.json"), "--text", TEXT, *extra]
    )
    assert result.exit_code == 2
    assert "--text runs one window" in result.output


def test_concurrent_requests_get_their_own_keys_and_their_own_outputs(
    minilm: MoEModel, weights: Path, template: dict[str, Any]
) -> None:
    """Two different inputs at once through the template's workflow: the workflow gives each
    execution its own request id (the hash of its ARN), whatever the caller sends, and each
    gets its own input's output; nothing is left behind."""
    texts = ["the first request", "a second, quite different request about rivers"]
    inputs = [minilm.tokenizer([t], return_tensors="pt")["input_ids"].numpy() for t in texts]
    runs = run_workflow(template, weights, inputs, timeout_s=120)["requests"]
    assert [r["status"] for r in runs] == ["SUCCEEDED", "SUCCEEDED"]
    assert runs[0]["request_id"] != runs[1]["request_id"]
    for run, ids in zip(runs, inputs, strict=True):
        reference = minilm.forward(torch.from_numpy(ids), reference=True).numpy()
        assert run["output"].shape == reference.shape
        assert float(np.abs(run["output"] - reference).max()) <= 1e-4
        assert run["intermediates_left"] == 0
