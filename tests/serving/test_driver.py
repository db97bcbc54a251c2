"""Driver and monolithic deployments on moto with the real handlers: the same equality, meter,
IAM and fault checks as the fan-out workflow's (`ground.driver`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cdk.app import build_app
from functions.local import run_workflow
from ground.driver import decode_local
from ground.plan import Plan
from moe import MoEModel
from moelambda.cli import app
from pipeline.faults import Faults
from pipeline.stacks import flat_template
from predictor import PredictedCounts

runner = CliRunner()
TOL = 1e-4
EXACT = ("lambda_requests", "s3_put", "s3_get", "s3_list", "s3_delete", "transitions")
TEXT = "A driver runs the attention itself and calls the experts it does not hold."
# Rows past 2 (MiniLM's 1,536 bytes each, base64 in JSON) overflow this payload limit: the
# driver then ships them through S3, so one run exercises both ways.
SMALL_PAYLOAD = 4000


def _counts(tmp: Path) -> Path:
    counts = tmp / "counts.json"
    shares = np.random.default_rng(0).dirichlet(np.ones(4), size=6)
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=256,
        method="test",
        counts=(shares * 512).round(2).tolist(),
    ).save(counts)
    return counts


def _plan(tmp: Path, counts: Path, deployment: str) -> dict[str, Any]:
    out = tmp / f"{deployment}.json"
    made = runner.invoke(
        app,
        ["plan", "--counts", str(counts), "--tokens", "256", "--deployment", deployment]
        + ["--out", str(out), "--force"],
    )
    assert made.exit_code == 0, made.output
    return json.loads(out.read_text())


def _remote(doc: dict[str, Any], layer: int, experts: list[int], replicas: int = 1) -> None:
    """Move `experts` of `layer` from the driver to functions of their own (by hand, as a
    plan with more remote experts would have them)."""
    local = doc["driver"]["local"][layer]
    tokens = doc["driver"]["local_tokens"][layer]
    functions = doc["layers"][layer]["experts"]
    hosted = [e["hosts"][0] for e in functions]
    for i in experts:
        if i in local:
            del tokens[local.index(i)]
            local.remove(i)
            hosted.append(i)
    hosted.sort()
    functions[:] = [
        {
            "expert": slot,
            "hosts": [i],
            "memory_mb": 1536,
            "replicas": replicas,
            "tokens": 10.0,
            "time_s": 0.1,
            "cost_usd": 0.0,
            "max_replicas": 8,
            "max_tokens_per_replica": 100_000,
        }
        for slot, i in enumerate(hosted)
    ]


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A monolithic plan as `plan` makes it, and a driver plan with two layers all remote
    (one at 2 replicas), one half remote, and a payload limit some shards pass."""
    tmp = tmp_path_factory.mktemp("shapes")
    counts = _counts(tmp)
    mono = _plan(tmp, counts, "monolithic")
    driver = _plan(tmp, counts, "driver")
    _remote(driver, 0, [0, 1, 2, 3])
    _remote(driver, 1, [0, 1, 2, 3], replicas=2)
    _remote(driver, 2, [1, 3])
    driver["direct_payload_bytes"] = SMALL_PAYLOAD
    paths = {}
    for name, doc in (("monolithic", mono), ("driver", driver)):
        paths[name] = tmp / f"{name}-edited.json"
        paths[name].write_text(json.dumps(Plan.model_validate(doc).model_dump(mode="json")))
    return paths


@pytest.mark.parametrize("shape", ["monolithic", "driver"])
def test_a_shape_equals_the_monolithic_model_and_bills_what_it_planned(
    shape: str, plans: dict[str, Path]
) -> None:
    result = runner.invoke(
        app, ["run-local", "--plan", str(plans[shape]), "--text", TEXT, "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED", summary["failed"]
    assert summary["deployment"] == shape
    assert summary["max_abs_diff_vs_monolithic"] <= TOL
    assert summary["intermediates_left"] == 0 and summary["access_denied"] == []
    metered, planned = summary["metered"], summary["planned"]
    assert {k: metered[k] for k in EXACT} == {k: planned[k] for k in EXACT}
    assert metered["transitions"] == 1  # one Task: no fan-out
    functions = summary["predicted_vs_measured"]["functions"]
    layers = summary["driver_layers"]
    if shape == "monolithic":
        assert set(functions) == {"driver"} and metered["lambda_requests"] == 1
        assert metered["s3_put"] == 1 and metered["s3_list"] == 0  # the output alone
        assert layers is None  # no layer calls a remote expert
    else:
        # the three layers with remote experts, timed as the model prices them
        assert layers["layers"] == 3 and layers["measured_s"] >= layers["priced_s"] > 0
        assert {"driver", "layer00/expert00", "layer01/expert03"} <= functions.keys()
        # some shards went through S3 (2 PUT + 2 GET each) and were cleaned up
        assert metered["s3_put"] > 1 and metered["s3_delete"] >= 1
        assert 0 < metered["payload_max_bytes"] <= SMALL_PAYLOAD


def _inputs(minilm: MoEModel) -> list[np.ndarray]:
    texts = ["a driver under faults", "must retry throttling and fail cleanly otherwise"]
    return [minilm.tokenizer([t], return_tensors="pt")["input_ids"].numpy() for t in texts]


@pytest.fixture(scope="module")
def driver_template(plans: dict[str, Path]) -> dict[str, Any]:
    out = plans["driver"].parent / "driver.out"
    build_app(plans["driver"], out)
    return flat_template(out, "MoeLambda")


@pytest.mark.usefixtures("no_backoff")
def test_a_throttled_remote_expert_is_retried(
    minilm: MoEModel, weights: Path, driver_template: dict[str, Any]
) -> None:
    inputs = _inputs(minilm)
    result = run_workflow(
        driver_template, weights, inputs, faults=Faults.parse("throttle=0.3", seed=2)
    )
    assert result["faults"].get("throttle", 0) > 0
    for run, ids in zip(result["requests"], inputs, strict=True):
        assert run["status"] == "SUCCEEDED", (run.get("error"), run.get("cause"))
        reference = minilm.forward(torch.from_numpy(ids), reference=True).numpy()
        assert float(np.abs(run["output"] - reference).max()) <= TOL
        assert run["intermediates_left"] == 0


def test_a_crashed_remote_expert_fails_the_request_cleanly(
    minilm: MoEModel, weights: Path, driver_template: dict[str, Any]
) -> None:
    inputs = _inputs(minilm)
    result = run_workflow(
        driver_template, weights, inputs, faults=Faults.parse("expert-crash=0.5", seed=3)
    )
    assert result["faults"]["expert-crash"] > 0
    runs = result["requests"]
    assert any(run["status"] == "FAILED" for run in runs)
    for run in runs:
        if run["status"] == "FAILED":
            assert "process died" in run["cause"]
        assert run["intermediates_left"] == 0  # the driver's overflow shards are gone


def test_the_driver_may_invoke_only_its_own_experts(driver_template: dict[str, Any]) -> None:
    resources = driver_template["Resources"]
    functions = {k: r for k, r in resources.items() if r["Type"] == "AWS::Lambda::Function"}
    (driver,) = [k for k, r in functions.items() if "Driver" in k and "Role" not in k]
    env = functions[driver]["Properties"]["Environment"]["Variables"]
    assert decode_local(env["MOELAMBDA_DRIVER_LOCAL"])[0] == []  # layer 0 is all remote
    experts = {
        k
        for k, r in functions.items()
        if r["Properties"]["ImageConfig"]["Command"] == ["functions.expert.handler"]
    }
    assert len(experts) == 4 + 4 + 2
    role = functions[driver]["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = resources[role]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    (invoke,) = [s for s in statements if s["Action"] == "lambda:InvokeFunction"]
    invoked = {r["Fn::GetAtt"][0] for r in invoke["Resource"]}
    assert invoked == experts
    machines = [r for r in resources.values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    (machine,) = machines
    definition = json.dumps(machine["Properties"]["DefinitionString"])
    assert "Map" not in definition and "Parallel" not in definition  # no fan-out


def test_a_driver_behind_the_front_door_writes_each_request_s_result(
    plans: dict[str, Path], tmp_path: Path
) -> None:
    """The batcher starts the one-state workflow as it starts the fan-out: the driver (here
    holding every expert, the cheapest to run; its remote calls are the tests' above) writes
    each client request's rows to its own result, within its policy, billed as planned."""
    from tests.serving.test_run_local import _with_front_door

    plan = _with_front_door(plans["monolithic"], tmp_path / "traffic-plan.json", 256)
    result = runner.invoke(
        app, ["run-local", "--plan", str(plan), "--front-door", "3", "--tokens", "384", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "SUCCEEDED" and out["errors"] == [] and out["access_denied"] == []
    assert out["executions"] == [["request-0000", "request-0001"], ["request-0002"]]
    assert all(r["max_abs_diff_vs_monolithic"] <= TOL for r in out["requests"])
    assert out["metered_equals_planned"]
    assert out["front_door_metered"]["s3_result_put"] == 3


def test_a_gpu_backed_plan_runs_its_handlers_here_and_equals_the_model(tmp_path: Path) -> None:
    """`plan --traffic --hardware gpu` writes one GPU function holding MiniLM; `run-local` runs
    its real handlers on this machine's CPU at float32 and says so: the output equals the
    model, every billed request the plan's, and the GPU timings are reported as the plan's
    predictions."""
    counts = _counts(tmp_path)
    out = tmp_path / "gpu.json"
    made = runner.invoke(
        app,
        ["plan", "--counts", str(counts), "--traffic", "poisson:0.5"]
        + ["--minutes", "10", "--slo-p99", "30", "--hardware", "gpu", "--out", str(out)]
        + ["--concurrency-quota", "5000"],
    )
    assert made.exit_code == 0, made.output
    plan = Plan.load(out)
    assert plan.traffic is not None and plan.traffic.accelerated
    assert plan.concurrency_quota == 5000  # recorded on a GPU plan too, for synth
    result = runner.invoke(app, ["run-local", "--plan", str(out), "--text", TEXT, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED", summary["failed"]
    assert summary["max_abs_diff_vs_monolithic"] <= TOL
    metered, planned = summary["metered"], summary["planned"]
    assert {k: metered[k] for k in EXACT} == {k: planned[k] for k in EXACT}
    # the GPU function ran here, on the CPU at float32, and the run says so
    assert summary["placement"] == {"driver": {"planned": "cuda bfloat16", "ran": "cpu float32"}}
    gpu = summary["gpu_backed"]
    assert gpu["instance_type"] == plan.traffic.managed_instance_type
    assert gpu["accelerator_gib"]["driver"] == plan.traffic.capacity[0].accelerator_memory_gib
    assert gpu["predicted_request_s"] == plan.totals.latency_s
