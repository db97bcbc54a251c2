"""A metered run of a 2,560-token batch makes exactly the billed requests the plan predicts.

Each test runs the synthesised workflow once on moto with warm functions (`run_workflow(...,
metered=True)`) and sets the meter against `planner.evaluate_plan` for the batch's real routing.
Requests and transitions of a successful run do not depend on timing, so they must be equal;
polls and GB-seconds do, and are only checked for being there.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cdk._functions import FunctionOptions
from cdk.app import build_app
from functions.local import run_workflow
from ground.manifest import Manifest
from ground.method import Method
from ground.plan import Plan
from ground.semantics import USAGE_KEYS, max_direct_tokens, request_counts, runtime_replicas
from moe import MoEModel, load_corpus, make_windows
from moelambda.cli import app
from pipeline.local import atomic_s3
from pipeline.meter import Meter
from pipeline.stacks import flat_template
from planner import evaluate_plan
from predictor import PredictedCounts

runner = CliRunner()
# 20 windows of 128 tokens: about 1,280 rows per expert per layer, so every method spreads
# over replicas; counts are exact at any size (the 10,240-token batch of `run-local`'s default
# took four times as long and checked nothing more).
TOKENS = 2_560
BETA = 128  # pipelined minibatch: ~5 per busy replica, enough to pipeline, few requests
TOL = 1e-4
EXACT = ("lambda_requests", "s3_put", "s3_get", "s3_list", "s3_delete", "transitions")
MIXED = ["s3", "pipelined", "direct"] * 2
NESTED = "AWS::CloudFormation::Stack"


@pytest.fixture(scope="module")
def batch(minilm: MoEModel) -> np.ndarray:
    """The request: 20 windows of 128 tokens, as `run-local` cuts them."""
    return make_windows(load_corpus("wiki"), minilm.tokenizer, tokens=TOKENS, window=128, seed=0)


@pytest.fixture(scope="module")
def monolithic(minilm: MoEModel, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monolithic forward's output, and its routing counts (layers, experts)."""
    routing: list = []
    output = minilm.forward(torch.from_numpy(batch), reference=True, routing=routing).numpy()
    counts = np.stack([np.bincount(r.experts.reshape(-1), minlength=4) for r in routing])
    return output, counts


@pytest.fixture(scope="module")
def base_plan(
    monolithic: tuple[np.ndarray, np.ndarray], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """`moelambda plan` for this batch's real counts, as a document to edit by hand."""
    tmp = tmp_path_factory.mktemp("plan")
    counts = tmp / "counts.json"
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=TOKENS,
        method="test",
        counts=monolithic[1].astype(float).tolist(),
    ).save(counts)
    plan = tmp / "plan.json"
    made = runner.invoke(
        app,
        [
            "plan",
            "--counts",
            str(counts),
            "--tokens",
            str(TOKENS),
            "--pack",
            "1",
            "--deployment",
            "workflow",
            "--out",
            str(plan),
        ],
    )
    assert made.exit_code == 0, made.output
    return json.loads(plan.read_text())


def _plan(base: dict[str, Any], methods: list[str], path: Path) -> Path:
    """`base` with these methods, experts 0 and 2 of every layer on two replicas or more.

    A direct expert takes at most what one Invoke carries, so it gets the replicas its tokens
    need; the reserved concurrency (max_replicas) covers the replicas.
    """
    doc = copy.deepcopy(base)
    model = doc["model"]
    fits = max_direct_tokens(
        doc["direct_payload_bytes"], max(model["token_bytes_in"], model["token_bytes_out"])
    )
    for layer, method in zip(doc["layers"], methods, strict=True):
        layer["method"], layer["beta"] = method, BETA if method == "pipelined" else 1
        for e in layer["experts"]:
            if method == "direct":
                e["max_tokens_per_replica"] = min(e["max_tokens_per_replica"], fits)
            need = math.ceil(math.ceil(e["tokens"]) / e["max_tokens_per_replica"])
            e["replicas"] = max(e["replicas"], need, 2 if e["expert"] in (0, 2) else 1)
            e["max_replicas"] = max(e["max_replicas"], e["replicas"])
    path.write_text(json.dumps(doc))
    Plan.load(path)  # still a deployable plan
    return path


def _run(plan: Path, exported: tuple[Path, Manifest], batch: np.ndarray) -> dict[str, Any]:
    template = build_app(plan, plan.parent / "cdk.out").stacks[0].template
    result = run_workflow(template, exported[0], [batch], metered=True)
    (run,) = result["requests"]
    assert run["status"] == "SUCCEEDED", (run.get("error"), run.get("cause"))
    assert run["intermediates_left"] == 0
    return result


@pytest.mark.parametrize("method", ["s3", "pipelined", "direct"])
def test_a_metered_batch_makes_the_planned_requests(
    method: str,
    base_plan: dict[str, Any],
    exported: tuple[Path, Manifest],
    batch: np.ndarray,
    monolithic: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    """Every layer one method, some experts on 2+ replicas: requests and states as planned."""
    plan = _plan(base_plan, [method] * 6, tmp_path / "plan.json")
    result = _run(plan, exported, batch)

    output, counts = monolithic
    (run,) = result["requests"]
    assert float(np.abs(run["output"] - output).max()) <= TOL
    metered = result["usage"]
    planned = evaluate_plan(Plan.load(plan), exported[1], counts, TOKENS).usage
    assert {k: metered[k] for k in EXACT} == {k: planned[k] for k in EXACT}
    assert 0 < metered["experts_gb_s"] < metered["gb_s"]
    if method == "pipelined":  # each replica reads its done.bin at least once
        assert metered["s3_get_poll"] >= sum(
            e.replicas for layer in Plan.load(plan).layers for e in layer.experts
        )
    else:
        assert metered["s3_get_poll"] == 0
    if method == "direct":  # a real event, within the planned bound and the Invoke limit
        assert 0 < metered["payload_max_bytes"] <= planned["payload_max_bytes"] <= 6 * 2**20
    else:
        assert metered["payload_max_bytes"] == planned["payload_max_bytes"] == 0


def test_run_local_meters_and_prices_a_mixed_plan(
    base_plan: dict[str, Any],
    exported: tuple[Path, Manifest],
    monolithic: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    """`run-local --json` on every method at once: metered and planned usage, both bills."""
    plan = _plan(base_plan, MIXED, tmp_path / "plan.json")
    result = runner.invoke(
        app, ["run-local", "--plan", str(plan), "--json"]
    )  # the plan's batch: TOKENS
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED" and summary["tokens"] == TOKENS
    assert summary["max_abs_diff_vs_monolithic"] <= TOL
    assert summary["intermediates_left"] == 0
    metered, planned = summary["metered"], summary["planned"]
    assert set(metered) == set(planned) == set(USAGE_KEYS)
    assert {k: metered[k] for k in EXACT} == {k: planned[k] for k in EXACT}
    expected = evaluate_plan(Plan.load(plan), exported[1], monolithic[1], TOKENS)
    assert planned == pytest.approx(expected.usage)
    bill = summary["bill"]
    assert set(bill["planned"]) == set(bill["metered"]) and "total_usd" in bill["metered"]
    for side in bill.values():
        assert side["total_usd"] == pytest.approx(
            sum(v for k, v in side.items() if k != "total_usd")
        )
        assert side["total_usd"] > 0
    # What the numbers mean: requests exact, GB-seconds this machine's, a ratio per function.
    block = summary["metering"]
    assert block["requests_equal_planned"] and block["requests_differing"] == {}
    assert block["gb_s"]["measured_here"] == pytest.approx(metered["gb_s"], abs=1e-3)
    assert block["lines"][0].startswith("requests metered = planned (exact)")
    assert "GB-seconds measured on this machine" in block["lines"][1]
    functions = summary["predicted_vs_measured"]["functions"]
    ratios = {n: e["measured_over_predicted"] for n, e in functions.items()}
    assert ratios["head"] > 0 and all(r > 0 for r in block["measured_over_predicted_s"].values())
    assert block["measured_over_predicted_s"] == {n: r for n, r in ratios.items() if r is not None}


def test_an_expert_busier_than_its_replicas_take_gets_more_of_them(
    base_plan: dict[str, Any],
    exported: tuple[Path, Manifest],
    batch: np.ndarray,
    monolithic: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    """An s3 expert planned on one replica whose tokens need six: the gate spreads them.

    The meter sees more requests than the plan's replicas make, as many as the planned usage
    of the runtime replicas.
    """
    output, counts = monolithic
    doc = json.loads(_plan(base_plan, ["s3"] * 6, tmp_path / "plan.json").read_text())
    busy = int(np.argmin(counts[0]))
    per_replica = -(-int(counts[0, busy]) // 6)
    doc["layers"][0]["experts"][busy].update(
        replicas=1, max_replicas=8, max_tokens_per_replica=per_replica
    )
    plan = tmp_path / "busy.json"
    plan.write_text(json.dumps(doc))
    document = Plan.load(plan)
    replicas = np.array([[e.replicas for e in layer.experts] for layer in document.layers])
    first = document.layers[0].experts
    spread = runtime_replicas(
        counts[0],
        replicas[0],
        np.array([e.max_replicas for e in first]),
        np.array([e.max_tokens_per_replica for e in first]),
    )
    assert spread[busy] > 1 and (np.delete(spread, busy) == np.delete(replicas[0], busy)).all()

    result = _run(plan, exported, batch)

    (run,) = result["requests"]
    assert float(np.abs(run["output"] - output).max()) <= TOL
    metered = result["usage"]
    as_planned = request_counts([Method.S3] * 6, [1] * 6, counts, replicas)
    assert metered["lambda_requests"] == as_planned.lambda_requests + spread[busy] - 1
    planned = evaluate_plan(document, exported[1], counts, TOKENS).usage
    assert {k: metered[k] for k in EXACT} == {k: planned[k] for k in EXACT}


@pytest.mark.parametrize("addressing", ["virtual", "path"])
def test_the_meter_counts_its_buckets_s3_requests_by_billed_type(addressing: str) -> None:
    """PUT; GET and HEAD of data; polls (a miss, a done.bin); LIST; DELETE. Not other buckets'.

    The hook wraps moto's stubber beside `atomic_s3`'s patch and is gone after the block.
    """
    import boto3
    from botocore.config import Config
    from moto import mock_aws
    from moto.core.botocore_stubber import BotocoreStubber

    original = BotocoreStubber.__call__
    meter = Meter("metered")
    with mock_aws(), atomic_s3():
        config = Config(s3={"addressing_style": addressing})
        s3 = boto3.client("s3", region_name="us-east-1", config=config)
        for bucket in ("metered", "other"):
            s3.create_bucket(Bucket=bucket)
        with meter.counting_s3():
            for bucket in ("metered", "other"):
                s3.put_object(Bucket=bucket, Key="r/a.bin", Body=b"a")
                s3.put_object(Bucket=bucket, Key="r/done.bin", Body=b"d")
                s3.get_object(Bucket=bucket, Key="r/a.bin")["Body"].read()
                s3.head_object(Bucket=bucket, Key="r/a.bin")
                s3.get_object(Bucket=bucket, Key="r/done.bin")["Body"].read()
                with pytest.raises(s3.exceptions.NoSuchKey):
                    s3.get_object(Bucket=bucket, Key="r/missing.bin")
                s3.list_objects_v2(Bucket=bucket, Prefix="r/")
                s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "r/a.bin"}]})
        s3.get_object(Bucket="metered", Key="r/done.bin")  # after the block: not counted
        assert BotocoreStubber.__call__ is original
    s3_keys = {"s3_put": 2, "s3_get": 2, "s3_get_poll": 2, "s3_list": 1, "s3_delete": 1}
    assert meter.usage() == dict.fromkeys(USAGE_KEYS, 0) | s3_keys


def test_a_plan_split_into_nested_stacks_runs_as_one_and_meters_as_planned(
    base_plan: dict[str, Any],
    exported: tuple[Path, Manifest],
    batch: np.ndarray,
    monolithic: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    """Expert functions in nested stacks of at most 8 (whole layers: three stacks of two
    layers): the parent reads their names and ARNs from the nested outputs, they read the
    bucket from their parameters; run as one workflow, it equals the monolithic model."""
    plan = _plan(base_plan, MIXED, tmp_path / "plan.json")
    out = tmp_path / "cdk.out"
    build_app(plan, out, options=FunctionOptions(experts_per_stack=8))
    parent = json.loads((out / "MoeLambda.template.json").read_text())
    nested = [r for r in parent["Resources"].values() if r["Type"] == NESTED]
    assert len(nested) == 3
    in_parent = [
        r["Properties"]["Description"]
        for r in parent["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
    ]
    assert len(in_parent) == 6 + 3 and not any("Expert" in d for d in in_parent)
    template = flat_template(out, "MoeLambda")
    assert not any(r["Type"] == NESTED for r in template["Resources"].values())
    result = run_workflow(template, exported[0], [batch], metered=True)
    (run,) = result["requests"]
    assert run["status"] == "SUCCEEDED", (run.get("error"), run.get("cause"))
    assert run["intermediates_left"] == 0 and result["denied"] == []
    output, counts = monolithic
    assert float(np.abs(run["output"] - output).max()) <= TOL
    planned = evaluate_plan(Plan.load(plan), exported[1], counts, TOKENS).usage
    assert {k: result["usage"][k] for k in EXACT} == {k: planned[k] for k in EXACT}
