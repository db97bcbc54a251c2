"""The tensor codec, direct events, the key scheme and the per-invocation configuration.

No model needed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from functions import config
from ground import layout
from ground.errors import UsageError
from ground.semantics import (
    DIRECT_EVENT_BYTES,
    direct_event_bytes,
    hosted_rows_bytes,
    max_direct_tokens,
)
from pipeline import transports
from pipeline.tensorio import TensorIOError, decode, encode


def test_round_trip_keeps_dtype_shape_and_bits() -> None:
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.standard_normal(7).astype(np.float16),
        rng.integers(-(2**62), 2**62, size=(2, 2, 2)),
        np.arange(6, dtype=np.int32).reshape(3, 2)[:, ::-1],  # not C-contiguous
        np.zeros((0, 384), np.float32),
        np.array(3.5, np.float32),
    ]
    decoded = decode(encode(*arrays))
    assert len(decoded) == len(arrays)
    for got, want in zip(decoded, arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
        assert got.flags.writeable
    assert decode(encode()) == []


def test_header_is_the_contract_layout() -> None:
    data = encode(np.array([[1, 2]], np.int64))
    assert data[:4] == b"MLT1" and data[4] == 1 and data[5:7] == bytes([2, 2])
    assert data[7:15] == (1).to_bytes(4, "little") + (2).to_bytes(4, "little")
    assert len(data) == 15 + 16


def test_bfloat16_values_travel_in_half_the_bytes_exactly() -> None:
    """Hidden states a bfloat16 stage computed (float32 on the host, low halves zero) take two
    bytes a value on the wire and decode to the very same float32 values; any other float32
    keeps four."""
    import torch

    rng = np.random.default_rng(1)
    rows = torch.from_numpy(rng.standard_normal((6, 384)).astype(np.float32))
    halves = rows.bfloat16().float().numpy()
    small, full = encode(halves), encode(rows.numpy())
    assert len(small) == 4 + 1 + 2 + 8 + 6 * 384 * 2
    assert len(full) == 4 + 1 + 2 + 8 + 6 * 384 * 4
    (back,) = decode(small)
    assert back.dtype == np.float32 and np.array_equal(
        back.view(np.uint32), halves.view(np.uint32)
    )
    assert np.array_equal(decode(full)[0], rows.numpy())
    signs = np.array([-0.0, np.inf, -np.inf], np.float32)  # bfloat16 has them too
    assert np.array_equal(decode(encode(signs))[0].view(np.uint32), signs.view(np.uint32))


def test_bad_magic_truncation_and_trailing_bytes_are_clear_errors() -> None:
    data = encode(np.ones((4, 3), np.float32), np.arange(2))
    with pytest.raises(TensorIOError, match="magic"):
        decode(b"NOPE" + data[4:])
    for cut in range(4, len(data)):
        with pytest.raises(TensorIOError, match="truncated"):
            decode(data[:cut])
    with pytest.raises(TensorIOError, match="unexpected bytes"):
        decode(data + b"\0")
    with pytest.raises(TensorIOError, match="dtype"):
        encode(np.ones(2, np.float64))


def test_keys_follow_the_contract() -> None:
    assert layout.input_key("r_1") == "inputs/r_1.bin"
    assert layout.request_id_of("arn:x") == layout.request_id_of("arn:x")
    assert len(layout.request_id_of("arn:x")) == 64
    assert layout.request_id_of("arn:x") != layout.request_id_of("arn:y")
    assert layout.validate_request_id(layout.request_id_of("arn:x"))
    for bad in ("../x", "", "a" * 81, "a/b", None):
        with pytest.raises(UsageError, match="invalid execution name"):
            layout.input_key(bad)  # type: ignore[arg-type]
    assert layout.head_key("r-1") == "requests/r-1/head.bin"
    assert layout.residual_key("r-1", 3) == "requests/r-1/03/residual.bin"
    assert layout.routing_key("r-1", 3) == "requests/r-1/03/routing.bin"
    assert layout.shard_key("r-1", 3, 2, 1) == "requests/r-1/03/in/02/01.bin"
    assert layout.minibatch_key("r-1", 3, 2, 1, 7) == "requests/r-1/03/in/02/01/0007.bin"
    assert layout.done_key("r-1", 3, 2, 1) == "requests/r-1/03/in/02/01/done.bin"
    assert layout.out_key("r-1", 3, 2, 1) == "requests/r-1/03/out/02/01.bin"
    assert layout.out_minibatch_key("r-1", 3, 2, 1, 7) == "requests/r-1/03/out/02/01/0007.bin"
    assert layout.output_key("r-1") == "outputs/r-1.bin"
    prefix = layout.out_prefix("r-1", 3)
    assert layout.parse_out_key(prefix, layout.out_key("r-1", 3, 2, 1)) == (2, 1, None)
    assert layout.parse_out_key(prefix, layout.out_minibatch_key("r-1", 3, 2, 1, 7)) == (2, 1, 7)


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "a b", "x" * 65, "é", None, 7])
def test_request_ids_that_could_escape_their_prefix_are_refused(bad: object) -> None:
    with pytest.raises(UsageError, match="invalid request id"):
        layout.request_prefix(bad)  # type: ignore[arg-type]


def test_local_configuration_wins_over_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MOELAMBDA_BUCKET", "from-os")
    assert config.current().bucket == "from-os"
    with config.local({"MOELAMBDA_BUCKET": "from-runner", "MOELAMBDA_LAYER": "2"}):
        assert (config.current().bucket, config.current().layer) == ("from-runner", 2)
    assert config.current().bucket == os.environ["MOELAMBDA_BUCKET"] == "from-os"
    with config.local({}), pytest.raises(config.ConfigError, match="MOELAMBDA_EXPERT"):
        _ = config.current().expert


def test_layer_plan_is_validated() -> None:
    ok = {
        "method": "s3",
        "beta": 8,
        "replicas": [1, 2],
        "max_replicas": [3, 2],
        "max_tokens": [100, 50],
        "payload_limit": 6291456,
        "expert_functions": ["a", "b"],
    }
    with config.local({"MOELAMBDA_LAYER_PLAN": json.dumps(ok)}):
        plan = config.current().layer_plan
    assert (plan.replicas, plan.max_replicas, plan.max_tokens) == ((1, 2), (3, 2), (100, 50))
    assert plan.payload_limit == 6291456
    bad = [
        ok | {"method": "ftp"},
        ok | {"max_replicas": [3]},  # one per expert
        ok | {"max_replicas": [1, 1]},  # fewer than the planned replicas
        ok | {"max_tokens": [0, 5]},
        {k: v for k, v in ok.items() if k != "payload_limit"},
    ]
    for text in [*(json.dumps(b) for b in bad), "{"]:
        with config.local({"MOELAMBDA_LAYER_PLAN": text}), pytest.raises(config.ConfigError):
            _ = config.current().layer_plan


WIDEST = {"request_id": "r" * 64, "layer": 999999, "expert": 999999, "replica": 999999}


@pytest.mark.parametrize("function", ["f" * 64, None], ids=["event", "response"])
def test_direct_envelope_is_within_the_bound_the_planner_uses(function: str | None) -> None:
    rows = np.zeros((999999, 0), np.float32)  # the widest token count, no bytes to carry
    event = transports.direct_event(**WIDEST, rows=rows, limit=10**9, function=function)
    envelope = len(json.dumps(event)) - len(event["payload"])
    assert envelope <= DIRECT_EVENT_BYTES
    assert (envelope == DIRECT_EVENT_BYTES) == (function is not None)  # the bound is tight


@pytest.mark.parametrize("hosted", [1, 8])
@pytest.mark.parametrize("tokens", [0, 1, 2, 3, 7, 100, 1001])
def test_direct_event_bytes_bounds_the_real_event(tokens: int, hosted: int) -> None:
    """An event carries the rows and the rows per hosted expert; a response the rows alone."""
    hidden = 384
    rows = np.full((tokens, hidden), 1.1, np.float32)  # no bfloat16 value: four bytes each
    hosted_rows = np.full(hosted, tokens // hosted, np.int64)
    bound = direct_event_bytes(tokens, 4 * hidden, hosted)
    event = transports.direct_event(
        **WIDEST, rows=rows, limit=10**9, function="f" * 64, hosted_rows=hosted_rows
    )
    # base64 padding and a token count narrower than the bound's six digits are the slack
    assert 0 <= bound - len(json.dumps(event)) < 8
    x, decoded_rows = transports.direct_decode(event["payload"])
    assert x.shape == (tokens, hidden) and decoded_rows.tolist() == hosted_rows.tolist()
    response = transports.direct_event(**WIDEST, rows=rows, limit=10**9)
    assert 0 <= bound - len(json.dumps(response)) < 100 + 2 * hosted_rows_bytes(hosted)
    assert len(transports.direct_decode(response["payload"])) == 1


@pytest.mark.parametrize("limit", [262144, 6291456])
def test_the_planners_direct_capacity_is_accepted_and_one_byte_less_refused(limit: int) -> None:
    # 1.1 is no bfloat16 value: the rows take the four bytes a value the bound assumes
    rows = np.full((max_direct_tokens(limit, 4 * 384, 4), 384), 1.1, np.float32)
    hosted_rows = np.array([rows.shape[0], 0, 0, 0])
    shipped = {"function": "f" * 64, "hosted_rows": hosted_rows}
    event = transports.direct_event(**WIDEST, rows=rows, limit=limit, **shipped)
    size = len(json.dumps(event))
    with pytest.raises(transports.TransportError, match=f"is {size:,} bytes of JSON, above"):
        transports.direct_event(**WIDEST, rows=rows, limit=size - 1, **shipped)
    more = np.full((rows.shape[0] + 1, 384), 1.1, np.float32)
    with pytest.raises(transports.TransportError):
        transports.direct_event(**WIDEST, rows=more, limit=limit, **shipped)
