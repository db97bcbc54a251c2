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

from functions.local import run_workflow
from moe import MoEModel
from moelambda.cli import app
from tests.serving.conftest import METHODS

runner = CliRunner()
TEXT = "Serverless functions bill by the millisecond, so idle experts cost nothing."


def test_every_method_through_the_synthesised_workflow(mixed_plan: Path) -> None:
    """Eight concurrent executions, every method, replicas > 1: all equal the monolithic model.

    Several executions are not metered: the meter compares one execution with the plan.
    """
    result = runner.invoke(
        app, ["run-local", "--plan", str(mixed_plan), "--text", TEXT, "--requests", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED" and summary["requests"] == summary["succeeded"] == 8
    assert summary["failed"] == [] and summary["wall_s"] > 0 and summary["faults_injected"] == {}
    assert summary["metered"] is summary["planned"] is summary["bill"] is None
    assert summary["max_abs_diff_vs_monolithic"] <= 1e-4
    assert summary["intermediates_left"] == 0
    assert summary["access_denied"] == []  # every request within its function's policy
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


def test_run_local_with_faults_reports_every_request(mixed_plan: Path) -> None:
    """--faults through the command: crashes fail their requests with the cause named (exit 1),
    the rest succeed, nothing is left; a bad spec is refused before anything runs."""
    args = ["run-local", "--plan", str(mixed_plan), "--text", TEXT, "--requests", "3", "--json"]
    result = runner.invoke(app, [*args, "--faults", "expert-crash=0.3,duplicate=0.2"])
    summary = json.loads(result.stdout)
    assert result.exit_code == (1 if summary["failed"] else 0)
    assert summary["succeeded"] + len(summary["failed"]) == 3
    assert summary["faults_injected"].get("expert-crash", 0) >= len(summary["failed"]) > 0
    assert all("process died" in f["cause"] for f in summary["failed"])
    assert summary["intermediates_left"] == 0 and summary["metered"] is None
    bad = runner.invoke(app, [*args, "--faults", "meteor=0.1"])
    assert bad.exit_code == 2 and "unknown fault 'meteor'" in bad.output


@pytest.mark.slow  # a load test: 16 at once
def test_concurrent_requests_all_succeed_with_their_own_keys(
    minilm: MoEModel, weights: Path, template: dict[str, Any]
) -> None:
    """Load: 16 different short requests at once through every method: all correct, 16
    distinct request ids, nothing left behind. (`make bench` runs 64 at once: 2-3 minutes on
    this 2-core machine, too long for the suite.)"""
    words = TEXT.split()
    texts = [" ".join(words[i % len(words) :] + words[: i % len(words)]) for i in range(16)]
    inputs = [minilm.tokenizer([t], return_tensors="pt")["input_ids"].numpy() for t in texts]
    runs = run_workflow(template, weights, inputs, timeout_s=600)["requests"]
    assert [r["status"] for r in runs] == ["SUCCEEDED"] * 16
    assert len({r["request_id"] for r in runs}) == 16
    for run, ids in zip(runs, inputs, strict=True):
        reference = minilm.forward(torch.from_numpy(ids), reference=True).numpy()
        assert float(np.abs(run["output"] - reference).max()) <= 1e-4
        assert run["intermediates_left"] == 0


def _with_front_door(plan: Path, out: Path, max_tokens: int) -> Path:
    """`plan` with the traffic block `plan --traffic` would add: a batch policy, no capacity."""
    from ground.plan import Plan
    from tests.traffic.plans import with_traffic

    served = with_traffic(Plan.load(plan), max_batch_tokens=max_tokens, max_wait_s=1.0)
    return served.save(out)


def test_run_local_through_the_front_door(mixed_plan: Path, tmp_path: Path) -> None:
    """--front-door 3: three 128-token requests reach the queue at once; the batcher starts
    one execution of the first two (256 tokens, the policy's cap) and one of the third. Every
    request gets its own rows of the monolithic output, and the front door bills as planned."""
    plan = _with_front_door(mixed_plan, tmp_path / "traffic-plan.json", 256)
    result = runner.invoke(
        app, ["run-local", "--plan", str(plan), "--front-door", "3", "--tokens", "384", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "SUCCEEDED" and out["errors"] == [] and out["access_denied"] == []
    assert out["executions"] == [["request-0000", "request-0001"], ["request-0002"]]
    assert [r["execution"] for r in out["requests"]] == [0, 0, 1]
    assert [r["tokens"] for r in out["requests"]] == [128, 128, 128]
    assert all(r["max_abs_diff_vs_monolithic"] <= 1e-4 for r in out["requests"])
    assert out["metered_equals_planned"]
    assert out["front_door_planned"]["sqs_send_requests"] == 3
    assert out["front_door_planned"]["batcher_invocations"] == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "has no front door"),
        (["--requests", "2"], "--front-door sends one batch"),
        (["--front-door", "0"], "--front-door 0 is below 1"),
    ],
)
def test_run_local_front_door_refusals(mixed_plan: Path, extra: list[str], message: str) -> None:
    args = ["run-local", "--plan", str(mixed_plan), "--front-door", "2", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
