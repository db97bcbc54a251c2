"""The front door never overflows Step Functions' payload: a driver plan's remote-expert table
rides in its Task's parameters beside the execution's input, so the batcher inlines only what
leaves the table its room (`ground.frontdoor.inline_input_limit`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from functions import batcher, config
from ground.access import BATCH_INPUT_PREFIX
from ground.driver import INVOKED_NAME_MAX, remote_table, remote_table_bytes
from ground.frontdoor import TAIL_PAYLOAD_MARGIN_BYTES, inline_input_limit
from ground.plan import Plan
from moelambda.cli import app

STEP_FUNCTIONS_PAYLOAD = 262_144  # 256 KiB, `step_functions_payload_bytes`


@pytest.fixture(scope="module")
def olmoe_driver(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """OLMoE as a driver at fp32: its 27.7 GB do not fit one function, so most experts are
    remote."""
    out = tmp_path_factory.mktemp("olmoe") / "plan.json"
    made = CliRunner().invoke(
        app,
        ["plan", "--shape", "olmoe", "--weights", "fp32", "--deployment", "driver"]
        + ["--tokens", "2048"]
        + ["--concurrency-quota", "10000"]
        + ["--out", str(out)],
    )
    assert made.exit_code == 0, made.output
    return Plan.load(out)


class _Recorder:
    """The batcher's S3 and Step Functions clients: what it stored and started."""

    def __init__(self) -> None:
        self.stored: list[str] = []
        self.inputs: list[str] = []

    def put_object(self, *, Bucket: str, Key: str, Body: bytes) -> None:  # noqa: N803
        self.stored.append(Key)

    def start_execution(self, *, stateMachineArn: str, name: str, input: str) -> dict[str, Any]:  # noqa: A002, N803
        self.inputs.append(input)
        return {"executionArn": f"{stateMachineArn}:{name}"}


def _batch(ids: list[int], limit: int, monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    recorder = _Recorder()
    monkeypatch.setattr(batcher, "_client", lambda service: recorder)
    body = json.dumps({"request": "client-1", "input_ids": [ids]})
    env = {
        "MOELAMBDA_BUCKET": "bucket",
        "MOELAMBDA_MAX_BATCH_TOKENS": str(len(ids)),
        "MOELAMBDA_INPUT_LIMIT": str(limit),
        "MOELAMBDA_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:1:stateMachine:m",
    }
    with config.local(env):
        out = batcher.handler({"Records": [{"messageId": "m-1", "body": body}]}, None)
    assert out["batchItemFailures"] == []
    return recorder


def _ids_of_size(limit: int) -> list[int]:
    """Token ids whose execution input (one request) is exactly `limit` bytes."""
    given = json.dumps(
        {
            "requests": [{"request": "client-1", "message": "m-1", "rows": [0, 1]}],
            "input_ids": [[]],
        },
        separators=(",", ":"),
    )
    room = limit - len(given)
    count = (room + 1) // 2  # "1," per id, the last without its comma
    ids = [1] * count
    for i in range(room - (2 * count - 1)):  # what is left: a second digit on some ids
        ids[i] = 10
    return ids


def test_a_driver_task_at_the_inline_limit_fits_step_functions_payload(
    olmoe_driver: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    static = remote_table_bytes(olmoe_driver)
    # The case this guards: the table is far past the tail's margin the limit once kept alone.
    assert static > 4 * TAIL_PAYLOAD_MARGIN_BYTES
    limit = inline_input_limit(STEP_FUNCTIONS_PAYLOAD, static)
    ids = _ids_of_size(limit)

    at_limit = _batch(ids, limit, monkeypatch)
    assert at_limit.stored == []  # inline
    (given,) = at_limit.inputs
    assert len(given.encode()) == limit
    names = [["x" * INVOKED_NAME_MAX] * len(layer.experts) for layer in olmoe_driver.layers]
    task = {
        "request_id": "0" * 64,
        "execution": BATCH_INPUT_PREFIX + "0" * 64,
        "input": json.loads(given),
        "remote": remote_table(olmoe_driver, names),
    }
    assert len(json.dumps(task, separators=(",", ":")).encode()) <= STEP_FUNCTIONS_PAYLOAD

    ids[-1] = 10  # one byte more: the ids go to S3, the input keeps the request list
    past = _batch(ids, limit, monkeypatch)
    assert len(past.stored) == 1 and "input_ids" not in json.loads(past.inputs[0])


def test_a_table_that_leaves_no_room_is_refused_with_the_fix() -> None:
    from ground.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match="remote-expert table") as raised:
        inline_input_limit(STEP_FUNCTIONS_PAYLOAD, STEP_FUNCTIONS_PAYLOAD)
    assert "--deployment workflow" in str(raised.value.fix)


def test_a_workflow_plan_carries_no_table(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    made = CliRunner().invoke(
        app, ["plan", "--shape", "olmoe", "--deployment", "workflow", "--out", str(out)]
    )
    assert made.exit_code == 0, made.output
    assert remote_table_bytes(Plan.load(out)) == 0
