"""The front door's batching function: SQS messages in, one workflow execution per batch out.

The SQS event source mapping invokes it with the messages it gathered (its window and batch
size realise the plan's `max_wait_s`; `ground.frontdoor`). It splits them, in order, into
batches of at most `MOELAMBDA_MAX_BATCH_TOKENS` tokens (`ground.frontdoor.split`, the rule the
traffic simulator applies) and starts one execution per batch with the list of its requests
with their message ids and rows (`ground.frontdoor.request_rows`: the tail writes each one's
result under its message id) and the batch's token ids inline (`input_ids`, as the head takes
them) when that input fits `MOELAMBDA_INPUT_LIMIT` (`ground.frontdoor.inline_input_limit`),
else written first to `inputs/<execution name>.bin`, the key the head
reads for that execution (`ground.layout.input_key`).

A message is `{"request": "<client id>", "input_ids": [[...], ...]}` (`ground.frontdoor.body`).
One that is not (bad JSON, a bad id or token ids) is reported as a batch item failure: SQS
delivers it again and, after the queue's maxReceiveCount, moves it to the dead-letter queue.
The execution's name is the hash of its messages' ids, so a delivery SQS repeats (at least
once) writes the same input and starts no second Standard execution (StartExecution with the
name and input of an existing execution returns it). Imports no torch: its INIT is the
interpreter, boto3 and numpy.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

import numpy as np

from functions import config
from ground import frontdoor, layout
from ground.access import BATCH_INPUT_PREFIX
from pipeline.tensorio import encode

__all__ = ["handler", "parse"]

_LOCK = threading.Lock()
_CLIENTS: dict[tuple[str, str | None], Any] = {}


def _client(service: str) -> Any:
    """One client per service (and, locally, per identity: the runner's IAM check)."""
    identity = config.current().local_identity
    with _LOCK:
        if (service, identity) not in _CLIENTS:
            import boto3

            credentials = (
                {}
                if identity is None
                else {"aws_access_key_id": identity, "aws_secret_access_key": "local"}
            )
            _CLIENTS[(service, identity)] = boto3.client(service, **credentials)
        return _CLIENTS[(service, identity)]


def parse(record: dict[str, Any]) -> dict[str, Any]:
    """A message's request: its id and its token ids as a list of equal-length windows.

    Raises:
        ValueError: The body is not a request.
    """
    body = json.loads(record["body"])
    if not isinstance(body, dict):
        raise ValueError("the message is not a JSON object")
    request = body.get("request")
    if not isinstance(request, str) or not 1 <= len(request) <= 64:
        raise ValueError("request must be an id of 1 to 64 characters")
    ids = np.asarray(body.get("input_ids"), dtype=np.int64)
    if ids.ndim != 2 or ids.size == 0 or (ids < 0).any():
        raise ValueError("input_ids must be a non-empty 2-D list of non-negative token ids")
    return {"request": request, "input_ids": ids.tolist(), "tokens": int(ids.size)}


def _execution_name(message_ids: list[str]) -> str:
    return BATCH_INPUT_PREFIX + hashlib.sha256("\n".join(message_ids).encode()).hexdigest()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"Records": [SQS message, ...]} -> {"batchItemFailures": [...], "executions": [...]}."""
    cfg = config.current()
    max_tokens = int(cfg.setting("MOELAMBDA_MAX_BATCH_TOKENS"))
    limit = int(cfg.setting("MOELAMBDA_INPUT_LIMIT"))
    machine = cfg.setting("MOELAMBDA_STATE_MACHINE_ARN")
    failures, good, ids = [], [], []
    for record in event.get("Records", []):
        try:
            good.append(parse(record))
            ids.append(record["messageId"])
        except (ValueError, TypeError, KeyError, OverflowError):
            failures.append({"itemIdentifier": record.get("messageId", "")})
    sfn = _client("stepfunctions")
    s3 = _client("s3")
    started = []
    for first, end in frontdoor.split([m["tokens"] for m in good], max_tokens):
        members = list(range(first, end))
        # One tensor per window length: a batch of mixed lengths starts one execution each.
        lengths = sorted({len(good[k]["input_ids"][0]) for k in members})
        for length in lengths:
            part = [k for k in members if len(good[k]["input_ids"][0]) == length]
            name = _execution_name([ids[k] for k in part])
            rows = [row for k in part for row in good[k]["input_ids"]]
            requests = frontdoor.request_rows([good[k] for k in part], [ids[k] for k in part])
            given = json.dumps({"requests": requests, "input_ids": rows}, separators=(",", ":"))
            if len(given.encode()) > limit:  # too large for the workflow's input: stored
                s3.put_object(
                    Bucket=cfg.bucket,
                    Key=layout.input_key(name),
                    Body=encode(np.asarray(rows, dtype=np.int64)),
                )
                given = json.dumps({"requests": requests}, separators=(",", ":"))
            arn = sfn.start_execution(stateMachineArn=machine, name=name, input=given)[
                "executionArn"
            ]
            started.append(arn)
    return {"batchItemFailures": failures, "executions": started}
