"""The batching front door: how requests become workflow executions, in one place.

A plan made for traffic (`plan.traffic`: `max_batch_tokens`, `max_wait_s`) is deployed behind
an SQS queue. Clients send one message per request; a Lambda event source mapping (ESM) polls
the queue and invokes the batching function (`functions.batcher`) with what it gathered; the
batcher splits that into executions of at most `max_batch_tokens` tokens and starts one
Step Functions execution per batch. The traffic simulator (`planner.traffic`) applies the same
rule (`batches`, which its compiled kernel is held to by tests), and `functions.batcher`
calls `split` itself, so the simulated batches are the deployed ones.

The rule, for requests in arrival order (times t, tokens n):

1. **Deliveries (the ESM).** A delivery opens at the first request not yet delivered and
   gathers the requests that arrive within `window_s` of its opening, up to `records`
   messages. It is delivered `window_s` after it opened, or at the arrival of its
   `records`-th message if that comes first. `window_s` is the policy's `max_wait_s` rounded
   up to whole seconds (`deployed_window_s`: the ESM's MaximumBatchingWindowInSeconds takes
   whole seconds, at most 300); `records` is the ESM's BatchSize (`records_per_delivery`):
   `max_batch_tokens` (a delivery cut by its count then holds at least one full batch, since
   every request has a token), at most 10,000, and at most 10 without a window (Lambda's
   limits). Modelled as one poller: the ESM's pollers are several and scale with the queue,
   which can only cut deliveries smaller (more executions) under bursts.
2. **Executions (the batcher).** The delivered requests are taken in order; an execution
   takes the next request while its tokens still fit `max_batch_tokens` (`split`); a request
   larger than that is an execution of its own. Every execution of a delivery starts when the
   batcher reaches its StartExecution (after writing its input, if it is stored), one after
   another.

Each request keeps its own id (the client's, inside its message); the execution's input lists
the requests with their SQS message ids and their rows (`request_rows`). The tail, given the
execution's input, writes each request's rows of the batch's output to its own object,
`results/<message id>.bin` (`ground.layout.result_key`), before the batch's output: the client
that sent the message reads its result under the id SendMessage returned, and no other
request's rows. It writes them `RESULT_WRITERS` at a time, which adds `result_write_s` to the
tail. The batch's token ids travel inline in that input (`input_ids`, as the head
takes them) when the input fits Step Functions' limit (`step_functions_payload_bytes`, 256 KiB:
about 40,000 token ids, less `TAIL_PAYLOAD_MARGIN_BYTES`: the tail's payload carries the input
too, `inline_input_limit`); a larger batch's ids go to `inputs/<execution name>.bin`, the key the
head reads for the execution it starts (`ground.layout.input_key`), at the price of an S3 PUT
(`execution_input_bytes` estimates which; the batcher measures the real JSON).
Windows of different lengths cannot share one tensor: the batcher starts one execution per
window length within a batch (every request of a deployment normally has the model's).

What it bills (`planned`): per request, SendMessage requests (one per 64 KB chunk of its
message); per delivery, the ESM's ReceiveMessage and DeleteMessageBatch calls (10 messages
each) and one batcher invocation (duration: per execution one StartExecution, and one S3 PUT
if its input is stored); per stored input, the S3 PUT; per request, its result's S3 PUT (the
tail's); over the period, the pollers' empty long polls. The prices and limits live in the
calibration file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ground.errors import InfeasibleError

__all__ = [
    "BATCHER_MEMORY_MB",
    "MESSAGE_ENVELOPE_BYTES",
    "MESSAGE_BYTES_PER_TOKEN",
    "RESULT_WRITERS",
    "TAIL_PAYLOAD_MARGIN_BYTES",
    "FrontDoorUsage",
    "batches",
    "deliveries",
    "deployed_window_s",
    "execution_input_bytes",
    "inline_input_limit",
    "message_bytes",
    "planned",
    "records_per_delivery",
    "request_rows",
    "result_write_s",
    "split",
]

# The batcher parses JSON, writes one object and calls StartExecution per batch: one vCPU's
# worth of memory (1,769 MB) is the size at which its import time measured on one core of this
# machine (`batcher_import_s` in the calibration file) applies without scaling.
BATCHER_MEMORY_MB = 1769
# A request's message: {"request": "<id of up to 64 characters>", "input_ids": [[...], ...]}
# in compact JSON; ids below 100,000 take at most 5 digits and a comma each (windows of 8
# tokens or more: their brackets add under half a byte per token, which the 128 bytes of
# envelope cover for short requests).
MESSAGE_ENVELOPE_BYTES = 128
MESSAGE_BYTES_PER_TOKEN = 6
# An execution input's entry per request:
# {"request":"<64>","message":"<36-character SQS id>","rows":[<6 digits>,<6 digits>]},
REQUEST_ROW_BYTES = 160
# The tail's payload is the execution's input plus its request id, its last hidden state's key,
# the previous layer and the Map's per-shard results (a few bytes per expert replica): an inline
# input leaves this much of Step Functions' payload limit for them.
TAIL_PAYLOAD_MARGIN_BYTES = 8192
# Result objects the tail writes at once (threads, each one PUT at a time).
RESULT_WRITERS = 16


def inline_input_limit(payload_limit: int, static_bytes: int) -> int:
    """The largest execution input whose token ids travel inline: Step Functions' payload
    limit less the tail's margin and what the definition adds beside the input in every Task
    (`static_bytes`: a driver's remote-expert table, `ground.driver.remote_table_bytes`).

    Raises:
        InfeasibleError: The definition's own parameters leave no room for an input.
    """
    limit = int(payload_limit) - TAIL_PAYLOAD_MARGIN_BYTES - int(static_bytes)
    if limit <= 0:
        raise InfeasibleError(
            f"the driver's remote-expert table ({static_bytes:,} bytes) leaves no room for a "
            f"request under Step Functions' payload limit ({payload_limit:,} bytes).",
            "plan with fewer remote experts (more driver memory, or --deployment monolithic), "
            "or as the fan-out workflow (--deployment workflow).",
        )
    return limit


def result_write_s(requests: Any, put_s: float) -> Any:
    """What writing `requests` results (a count, or an integer array of counts) adds to the
    tail: rounds of `RESULT_WRITERS` PUTs."""
    return -(-requests // RESULT_WRITERS) * put_s


def deployed_window_s(max_wait_s: float, limit_s: float) -> int:
    """The ESM's MaximumBatchingWindowInSeconds for a policy's `max_wait_s`: whole seconds,
    rounded up (a shorter wait cannot be deployed).

    Raises:
        ValueError: The window exceeds `limit_s` (300 s on Lambda).
    """
    window = max(math.ceil(float(max_wait_s) - 1e-9), 0)
    if window > limit_s:
        raise ValueError(f"a batching window of {window} s exceeds the event source's {limit_s} s")
    return int(window)


def records_per_delivery(
    max_tokens: int, window_s: int, *, max_records: int, max_records_without_window: int
) -> int:
    """The ESM's BatchSize: `max_tokens` messages, within Lambda's limits (10,000 with a
    window, 10 without)."""
    limit = max_records if window_s > 0 else max_records_without_window
    return int(max(1, min(int(max_tokens), limit)))


def deliveries(
    times: Sequence[float], window_s: float, records: int
) -> list[tuple[int, int, float]]:
    """(first request, end, delivery time) of each delivery of a sorted request stream."""
    out = []
    n = len(times)
    i = 0
    while i < n:
        deadline = times[i] + window_s
        j = i + 1
        while j < n and j - i < records and times[j] <= deadline:
            j += 1
        at = times[j - 1] if j - i == records else deadline
        out.append((i, j, float(at)))
        i = j
    return out


def split(tokens: Sequence[int], max_tokens: int) -> list[tuple[int, int]]:
    """(first, end) of each execution the batcher starts for one delivery's requests."""
    out = []
    i, n = 0, len(tokens)
    while i < n:
        total = tokens[i]
        j = i + 1
        while j < n and total + tokens[j] <= max_tokens:
            total += tokens[j]
            j += 1
        out.append((i, j))
        i = j
    return out


def batches(
    times: Sequence[float], tokens: Sequence[int], max_tokens: int, window_s: float, records: int
) -> list[tuple[int, int, float, int]]:
    """(first request, end, delivery time, delivery index) of each execution: `deliveries`
    then `split` (the executions' own start offsets inside the batcher are the simulator's)."""
    out = []
    for d, (start, end, at) in enumerate(deliveries(times, window_s, records)):
        for first, stop in split(tokens[start:end], max_tokens):
            out.append((start + first, start + stop, at, d))
    return out


def message_bytes(tokens: int) -> int:
    """Upper bound of the bytes of one request's message carrying `tokens` ids inline."""
    return MESSAGE_ENVELOPE_BYTES + MESSAGE_BYTES_PER_TOKEN * int(tokens)


def execution_input_bytes(tokens: int, requests: int) -> int:
    """Upper bound of the JSON bytes of an execution's input carrying its ids inline."""
    return (
        MESSAGE_ENVELOPE_BYTES
        + REQUEST_ROW_BYTES * int(requests)
        + (MESSAGE_BYTES_PER_TOKEN * int(tokens))
    )


def request_rows(
    messages: Sequence[dict[str, object]], message_ids: Sequence[str]
) -> list[dict[str, object]]:
    """The execution input's list of its requests: each one's id, its SQS message id (its
    result's name) and its window rows [start, stop) in the batch's input (and so in its
    output), in order."""
    out = []
    row = 0
    for message, message_id in zip(messages, message_ids, strict=True):
        ids = message["input_ids"]
        assert isinstance(ids, list)
        out.append(
            {"request": message["request"], "message": message_id, "rows": [row, row + len(ids)]}
        )
        row += len(ids)
    return out


@dataclass(frozen=True)
class FrontDoorUsage:
    """What the front door is billed for over a set of requests (see the module docstring)."""

    send_requests: int  # SendMessage, one per 64 KB chunk of each message
    receive_requests: int  # the ESM's ReceiveMessage calls that returned messages
    delete_requests: int  # its DeleteMessageBatch calls
    batcher_invocations: int
    executions: int  # one StartExecution each
    stored: int  # executions whose input went to S3 (one PUT each)
    results: int  # requests whose result the tail wrote (one PUT each)

    @property
    def sqs_requests(self) -> int:
        return self.send_requests + self.receive_requests + self.delete_requests

    def as_dict(self) -> dict[str, int]:
        return {
            "sqs_send_requests": self.send_requests,
            "sqs_receive_requests": self.receive_requests,
            "sqs_delete_requests": self.delete_requests,
            "sqs_requests": self.sqs_requests,
            "batcher_invocations": self.batcher_invocations,
            "executions": self.executions,
            "s3_put": self.stored,
            "s3_result_put": self.results,
        }


def planned(
    message_sizes: Sequence[int],
    records_per_delivery_: Sequence[int],
    executions: int,
    stored: int,
    *,
    chunk_bytes: int,
    receive_max: int,
) -> FrontDoorUsage:
    """The front door's billed requests for messages of `message_sizes` bytes, delivered in
    deliveries of `records_per_delivery_` messages, making `executions` executions, `stored`
    of them with their input in S3, and one result per message."""
    return FrontDoorUsage(
        send_requests=sum(max(1, -(-int(b) // chunk_bytes)) for b in message_sizes),
        receive_requests=sum(-(-int(r) // receive_max) for r in records_per_delivery_),
        delete_requests=sum(-(-int(r) // receive_max) for r in records_per_delivery_),
        batcher_invocations=len(records_per_delivery_),
        executions=int(executions),
        stored=int(stored),
        results=len(message_sizes),
    )


def body(request: str, input_ids: list[list[int]]) -> str:
    """A request's message body, as clients send it (compact JSON)."""
    return json.dumps({"request": request, "input_ids": input_ids}, separators=(",", ":"))
