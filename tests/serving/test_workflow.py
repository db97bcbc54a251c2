"""The handlers chained like the state machine, on moto S3, against the monolithic forward."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from functions import expert
from functions.layer import CapacityError
from functions.local import run_workflow
from ground.errors import ModelError, UsageError
from ground.method import Method
from ground.semantics import request_counts, runtime_replicas
from moe import Manifest, MoEModel
from pipeline import transports
from pipeline.tensorio import encode
from tests.cdk.test_stack import make_plan, model_ref
from tests.serving.conftest import BUCKET
from tests.serving.driver import Deployment, call, clean, run_request

TOL = 1e-4
# Several replicas for experts 0 and 2, so the gatherer must undo the replica split.
REPLICAS = [2, 1, 3, 1]


def _deployment(manifest: Manifest, methods: list[str], beta: int = 16) -> Deployment:
    return Deployment(BUCKET, methods, beta, [REPLICAS] * manifest.num_layers)


def _reference(minilm: MoEModel, ids: np.ndarray) -> np.ndarray:
    return minilm.forward(torch.from_numpy(ids), reference=True).numpy()


def _leftovers(s3: object) -> list[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="requests/")  # type: ignore[attr-defined]
    return [obj["Key"] for obj in listed.get("Contents", [])]


@pytest.mark.parametrize("method", ["s3", "pipelined", "direct"])
def test_each_method_equals_the_monolithic_forward(
    method: str,
    minilm: MoEModel,
    wiki_windows: np.ndarray,
    exported: tuple[Path, Manifest],
    s3: object,
) -> None:
    _, manifest = exported
    ids = wiki_windows[:2]  # 256 tokens: about 128 rows per expert, 8 minibatches of 16
    dep = _deployment(manifest, [method] * manifest.num_layers)
    results: list[dict] = []
    output = run_request(dep, s3, f"one-{method}", ids, results)
    difference = float(np.abs(output - _reference(minilm, ids)).max())
    print(f"\nmethod {method}: max abs diff {difference:.3g}")
    assert output.shape == (2, manifest.hidden_size)
    fanned_out = sum(r["tokens"] for r in results)
    assert fanned_out == (0 if method == "direct" else ids.size * manifest.top_k * 6)
    if method == "pipelined":  # every (expert, replica) ran, most over several minibatches
        assert len(results) == sum(REPLICAS) * manifest.num_layers
        assert np.median([r["minibatches"] for r in results]) >= 3
    assert difference <= TOL
    assert _leftovers(s3) == []


def test_concurrent_requests_do_not_collide(
    minilm: MoEModel,
    wiki_windows: np.ndarray,
    exported: tuple[Path, Manifest],
    s3: object,
) -> None:
    """Eight requests at once through a plan mixing all three methods, each on its own text."""
    _, manifest = exported
    methods = ["s3", "pipelined", "direct"] * (manifest.num_layers // 3)
    dep = _deployment(manifest, methods, beta=8)
    # wiki_windows holds 4 windows: vary the window, the offset and the length per request.
    windows = [
        wiki_windows[i % 4 : i % 4 + 1, 8 * (i // 4) : 8 * (i // 4) + 16 + 2 * i] for i in range(8)
    ]
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda i: run_request(dep, s3, f"req-{i}", windows[i]), range(8)))
    differences = [
        float(np.abs(out - _reference(minilm, ids)).max())
        for out, ids in zip(outputs, windows, strict=True)
    ]
    print(f"\n8 concurrent, mixed methods: max abs diff {max(differences):.3g}")
    assert max(differences) <= TOL
    assert _leftovers(s3) == []
    assert {f"outputs/req-{i}.bin" for i in range(8)} <= {
        obj["Key"] for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix="outputs/")["Contents"]
    }


def test_missing_expert_weights_fail_clearly_and_cleanup_removes_intermediates(
    wiki_windows: np.ndarray, exported: tuple[Path, Manifest], s3: object
) -> None:
    root, manifest = exported
    for name in ["manifest.json", *(f"config/{p.name}" for p in (root / "config").iterdir())]:
        s3.upload_file(str(root / name), BUCKET, "partial/" + name)
    dep = _deployment(manifest, ["s3"] * manifest.num_layers)
    dep.expert_env[(1, 2)] = {"MOELAMBDA_WEIGHTS_PREFIX": "partial/"}
    with pytest.raises(ModelError, match="partial/layers/01/experts/02.safetensors"):
        run_request(dep, s3, "broken", wiki_windows[:1, :32])
    assert _leftovers(s3)  # the failed request left its intermediates behind
    assert clean(dep, "broken")["deleted"] > 0
    assert _leftovers(s3) == []


def test_oversized_direct_payload_is_refused_before_any_invocation(s3: object) -> None:
    ffn_in = np.ones((64, 384), np.float32)
    experts = torch.zeros(64, 1, dtype=torch.int64)
    shards = transports.split_shards(experts, [1, 1])

    def invoke(function: str, payload: dict) -> dict:
        raise AssertionError("nothing may be invoked when a payload is too large")

    with pytest.raises(transports.TransportError, match="above the plan's direct payload limit"):
        transports.call_direct(s3, BUCKET, "big", 0, ffn_in, shards, ["f0", "f1"], invoke, 65536)


def test_expert_refuses_an_event_for_another_expert(exported: object, s3: object) -> None:
    env = {
        "MOELAMBDA_BUCKET": BUCKET,
        "MOELAMBDA_LAYER": "0",
        "MOELAMBDA_EXPERT": "1",
        "MOELAMBDA_METHOD": "s3",
    }
    event = {"request_id": "r", "layer": 0, "expert": 3, "replica": 0}
    with pytest.raises(Exception, match="expert 3 reached the function of layer 0 expert 1"):
        call(expert.handler, env, event)


def _counts(model: MoEModel, ids: np.ndarray) -> np.ndarray:
    """Tokens per (layer, expert) of the request's real routing."""
    routing: list = []
    model.forward(torch.from_numpy(ids), reference=True, routing=routing)
    return np.stack(
        [np.bincount(r.experts.reshape(-1).numpy(), minlength=model.experts) for r in routing]
    )


def test_gate_spreads_a_busy_expert_over_more_replicas_within_its_cap(
    minilm: MoEModel, wiki_windows: np.ndarray, exported: tuple[Path, Manifest], s3: object
) -> None:
    _, manifest = exported
    ids = wiki_windows[:1]  # 128 tokens, 256 routed: about 64 per expert
    layers, experts = manifest.num_layers, manifest.experts
    methods = ["s3", "direct"] * (layers // 2)
    dep = Deployment(BUCKET, methods, 16, [REPLICAS] * layers)
    dep.max_replicas = [[8] * experts] * layers
    dep.max_tokens = [[20] * experts] * layers
    results: list[dict] = []
    output = run_request(dep, s3, "spread", ids, results)
    assert float(np.abs(output - _reference(minilm, ids)).max()) <= TOL
    counts = _counts(minilm, ids)
    expected = [
        runtime_replicas(counts[e], np.array(REPLICAS), np.full(experts, 8), np.full(experts, 20))
        for e in range(0, layers, 2)
    ]
    # every s3 shard was invoked, more than the plan's replicas; each holds at most 20 tokens
    assert len(results) == sum(int(r.sum()) for r in expected) > sum(REPLICAS) * len(expected)
    assert max(r["tokens"] for r in results) <= 20
    assert _leftovers(s3) == []


def test_gate_refuses_a_batch_over_its_reserved_replicas_before_scattering(
    wiki_windows: np.ndarray, exported: tuple[Path, Manifest], s3: object
) -> None:
    _, manifest = exported
    dep = Deployment(BUCKET, ["s3"] * manifest.num_layers, 16, [REPLICAS] * manifest.num_layers)
    dep.max_tokens = [[4] * manifest.experts] * manifest.num_layers
    with pytest.raises(CapacityError, match=r"layer 0 cannot take this batch \(s3\): expert \d: "):
        run_request(dep, s3, "over", wiki_windows[:1, :32])
    assert _leftovers(s3) == ["requests/over/head.bin"]
    clean(dep, "over")


@pytest.mark.parametrize("workflow", ["standard", "express"])
def test_the_synthesised_workflow_does_what_the_planner_bills(
    workflow: str,
    minilm: MoEModel,
    wiki_windows: np.ndarray,
    exported: tuple[Path, Manifest],
    tmp_path: Path,
) -> None:
    """The template's definition on moto: states entered, Lambda and S3 requests as counted.

    Every method, twice; experts with two replicas; an s3 layer whose gate adds replicas for
    the real counts. The weights are warm (cached), as in a warm container. An Express
    workflow enters the same states (moto runs it the same way and keeps its history).
    """
    from cdk.app import build_app

    _, manifest = exported
    ids = wiki_windows[:1, :48]
    counts = _counts(minilm, ids)
    layers, experts = manifest.num_layers, manifest.experts
    methods = ["s3", "pipelined", "direct"] * (layers // 3)
    replicas = [[2, 1, 1, 2] if e % 2 == 0 else [1, 2, 1, 1] for e in range(layers)]
    max_replicas = [list(r) for r in replicas]
    max_tokens = [[1000] * experts for _ in range(layers)]
    max_replicas[0], max_tokens[0] = [4] * experts, [-(-int(c) // 3) or 1 for c in counts[0]]
    plan = make_plan(
        model_ref(manifest),
        methods,
        replicas,
        max_replicas=max_replicas,
        max_tokens=max_tokens,
        beta=8,
        workflow=workflow,
        direct_payload_bytes=6 * 1024 * 1024,
    )
    template = build_app(plan.save(tmp_path / "plan.json"), tmp_path / "cdk.out")
    template = template.stacks[0].template

    result = run_workflow(template, exported[0], [ids], metered=True)

    (run,) = result["requests"]
    assert run["status"] == "SUCCEEDED", run.get("cause")
    assert float(np.abs(run["output"] - _reference(minilm, ids)).max()) <= TOL
    assert run["intermediates_left"] == 0
    used = np.array(
        [
            runtime_replicas(counts[e], np.array(replicas[e]), cap, per)
            if methods[e] != "pipelined"
            else np.array(replicas[e])
            for e, (cap, per) in enumerate(zip(max_replicas, max_tokens, strict=True))
        ]
    )
    assert (used[0] > np.array(replicas[0]))[counts[0] >= 3].all()  # the gate adapted
    billed = request_counts([Method.parse(m) for m in methods], [8] * layers, counts, used)
    metered = result["usage"]
    polls = metered["s3_get_poll"]
    assert {k: metered[k] for k in billed.as_dict() if k != "s3_get_poll"} == {
        k: v for k, v in billed.as_dict().items() if k != "s3_get_poll"
    }
    pipelined = sum(sum(replicas[e]) for e in range(layers) if methods[e] == "pipelined")
    assert polls >= 2 * pipelined  # each replica's last miss and its read of done.bin


@pytest.mark.parametrize("method", ["s3", "pipelined", "direct"])
def test_a_second_delivery_of_every_invocation_changes_nothing(
    method: str,
    minilm: MoEModel,
    wiki_windows: np.ndarray,
    exported: tuple[Path, Manifest],
    s3: object,
) -> None:
    """Lambda delivers at least once: every handler, run again on the same event after the
    first returned (the tail after it deleted the intermediates), returns the same result and
    leaves the same output."""
    _, manifest = exported
    ids = wiki_windows[:1, :32]
    dep = _deployment(manifest, [method] * manifest.num_layers)
    output = run_request(dep, s3, f"twice-{method}", ids, duplicate=True)
    assert float(np.abs(output - _reference(minilm, ids)).max()) <= TOL
    assert _leftovers(s3) == []


def test_the_head_reads_only_its_own_execution_s_input(
    minilm: MoEModel, wiki_windows: np.ndarray, exported: tuple[Path, Manifest], s3: object
) -> None:
    """Inline ids and `inputs/<execution name>.bin` give the same hidden state; a name that
    could reach another key is refused before anything is read; a caller's key is ignored."""
    from functions import head
    from ground import layout

    _, manifest = exported
    dep = _deployment(manifest, ["s3"] * manifest.num_layers)
    ids = wiki_windows[:1, :16]
    s3.put_object(  # type: ignore[attr-defined]
        Bucket=BUCKET, Key=layout.input_key("mine"), Body=encode(ids)
    )
    s3.put_object(  # type: ignore[attr-defined]
        Bucket=BUCKET, Key=layout.input_key("theirs"), Body=encode(ids[:, :8])
    )
    by_key = call(
        head.handler,
        dep.env(),
        {"request_id": "a", "execution": "mine", "input": {"input_key": "inputs/theirs.bin"}},
    )
    inline = call(
        head.handler,
        dep.env(),
        {"request_id": "b", "execution": "x", "input": {"input_ids": ids.tolist()}},
    )
    first = transports.read_tensors(s3, BUCKET, by_key["hidden_key"])[0]
    second = transports.read_tensors(s3, BUCKET, inline["hidden_key"])[0]
    assert first.shape[1] == 16 and np.array_equal(first, second)
    for name in ("../theirs", "a/b", ""):
        with pytest.raises(UsageError, match="invalid execution name"):
            call(head.handler, dep.env(), {"request_id": "c", "execution": name, "input": {}})
    with pytest.raises(UsageError, match="input_ids must be"):
        call(
            head.handler,
            dep.env(),
            {"request_id": "d", "execution": "x", "input": {"input_ids": [1, 2]}},
        )
    for rid in "ab":
        clean(dep, rid)
