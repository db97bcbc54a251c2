"""A driver layer takes the time the model prices: the handler starts its remote calls, runs its
local experts meanwhile and then joins (`ground.driver.layer_seconds`: the longer of the two),
shown with a slow fake remote expert."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from functions import config, driver
from functions.config import RemoteFunction
from ground.driver import layer_seconds
from moe import LayerOutput
from pipeline.transports import direct_decode, direct_encode

HIDDEN = 8
EXPERTS = 4
LOCAL = [0, 1]  # each sleeps LOCAL_S / 2, in turn
REMOTE = [2, 3]  # each sleeps REMOTE_S, at once
LOCAL_S = 1.0
REMOTE_S = 1.0


class _LocalExpert:
    """Doubles its rows, slowly; it waits until the remote calls have started, so a driver that
    ran its local experts before calling the remote ones fails on the condition, not a clock."""

    def __init__(self, remote_started: threading.Event) -> None:
        self.remote_started = remote_started

    def run(self, x: torch.Tensor) -> torch.Tensor:
        assert self.remote_started.wait(60), "the local experts ran before the remote calls"
        time.sleep(LOCAL_S / len(LOCAL))
        return x * 2


def _slow_remote(remote_started: threading.Event) -> Any:
    """An Invoke of a remote expert that doubles its rows after REMOTE_S."""

    def invoke(function: str, event: dict[str, Any]) -> dict[str, Any]:
        remote_started.set()
        time.sleep(REMOTE_S)
        rows = direct_decode(event["payload"])[0]
        return {"payload": direct_encode(rows * 2)}

    return invoke


def _layer_output(tokens: int) -> LayerOutput:
    """Each token routed to one local and one remote expert, weights 0.25 and 0.75."""
    rng = np.random.default_rng(0)
    ffn_in = torch.from_numpy(rng.standard_normal((tokens, HIDDEN)).astype(np.float32))
    experts = torch.tensor([[LOCAL[t % 2], REMOTE[t % 2]] for t in range(tokens)])
    weights = torch.tensor([[0.25, 0.75]] * tokens)
    return LayerOutput(ffn_in[None], ffn_in, experts, weights, weights)


def test_a_layer_with_a_slow_remote_expert_takes_the_priced_time(tmp_path: Path) -> None:
    started = threading.Event()
    stages = SimpleNamespace(expert=lambda layer, e: _LocalExpert(started))
    records = tmp_path / "metrics.jsonl"
    cfg = config.Config(
        {
            "MOELAMBDA_BUCKET": "bucket",
            "MOELAMBDA_PAYLOAD_LIMIT": str(6 * 2**20),
            "MOELAMBDA_METRICS_FILE": str(records),
        },
        _slow_remote(started),
    )
    remote = [[RemoteFunction(e, f"expert-{e}", 1, 1, 1_000) for e in REMOTE]]
    manifest = SimpleNamespace(experts=EXPERTS, hidden_size=HIDDEN)
    call = driver.RemoteExperts(None, cfg, "r" * 64, manifest, [LOCAL], remote, stages)
    out = _layer_output(8)
    try:
        begun = time.perf_counter()
        y = call(0, out)
        measured = time.perf_counter() - begun
    finally:
        call.close()
    # every expert doubles its rows: the combine gives 2 x (0.25 + 0.75) x
    assert torch.allclose(y, 2 * out.ffn_in)
    priced = float(layer_seconds(LOCAL_S, REMOTE_S))
    assert priced <= measured <= 1.25 * priced, (measured, priced)
    (timing,) = [
        r
        for line in records.read_text().splitlines()
        if (r := json.loads(line)).get("kind") == "driver_layer"
    ]
    assert timing["local_s"] == pytest.approx(LOCAL_S, rel=0.25)
    assert timing["remote_s"] == pytest.approx(REMOTE_S, rel=0.25)
    assert timing["layer_s"] <= measured


def test_a_failing_local_expert_still_joins_its_remote_calls() -> None:
    started = threading.Event()

    class Broken:
        def run(self, x: torch.Tensor) -> torch.Tensor:
            assert started.wait(60)
            raise RuntimeError("local expert failed")

    stages = SimpleNamespace(expert=lambda layer, e: Broken())
    cfg = config.Config(
        {"MOELAMBDA_BUCKET": "bucket", "MOELAMBDA_PAYLOAD_LIMIT": str(6 * 2**20)},
        _slow_remote(started),
    )
    remote = [[RemoteFunction(e, f"expert-{e}", 1, 1, 1_000) for e in REMOTE]]
    manifest = SimpleNamespace(experts=EXPERTS, hidden_size=HIDDEN)
    call = driver.RemoteExperts(None, cfg, "r" * 64, manifest, [LOCAL], remote, stages)
    with pytest.raises(RuntimeError, match="local expert failed"):
        call(0, _layer_output(4))
    call.close()  # returns: nothing is left running
