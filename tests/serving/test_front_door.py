"""The front door on moto: requests sent to the synthesised queue, the batcher's handler invoked
with the SQS event as the event source mapping delivers it, the executions it starts run by
moto's Step Functions. Each request's result, the object the tail wrote under its message id,
equals its own direct execution's output; the batches are the simulator's for the same arrivals;
the front door's billed requests are the planned ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from functions.local import run_front_door, run_workflow
from ground import frontdoor
from ground.manifest import Manifest
from ground.plan import Plan
from tests.cdk.test_stack import make_plan, model_ref
from tests.traffic.plans import with_traffic

TOL = 1e-4
MAX_TOKENS = 96
WAIT_S = 0.5  # deployed as a 1 s window
# Step Functions takes 256 KiB of input; 500 bytes here send the 96-token batch's ids through
# S3 (inputs/fd-*) and keep the 32-token ones inline, so both paths run.
INPUT_LIMIT = 500
# Four requests of 32 or 64 tokens (windows of 32): the first three arrive within the first
# window (128 tokens: split 96 + 32), the fourth alone.
WINDOWS = [1, 2, 1, 1]
ARRIVALS = [0.0, 0.2, 0.5, 5.0]


def _traffic_plan(manifest: Manifest) -> Plan:
    layers, experts = manifest.num_layers, manifest.experts
    methods = ["s3", "pipelined", "direct"] * (layers // 3)
    plan = make_plan(
        model_ref(manifest),
        methods,
        [[1] * experts for _ in range(layers)],
        max_replicas=[[2] * experts for _ in range(layers)],
        max_tokens=[[1000] * experts for _ in range(layers)],
        beta=8,
        direct_payload_bytes=6 * 1024 * 1024,
    )
    return with_traffic(plan, max_batch_tokens=MAX_TOKENS, max_wait_s=WAIT_S)


@pytest.fixture(scope="module")
def runs(
    exported: tuple[Path, Manifest], wiki_windows: np.ndarray, tmp_path_factory: Any
) -> tuple[list[np.ndarray], dict[str, Any], dict[str, Any]]:
    from cdk.app import build_app

    root, manifest = exported
    tmp = tmp_path_factory.mktemp("front-door")
    template = build_app(_traffic_plan(manifest).save(tmp / "plan.json"), tmp / "cdk.out")
    template = template.stacks[0].template
    for resource in template["Resources"].values():
        variables = resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
        if "MOELAMBDA_INPUT_LIMIT" in variables:
            variables["MOELAMBDA_INPUT_LIMIT"] = str(INPUT_LIMIT)
    windows = wiki_windows.reshape(-1, 32)  # 16 windows of 32 tokens
    requests, row = [], 0
    for n in WINDOWS:
        requests.append(windows[row : row + n])
        row += n
    direct = run_workflow(template, root, requests)
    through = run_front_door(template, root, requests, ARRIVALS, metered=True)
    return requests, direct, through


def test_each_request_s_output_equals_its_direct_execution(runs) -> None:  # type: ignore[no-untyped-def]
    requests, direct, through = runs
    assert through["errors"] == [] and through["denied"] == [] and not through["failed_messages"]
    for request, alone, batched in zip(
        requests, direct["requests"], through["requests"], strict=False
    ):
        assert alone["status"] == batched["status"] == "SUCCEEDED", batched.get("cause")
        assert batched["output"].shape[0] == request.shape[0]
        assert float(np.abs(batched["output"] - alone["output"]).max()) <= TOL
        assert batched["result_equals_batch_rows"]
    keys = [r["result_key"] for r in through["requests"]]
    assert len(set(keys)) == len(keys) and all(k.startswith("results/") for k in keys)


@pytest.mark.parametrize(
    "requests",
    [
        [{"message": "m-1", "rows": [0, 3]}],  # past the batch's 2 windows
        [{"message": "m-1", "rows": [1, 1]}],  # empty
        [{"message": "../outputs/x", "rows": [0, 1]}],  # escapes results/
        [{"rows": [0, 1]}],  # no message id
    ],
)
def test_the_tail_refuses_requests_that_are_not_the_front_door_s(requests: list) -> None:
    from functions.common import write_results
    from ground.errors import UsageError

    with pytest.raises(UsageError):
        write_results(None, "bucket", np.zeros((2, 4), dtype=np.float32), requests)


def test_the_batches_are_the_simulator_s(runs) -> None:  # type: ignore[no-untyped-def]
    """The simulator's kernel (through `batches_of`, with the front door's deployed window and
    batch size) groups the same arrivals into the executions the batcher started."""
    from planner.calibration import load_calibration
    from planner.traffic.platform import front_door_for
    from planner.traffic.simulate import BatchPolicy, batches_of
    from planner.traffic.spec import Arrivals

    requests, _, through = runs
    tokens = np.array([r.size for r in requests])
    door = front_door_for(load_calibration(), 0)  # a workflow plan: no table
    assert door is not None
    stream = Arrivals(np.array(ARRIVALS), tokens, 10.0)
    first, _, size, delivery = batches_of(stream, BatchPolicy(MAX_TOKENS, WAIT_S), door)
    simulated = [
        [f"request-{k:04d}" for k in range(first[b], first[b + 1])] for b in range(size.size)
    ]
    assert (
        simulated
        == through["executions"]
        == [
            ["request-0000", "request-0001"],
            ["request-0002"],
            ["request-0003"],
        ]
    )
    assert size.tolist() == [96, 32, 32]
    assert delivery.tolist() == [0, 0, 1]
    assert through["deliveries"] == [[0, 1, 2], [3]]


def test_the_front_door_bills_what_is_planned(runs) -> None:  # type: ignore[no-untyped-def]
    _, _, through = runs
    metered, planned = through["front_door_usage"], through["front_door_planned"]
    keys = [k for k in planned if k != "executions"]
    assert {k: metered[k] for k in keys} == {k: planned[k] for k in keys}
    assert planned == {
        "sqs_send_requests": 4,
        "sqs_receive_requests": 2,
        "sqs_delete_requests": 2,
        "sqs_requests": 8,
        "batcher_invocations": 2,
        "executions": 3,
        "s3_put": 1,
        "s3_result_put": 4,
    }
    assert metered["batcher_gb_s"] > 0
    assert "batcher" in through["seconds"]
    # The workflow's own usage counts the three executions' Lambda requests (one head and one
    # tail each; an expert only where the routing sends it tokens), not the batcher's two.
    calls = {name: len(times) for name, times in through["seconds"].items()}
    assert calls["head"] == calls["tail"] == 3 and calls["batcher"] == 2
    assert through["usage"]["lambda_requests"] == sum(calls.values()) - calls["batcher"]


def test_a_bad_message_is_reported_failed_and_the_rest_batched() -> None:
    """The batcher's own rule: a message that is not a request is a batch item failure (SQS
    retries it, then moves it to the dead-letter queue); the others split by max_tokens."""
    from functions import batcher

    good = [frontdoor.body(f"r{i}", [[1, 2, 3]] * (i + 1)) for i in range(3)]
    records = [{"messageId": f"m{i}", "body": b} for i, b in enumerate(good)]
    records.insert(1, {"messageId": "bad", "body": '{"request": "x", "input_ids": "no"}'})
    parsed = [batcher.parse(r) for r in records if r["messageId"] != "bad"]
    assert [p["tokens"] for p in parsed] == [3, 6, 9]
    assert frontdoor.split([3, 6, 9], 9) == [(0, 2), (2, 3)]
    with pytest.raises(ValueError):
        batcher.parse(records[1])


def test_results_are_written_in_rounds_and_named_by_message() -> None:
    assert frontdoor.result_write_s(0, 0.02) == 0
    assert [frontdoor.result_write_s(n, 0.02) for n in (1, 16, 17, 32, 33)] == pytest.approx(
        [0.02, 0.02, 0.04, 0.04, 0.06]
    )
    np.testing.assert_allclose(frontdoor.result_write_s(np.array([1, 17]), 0.5), [0.5, 1.0])
    messages = [
        {"request": "a", "input_ids": [[1, 2]] * 2},
        {"request": "a", "input_ids": [[3, 4]]},
    ]
    assert frontdoor.request_rows(messages, ["m-1", "m-2"]) == [
        {"request": "a", "message": "m-1", "rows": [0, 2]},
        {"request": "a", "message": "m-2", "rows": [2, 3]},
    ]
    # The entry's size bound holds for the longest ids: a 64-character client id, SQS's 36.
    entry = frontdoor.request_rows(
        [{"request": "r" * 64, "input_ids": [[1]] * 999_999}], ["m" * 36]
    )
    assert len(json.dumps(entry, separators=(",", ":"))) - 2 <= frontdoor.REQUEST_ROW_BYTES
