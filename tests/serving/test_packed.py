"""Packed plans (several experts of a layer per function) through the synthesised workflow: the
real handlers compute the monolithic model's output, and the metered requests are the planned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cdk.app import build_app
from ground import layout
from ground.plan import Plan
from moelambda.cli import app
from pipeline import transports
from tests.serving.test_metered import EXACT

runner = CliRunner()
TOL = 1e-4


def _cli(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _packed_plan(model: list[str], tmp_path: Path, pack: str, *methods: str) -> Path:
    """Profile, then plan with `pack` experts per function; `methods` overrides the layers'."""
    traces = tmp_path / "traces"
    _cli("profile", *model, "--tokens", "512", "--out", str(traces))
    plan = tmp_path / "plan.json"
    _cli(
        "plan", "--traces", str(traces), "--tokens", "256", "--pack", pack,
        "--deployment", "workflow", "--out", str(plan),
    )  # fmt: skip
    if methods:
        doc = json.loads(plan.read_text())
        for layer, method in zip(doc["layers"], methods * len(doc["layers"]), strict=False):
            layer["method"], layer["beta"] = method, 4 if method == "pipelined" else 1
        plan.write_text(json.dumps(doc))
    return plan


def _run_local(plan: Path) -> dict[str, Any]:
    summary = _cli("run-local", "--plan", str(plan))
    assert summary["status"] == "SUCCEEDED", summary
    assert summary["max_abs_diff_vs_monolithic"] <= TOL
    assert summary["intermediates_left"] == 0 and summary["access_denied"] == []
    metered, planned = summary["metered"], summary["planned"]
    assert {k: metered[k] for k in EXACT} == {k: planned[k] for k in EXACT}
    assert metered["payload_max_bytes"] <= planned["payload_max_bytes"]
    return summary


@pytest.mark.slow  # MiniLM at 16 experts, every method
def test_minilm_with_16_experts_packed_four_per_function(tmp_path: Path) -> None:
    """Every method, on 4 functions of 4 experts per layer, equals the monolithic model."""
    model = ["--model", "minilm", "--experts", "16"]
    plan = _packed_plan(model, tmp_path, "4", "s3", "pipelined", "direct")
    document = Plan.load(plan)
    assert document.packed
    for layer in document.layers:
        assert [len(e.hosted) for e in layer.experts] == [4] * 4
    assert {layer.method for layer in document.layers} == {"s3", "pipelined", "direct"}
    _run_local(plan)
    template = build_app(plan, tmp_path / "cdk.out").stacks[0].template
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert len(functions) == 2 + 6 + 6 * 4 + 1  # head, tail, gates, packed experts, cleanup


@pytest.mark.parametrize("kind", ["olmoe", "mixtral"])
def test_a_packed_native_moe_model_equals_its_monolithic_forward(
    kind: str, tiny_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The tiny native OLMoE and Mixtral, two experts per function, every method."""
    plan = _packed_plan(["--model", str(tiny_dirs[kind])], tmp_path, "2", "direct", "s3")
    assert Plan.load(plan).packed
    _run_local(plan)


def test_a_function_s_rows_are_its_experts_in_turn_and_gather_undoes_them(s3: object) -> None:
    """The split and the gather of a packed layer, with replicas cutting across experts."""
    from tests.serving.conftest import BUCKET

    rng = np.random.default_rng(0)
    experts = torch.from_numpy(np.argsort(rng.random((40, 6)), axis=1)[:, :2])  # top-2
    hosted = [[0, 3, 5], [1, 2, 4]]
    shards = transports.split_shards(experts, [2, 3], hosted)
    assert [(s.expert, s.replica) for s in shards] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    for slot, members in enumerate(hosted):
        mine = [s for s in shards if s.expert == slot]
        rows = np.concatenate([s.tokens for s in mine])
        per_expert = np.concatenate([np.flatnonzero((experts == m).any(1)) for m in members])
        assert rows.tolist() == per_expert.tolist()  # each expert's tokens, ascending, in turn
        counts = sum(s.hosted_rows for s in mine)
        assert counts.tolist() == [int((experts == m).sum()) for m in members]
        assert all(s.hosted_rows.sum() == s.tokens.size for s in mine)
    # an expert that doubles each row: the gather must put every row back at its token
    weights = np.ones((40, 2), np.float32)
    slot_of = np.array([0, 1, 1, 0, 1, 0])
    routing = layout.routing_key("packed", 0)
    transports.write_tensors(s3, BUCKET, routing, experts.numpy(), weights, slot_of)
    hidden = np.arange(40, dtype=np.float32)[:, None].repeat(3, 1)
    for s in shards:
        expert_ids = np.repeat(np.array(hosted[s.expert]), s.hosted_rows)
        out = hidden[s.tokens] * (1 + expert_ids[:, None])
        key = layout.out_key("packed", 0, s.expert, s.replica)
        transports.write_tensors(s3, BUCKET, key, out.astype(np.float32))
    total = transports.gather(s3, BUCKET, "packed", 0, "s3", 6, 3).numpy()
    expected = hidden * (2 + experts.numpy().sum(1))[:, None]
    assert np.array_equal(total, expected)
    transports.delete_request(s3, BUCKET, "packed")
