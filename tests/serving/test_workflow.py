"""The handlers chained like the state machine, on moto S3, against the monolithic forward."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from functions import expert
from ground.errors import ModelError
from moe import Manifest, MoEModel
from pipeline import transports
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

    with pytest.raises(transports.TransportError, match="above the direct limit of 65536 bytes"):
        transports.call_direct(
            s3, BUCKET, "big", 0, ffn_in, shards, ["f0", "f1"], invoke, limit=65536
        )


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
