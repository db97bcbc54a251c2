"""Stream semantics: generation workers that batch requests continuously, fed by a queue.

A stream plan (`Plan.stream`) serves a decoder's requests as they arrive. A client's request
(a prompt's token ids and its sampling settings, `message`) is one SQS message. Workers, each
one invocation of the worker function (a driver or monolithic function: `ground.driver`), take
messages into free *slots* and decode every admitted sequence together, one step at a time:

    admission: between decode steps a worker with a free slot receives up to that many
      messages (one ReceiveMessage, at most 10). A message whose final result exists is a
      duplicate (SQS delivers at least once, or a worker died after writing it): the worker
      deletes it and admits nothing. Otherwise the request joins the *prefill queue*.
    prefill: a newcomer's prompt is run in chunks of `prefill_chunk_tokens`, one chunk per
      iteration, so a long prompt adds at most one chunk's time to the running sequences'
      step; after its last chunk its first token is sampled and it joins the decode batch.
    decode step: one token for every running sequence, its rows through every layer together
      (a remote expert is invoked once per layer per step with all its rows).
    results: a request's tokens go to `results/<message id>/NNNNN.json` (`chunk_key`), a
      durable channel the client reads while it grows: the first token at once (TTFT), then
      one chunk per `flush_tokens` tokens; when the sequence ends, the rest and the whole
      answer go to `results/<message id>/final.json` (`final_key`) and only then is the message
      deleted. A worker that dies leaves its messages to reappear after the queue's visibility
      timeout; the next worker writes the same chunks again (the same ids: greedy, or sampled
      from the request's own seeded generator), so the client sees one complete answer.
    deadline: a worker admits a request only if the longest admissible generation
      (`max_new_tokens` at the planned step time of a full batch, plus a prompt of
      `max_prompt_tokens`) ends before the invocation's deadline (`admissible`); a request in
      flight is never cut. When it stops admitting or has had nothing to do for
      `idle_exit_s`, it finishes what it holds and returns.
    scale-out: the queue's event source mapping starts a worker with one message whenever
      messages wait and fewer than `workers` run (its maximum concurrency); the worker then
      fills its other slots itself. A worker holds that first message like any other.

Billing: a worker is billed for its whole invocation (memory x duration, idle polls
included) and one Lambda request; per request, one SendMessage (the client), one DeleteMessage,
its chunk PUTs and one final PUT (`request_usage`); a worker's ReceiveMessages and the
client's GETs of its chunks are polls, as many as their intervals make (`poll_requests`).
Nothing here imports torch, boto3 or CDK.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ground.layout import RESULTS_PREFIX, validate_request_id
from ground.plan import StreamPlan

__all__ = [
    "DEADLINE_MARGIN_S",
    "FINAL",
    "FIRST_POLL_S",
    "POLL_MAX_S",
    "WorkerSettings",
    "admissible",
    "chunk_key",
    "chunk_sizes",
    "final_key",
    "poll_requests",
    "request_usage",
    "result_prefix",
    "seen_after",
    "step_seconds",
]

FINAL = "final.json"
"""The name of a request's whole answer under its result prefix."""
DEADLINE_MARGIN_S = 5.0
"""What a worker keeps free before its deadline: its last PUTs and its return."""
FIRST_POLL_S = 0.02
"""A reader's first wait for the next piece of an answer; it doubles while none comes..."""
POLL_MAX_S = 0.5
"""...up to this (16 tokens take longer on a CPU), and starts again after each piece."""


def seen_after(gap_s: np.ndarray) -> np.ndarray:
    """When a reader that began polling `gap_s` before a piece was written first sees it: its
    polls come at 0, FIRST_POLL_S, then after waits doubling to POLL_MAX_S (the endpoint's
    `pieces`); the first poll at or after the write. What a client's time to first token and
    last token include beyond the worker's.

    >>> seen_after(np.array([0.0, 0.05, 0.3, 2.0])).round(2).tolist()
    [0.0, 0.06, 0.3, 2.12]
    """
    gap = np.asarray(gap_s, dtype=float)
    waits = [FIRST_POLL_S]
    while waits[-1] * 2 < POLL_MAX_S:
        waits.append(waits[-1] * 2)
    early = np.concatenate([[0.0], np.cumsum(waits)])  # the polls before the waits cap
    late = early[-1] + POLL_MAX_S * np.ceil(np.maximum(gap - early[-1], 0.0) / POLL_MAX_S)
    index = np.searchsorted(early, gap, side="left")
    return np.where(index < early.size, early[np.minimum(index, early.size - 1)], late)


class WorkerSettings(BaseModel):
    """What a worker function reads from its environment (MOELAMBDA_STREAM): the plan's
    stream block, less what only planning needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slots: int = Field(ge=1)
    idle_exit_s: float = Field(gt=0)
    prefill_chunk_tokens: int = Field(ge=1)
    flush_tokens: int = Field(ge=1)
    poll_s: float = Field(gt=0)
    max_prompt_tokens: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    step_s: list[float] = Field(min_length=1)
    prefill_token_s: float = Field(gt=0)

    @classmethod
    def of_plan(cls, stream: StreamPlan) -> WorkerSettings:
        """The settings a plan's worker runs with."""
        return cls.model_validate({name: getattr(stream, name) for name in cls.model_fields})

    def env(self) -> str:
        """The compact JSON the CDK app sets as MOELAMBDA_STREAM."""
        return json.dumps(self.model_dump(), separators=(",", ":"))

    @classmethod
    def from_env(cls, text: str) -> WorkerSettings:
        """Parse MOELAMBDA_STREAM (ValueError naming the problem if it is not settings)."""
        data: Any = json.loads(text)
        return cls.model_validate(data)


def result_prefix(message_id: str) -> str:
    """Where a stream request's result chunks and final answer live (by its SQS message id)."""
    return f"{RESULTS_PREFIX}{validate_request_id(message_id)}/"


def chunk_key(message_id: str, index: int) -> str:
    """The `index`-th chunk (0: the first token) of a request's tokens."""
    if index < 0:
        raise ValueError(f"chunk index {index} < 0")
    return f"{result_prefix(message_id)}{index:05d}.json"


def final_key(message_id: str) -> str:
    """A request's whole answer, written once its sequence ended."""
    return result_prefix(message_id) + FINAL


def chunk_sizes(new_tokens: int, flush_tokens: int) -> list[int]:
    """Tokens in each chunk a worker writes for a sequence of `new_tokens` tokens: the first
    token alone, then full chunks of `flush_tokens`; what is left goes in the final answer.

    >>> chunk_sizes(1, 4), chunk_sizes(6, 4), chunk_sizes(9, 4)
    ([1], [1, 4], [1, 4, 4])
    """
    if new_tokens < 1 or flush_tokens < 1:
        raise ValueError("new_tokens and flush_tokens must be at least 1")
    return [1] + [flush_tokens] * ((new_tokens - 1) // flush_tokens)


def request_usage(new_tokens: Sequence[int], flush_tokens: int) -> dict[str, int]:
    """The requests a stream's answers cost whatever the timing: per request one SendMessage
    and one DeleteMessage, its chunk PUTs and its final PUT, and the HEAD of its final answer
    the worker makes before admitting it (`ground.stream` module docstring)."""
    chunks = sum(len(chunk_sizes(int(g), flush_tokens)) for g in new_tokens)
    n = len(new_tokens)
    return {"sqs_send": n, "sqs_delete": n, "s3_put": chunks + n, "s3_head": n}


def poll_requests(busy_s: float, idle_s: float, poll_s: float, idle_wait_s: float) -> float:
    """A worker's ReceiveMessage requests: one per `poll_s` while it decodes with a free slot,
    one per long poll of `idle_wait_s` while it has nothing to do (an estimate: the real count
    follows the timing)."""
    return busy_s / poll_s + idle_s / idle_wait_s


def step_seconds(table: Sequence[float], batch: int) -> float:
    """Seconds of one decode step of `batch` sequences, from `table[b - 1]` (the step at b
    sequences, b = 1..len(table)); past the table, extrapolated along its last segment.

    >>> step_seconds([0.1, 0.12, 0.15], 2), step_seconds([0.1, 0.12, 0.15], 5)
    (0.12, 0.21)
    """
    if not table:
        raise ValueError("the step table is empty")
    if batch < 1:
        raise ValueError(f"batch {batch} < 1")
    if batch <= len(table):
        return float(table[batch - 1])
    slope = table[-1] - table[-2] if len(table) > 1 else 0.0
    return round(float(table[-1] + slope * (batch - len(table))), 12)


def admissible(
    remaining_s: float,
    *,
    max_prompt_tokens: int,
    max_new_tokens: int,
    prefill_token_s: float,
    full_step_s: float,
    margin_s: float,
) -> bool:
    """Whether a worker with `remaining_s` before its deadline may admit another request: the
    longest admissible one (a `max_prompt_tokens` prompt, `max_new_tokens` tokens, every step
    at the full batch's time) must end `margin_s` before it."""
    longest = max_prompt_tokens * prefill_token_s + max_new_tokens * full_step_s
    return math.isfinite(longest) and longest + margin_s <= remaining_s
