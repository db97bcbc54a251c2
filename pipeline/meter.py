"""What AWS would bill for executions run on moto: requests by type, transitions, GB-seconds.

`moelambda run-local` sets these numbers against the plan's (`ground.semantics`), so they are
counted where the requests really happen, not derived from the workflow's shape:

- S3: every request the handlers make with boto3 passes moto's `BotocoreStubber`, botocore's
  before-send handler, which knows the operation and answers with the status. A GetObject that
  found nothing, or that read a pipelined `done.bin` marker, is a poll (its number depends on
  timing); other GETs and HEADs are data reads. Only the run's bucket counts.
- Lambda: the local runner reports every handler call (Step Functions' Tasks and a direct gate's
  own Invokes alike) with its wall time and the function's memory; "experts_gb_s" is the expert
  functions' share of "gb_s", which the plan prices as the paper's objective.
- Transitions: the states each execution entered, from its history, which moto records for
  every state, those inside Map iterations and Parallel branches included.
- The front door (`pipeline.local.run_front_door`): SQS requests (SendMessage counted per 64 KB
  chunk of its request body, ReceiveMessage, DeleteMessageBatch), the batcher's invocations and
  GB-seconds, the S3 requests it makes (signed with its identity) and the tail's PUTs of the
  clients' results (`results/`), kept apart from the workflow's usage in `front_door_usage`
  (`ground.frontdoor.FrontDoorUsage.as_dict`'s keys).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import fields
from typing import Any
from urllib.parse import unquote, urlsplit

from ground.layout import RESULTS_PREFIX
from ground.semantics import S3_REQUEST_TYPES, USAGE_KEYS, Requests

__all__ = ["EXACT_KEYS", "TIMED_KEYS", "Meter", "entered_states", "identity_of", "object_key"]

# What a successful metered run must match the plan in exactly: its requests and transitions,
# which the workflow's shape and the batch's routing fix. The rest depends on this machine's
# timing (a pipelined replica's polls, the GB-seconds of handlers run in-process on moto) or is
# a size, not a count.
EXACT_KEYS = tuple(f.name for f in fields(Requests) if f.name != "s3_get_poll")
TIMED_KEYS = ("s3_get_poll", "gb_s", "experts_gb_s")

_DONE_MARKER = "/done.bin"
_MB_PER_GB = 1024
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
_SQS_KINDS = {
    "SendMessage": "sqs_send_requests",
    "ReceiveMessage": "sqs_receive_requests",
    "DeleteMessage": "sqs_delete_requests",
    "DeleteMessageBatch": "sqs_delete_requests",
}


def identity_of(request: Any) -> str | None:
    """The access key id a request is signed with (the local runner's function identity)."""
    header = request.headers.get("Authorization") or ""
    if isinstance(header, bytes):
        header = header.decode()
    match = _CREDENTIAL.search(header)
    return match[1] if match else None


def object_key(url: str, bucket: str) -> str | None:
    """The key a request to `url` addresses in `bucket` ("" for the bucket), None if elsewhere.

    boto3 addresses a bucket by host (virtual-hosted style) or by the path's first segment.
    """
    parts = urlsplit(url)
    path = unquote(parts.path)
    if (parts.hostname or "").startswith(bucket + "."):
        return path.lstrip("/")
    if path == "/" + bucket or path.startswith(f"/{bucket}/"):
        return path[len(bucket) + 2 :]
    return None


def _s3_kind(operation: str, key: str, status: int) -> str | None:
    """The usage key of one S3 request, None for operations the handlers never make."""
    kind = S3_REQUEST_TYPES.get(operation)
    if operation == "GetObject" and (status == 404 or key.endswith(_DONE_MARKER)):
        return "s3_get_poll"
    return kind


class Meter:
    """Thread-safe counters of one metered run against `bucket`."""

    def __init__(
        self, bucket: str, front_door: frozenset[str] = frozenset(), sqs_chunk_bytes: int = 65536
    ) -> None:
        self.bucket = bucket
        self.front_door = front_door  # identities whose S3 requests are the front door's
        self.sqs_chunk_bytes = sqs_chunk_bytes  # the calibration's sqs_request_chunk_bytes
        self._lock = threading.Lock()
        self._usage: dict[str, int | float] = dict.fromkeys(USAGE_KEYS, 0)
        self._door: dict[str, int | float] = dict.fromkeys(
            (
                "sqs_send_requests",
                "sqs_receive_requests",
                "sqs_delete_requests",
                "batcher_invocations",
                "batcher_gb_s",
                "s3_put",
                "s3_result_put",
            ),
            0,
        )

    def _add_door(self, key: str, amount: int | float = 1) -> None:
        with self._lock:
            self._door[key] = self._door.get(key, 0) + amount

    def sqs_request(self, operation: str, body: bytes) -> None:
        """Count one SQS request (a SendMessage per 64 KB chunk of its body)."""
        kind = _SQS_KINDS.get(operation)
        if kind is None:  # the runner's own setup: CreateQueue, GetQueueUrl, ...
            return
        chunks = (
            max(1, -(-len(body) // self.sqs_chunk_bytes)) if kind == "sqs_send_requests" else 1
        )
        self._add_door(kind, chunks)

    def batcher_call(self, memory_mb: int, seconds: float) -> None:
        """Count one invocation of the front door's batcher."""
        self._add_door("batcher_invocations")
        self._add_door("batcher_gb_s", seconds * memory_mb / _MB_PER_GB)

    def front_door_usage(self) -> dict[str, int | float]:
        """What the front door was billed for so far (`sqs_requests` is their sum)."""
        with self._lock:
            door = dict(self._door)
        door["sqs_requests"] = (
            door["sqs_send_requests"] + door["sqs_receive_requests"] + door["sqs_delete_requests"]
        )
        return door

    def _add(self, key: str, amount: int | float = 1) -> None:
        with self._lock:
            self._usage[key] += amount

    def s3_request(
        self, operation: str, url: str, status: int, identity: str | None = None
    ) -> None:
        """Count one S3 request if it went to the metered bucket (to the front door's usage if
        `identity` is the batcher's)."""
        key = object_key(url, self.bucket)
        kind = None if key is None else _s3_kind(operation, key, status)
        if kind == "s3_put" and key is not None and key.startswith(RESULTS_PREFIX):
            self._add_door("s3_result_put")  # the tail's, for the front door's clients
        elif kind is not None and identity is not None and identity in self.front_door:
            self._add_door(kind if kind == "s3_put" else f"{kind}_other")
        elif kind is not None:
            self._add(kind)

    def lambda_call(
        self,
        memory_mb: int,
        seconds: float,
        event: dict[str, Any],
        response: Any,
        *,
        expert: bool,
    ) -> None:
        """Count one handler call: a request, its GB-seconds, and a direct payload's size.

        Only direct expert invocations carry rows inline ("payload"); their JSON event and
        response are what Lambda's 6 MB Invoke limit applies to.
        """
        gb_s = seconds * memory_mb / _MB_PER_GB
        self._add("lambda_requests")
        self._add("gb_s", gb_s)
        if expert:
            self._add("experts_gb_s", gb_s)
        if "payload" in event:
            sizes = [len(json.dumps(event))]
            if isinstance(response, dict):
                sizes.append(len(json.dumps(response)))
            with self._lock:
                self._usage["payload_max_bytes"] = max(self._usage["payload_max_bytes"], *sizes)

    def add_transitions(self, count: int) -> None:
        self._add("transitions", count)

    def usage(self) -> dict[str, int | float]:
        """The usage keys (`USAGE_KEYS`) counted so far."""
        with self._lock:
            return dict(self._usage)

    @contextlib.contextmanager
    def counting_s3(self) -> Iterator[None]:
        """Count the S3 (and SQS) requests made in this block (under `moto.mock_aws`).

        Wraps `BotocoreStubber.__call__`, which calls `process_request` (the method
        `pipeline.local.atomic_s3` patches), so both hold together; restored on exit.
        """
        from moto.core.botocore_stubber import BotocoreStubber

        original = BotocoreStubber.__call__

        def counted(stubber: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
            response = original(stubber, event_name, request, **kwargs)
            _, service, operation = event_name.split(".", 2)
            if response is not None and service == "s3":
                identity = identity_of(request)
                self.s3_request(operation, request.url, response.status_code, identity)
            elif response is not None and service == "sqs" and response.status_code < 300:
                body = request.body if isinstance(request.body, bytes) else b""
                self.sqs_request(operation, body)
            return response

        BotocoreStubber.__call__ = counted  # type: ignore[method-assign]
        try:
            yield
        finally:
            BotocoreStubber.__call__ = original  # type: ignore[method-assign]


def entered_states(sfn: Any, execution_arn: str) -> int:
    """States the execution entered: one billed transition each (Standard workflows)."""
    pages = sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
    return sum(
        1 for page in pages for event in page["events"] if event["type"].endswith("StateEntered")
    )
