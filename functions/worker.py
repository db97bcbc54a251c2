"""Generation worker: one invocation serves the request queue with continuous batching.

The queue's event source mapping starts a worker with one message when messages wait and fewer
than the plan's workers run; the worker then fills its other slots itself, between decode
steps, and decodes every sequence it holds together (`moe.ContinuousBatch`), with its local
experts in process and its remote ones invoked once per layer per step, all of that step's rows
at once (`functions.driver.RemoteExperts`). What it does, waits for and is billed for is
`ground.stream`'s; its settings are the plan's stream block (MOELAMBDA_STREAM).

A message is `{"prompt": [token ids], "settings": {GenerationConfig fields}}`
(`functions.openai_api.message_body`). Its answer goes under `results/<message id>/`: numbered
chunks as tokens come (`ground.stream.chunk_key`), each with its token ids and the text they
settle (`moe.TextStream`), then the final answer (`ground.stream.final_key`), after which the
message is deleted. Its routing goes where a gate's goes (`functions.metrics`, which `replan`
reads), summed per layer over the invocation: a record per layer per decode step would cost
more in logs, and in time, than the step. The message that started the worker is the
mapping's: it deletes it when the worker returns (a worker that fails leaves it, as it leaves
those it received itself, to come back after the visibility timeout). A message that is not a
request gets a final answer with its error (no retry would make it one) and is deleted.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Building the stages needs Hugging Face's model classes: their import belongs to INIT.
import transformers.modeling_utils  # noqa: F401
from botocore.exceptions import ClientError

from functions import config, metrics, warm, weights
from functions.common import s3_client, use_lambda_threads
from functions.driver import DriverStages, RemoteExperts
from ground import stream
from ground.errors import UsageError
from ground.layout import validate_request_id
from moe import ContinuousBatch, Emitted, TextStream, eos_ids, generation_request
from pipeline.transports import is_missing

__all__ = ["handler"]

_RECEIVE_MAX = 10  # SQS's most messages per ReceiveMessage
_LONG_POLL_MAX_S = 20  # SQS's longest WaitTimeSeconds


@dataclass
class _Held:
    """A request the worker holds: its message, the tokens not yet written, its text."""

    message_id: str
    receipt: str
    from_event: bool  # the mapping's message: the mapping deletes it
    prompt_tokens: int
    text: TextStream
    ids: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    chunks: int = 0


class _Clock:
    """Seconds left before the invocation's deadline (Lambda's context, or the local runner's
    stand-in for it)."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def remaining_s(self) -> float:
        return float(self._context.get_remaining_time_in_millis()) / 1000.0


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"Records": [the mapping's SQS message]} -> {"batchItemFailures": [], "served": N}.

    Returns when it has held nothing and received nothing for `idle_exit_s`, or when it may no
    longer admit (the deadline) and has finished what it held.
    """
    if warm.is_ping(event):
        return warm.answer("worker")
    cfg = config.current()
    use_lambda_threads(cfg)
    settings = stream.WorkerSettings.from_env(cfg.setting("MOELAMBDA_STREAM"))
    queue = cfg.setting("MOELAMBDA_QUEUE_URL")
    s3 = s3_client()
    loader = weights.loader(s3, cfg.bucket, cfg.weights_prefix)
    manifest, family = loader.manifest, loader.family
    local = cfg.driver_local
    # One function holds every expert: no remote table in its environment, none to invoke.
    no_remote: list[list[Any]] = [[] for _ in range(manifest.num_layers)]
    remote_event = json.loads(cfg.setting("MOELAMBDA_REMOTE")) if _has_remote(cfg) else no_remote
    remote = config.remote_plan(remote_event, manifest.num_layers, local, manifest.experts)
    stages = DriverStages(s3, cfg.bucket, cfg.weights_prefix)
    invocation = validate_request_id(getattr(context, "aws_request_id", None) or uuid.uuid4().hex)
    routed = np.zeros((manifest.num_layers, manifest.experts), dtype=np.int64)
    call = RemoteExperts(s3, cfg, invocation, manifest, local, remote, stages, counts=routed)
    call.decoding = True  # a prefill chunk's rows are few too: one replica unless they overflow
    batch = ContinuousBatch(
        stages,
        manifest.num_layers,
        call,
        slots=settings.slots,
        pad_id=0,
        eos_ids=eos_ids(family.config),
        sliding_window=getattr(family.config, "sliding_window", None),
        tokenizer=loader.tokenizer,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        device=cfg.placement.device,
    )
    worker = _Worker(s3, _sqs(), cfg.bucket, queue, settings, batch, loader, _Clock(context))
    try:
        for record in event.get("Records", []):
            worker.take(record["messageId"], record["receiptHandle"], record["body"], True)
        worker.serve()
    finally:
        call.close()
        for layer, counts in enumerate(routed):  # the invocation's routing, as a gate's
            if counts.any():
                record = metrics.expert_counts_record(layer, counts, invocation)
                metrics.emit(record, cfg.metrics_file)
    return {"batchItemFailures": [], "served": worker.served}


def _has_remote(cfg: config.Config) -> bool:
    try:
        cfg.setting("MOELAMBDA_REMOTE")
    except config.ConfigError:
        return False
    return True


def _sqs() -> Any:
    """The worker's SQS client (its own identity locally, as `functions.batcher`'s)."""
    from functions.batcher import _client

    return _client("sqs")


class _Worker:
    """The admission, step and result loop of one invocation."""

    def __init__(
        self,
        s3: Any,
        sqs: Any,
        bucket: str,
        queue: str,
        settings: stream.WorkerSettings,
        batch: ContinuousBatch,
        loader: Any,
        clock: _Clock,
    ) -> None:
        self.s3, self.sqs, self.bucket, self.queue = s3, sqs, bucket, queue
        self.settings, self.batch, self.loader, self.clock = settings, batch, loader, clock
        self.vocab = int(loader.family.config.vocab_size)
        self.held: dict[str, _Held] = {}
        self.served = 0
        self.metrics_file = config.current().metrics_file
        self.last_poll = -float("inf")

    def admitting(self) -> bool:
        """Whether the longest admissible request would still end before the deadline."""
        s = self.settings
        return stream.admissible(
            self.clock.remaining_s(),
            max_prompt_tokens=s.max_prompt_tokens,
            max_new_tokens=s.max_new_tokens,
            prefill_token_s=s.prefill_token_s,
            full_step_s=stream.step_seconds(s.step_s, s.slots),
            margin_s=stream.DEADLINE_MARGIN_S,
        )

    def serve(self) -> None:
        idle_since = time.monotonic()
        while True:
            admitting = self.admitting()
            now = time.monotonic()
            if admitting and self.batch.free > 0:
                if not self.batch.busy:
                    left = self.settings.idle_exit_s - (now - idle_since)
                    if left <= 0:
                        return
                    # a long poll of whole seconds: up to one past the idle exit, never a spin
                    self._receive(wait_s=min(_LONG_POLL_MAX_S, math.ceil(left)))
                elif now - self.last_poll >= self.settings.poll_s:
                    self._receive(wait_s=0)
            if self.batch.busy:
                for emitted in self.batch.step():
                    self._emit(emitted)
                self._report()
                idle_since = time.monotonic()
            elif not admitting:
                return

    def _report(self) -> None:
        """The iteration's prefill and decode step, where the metrics go (stdout on Lambda):
        the step time at each batch size, as a run measures it."""
        t = self.batch.timing
        record = {
            "kind": "worker_iteration",
            "prefill_tokens": t.prefill_tokens,
            "prefill_s": round(t.prefill_s, 6),
            "batch": t.batch,
            "decode_s": round(t.decode_s, 6),
        }
        metrics.emit(record, self.metrics_file)

    def _receive(self, wait_s: int) -> None:
        self.last_poll = time.monotonic()
        got = self.sqs.receive_message(
            QueueUrl=self.queue,
            MaxNumberOfMessages=min(_RECEIVE_MAX, self.batch.free),
            WaitTimeSeconds=wait_s,
        ).get("Messages", [])
        for message in got:
            self.take(message["MessageId"], message["ReceiptHandle"], message["Body"], False)

    def take(self, message_id: str, receipt: str, body: str, from_event: bool) -> None:
        """Admit a message's request, or answer it at once: a duplicate (its final answer
        exists) is deleted, a message that is not a request gets its error as its answer."""
        if self._answered(message_id):
            self._delete(receipt, from_event)
            return
        try:
            prompt, settings = _request(body, self.vocab, self.settings)
        except UsageError as error:
            self._put(stream.final_key(message_id), {"error": str(error), "token_ids": []})
            self._delete(receipt, from_event)
            return
        self.held[message_id] = _Held(
            message_id,
            receipt,
            from_event,
            len(prompt),
            TextStream(self.loader.tokenizer, settings.stop),
        )
        self.batch.admit(message_id, prompt, settings)

    def _answered(self, message_id: str) -> bool:
        """Whether the message's final answer exists (one HEAD request)."""
        key = stream.final_key(message_id)
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if is_missing(self.s3, self.bucket, key, error):
                return False
            raise
        return True

    def _emit(self, emitted: Emitted) -> None:
        held = self.held[emitted.key]
        held.ids.append(emitted.token)
        held.pending.append(emitted.token)
        if emitted.index == 0 or len(held.pending) == self.settings.flush_tokens:
            self._put(
                stream.chunk_key(held.message_id, held.chunks),
                {"token_ids": held.pending, "text": held.text.delta(held.ids)},
            )
            held.chunks += 1
            held.pending = []
        if emitted.finish_reason is None:
            return
        text = emitted.text or ""
        final = {
            "token_ids": held.ids,
            "text": text,
            "finish_reason": emitted.finish_reason,
            "chunks": held.chunks,
            "tail": {"token_ids": held.pending, "text": held.text.rest(text)},
            "usage": {"prompt_tokens": held.prompt_tokens, "completion_tokens": len(held.ids)},
        }
        self._put(stream.final_key(held.message_id), final)
        self._delete(held.receipt, held.from_event)
        del self.held[emitted.key]
        self.served += 1

    def _put(self, key: str, document: dict[str, Any]) -> None:
        body = json.dumps(document, separators=(",", ":")).encode()
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)

    def _delete(self, receipt: str, from_event: bool) -> None:
        if not from_event:  # the mapping deletes its own message when the worker returns
            self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=receipt)


def _request(body: str, vocab: int, settings: stream.WorkerSettings) -> tuple[list[int], Any]:
    """A message's prompt and sampling settings, within the plan's limits.

    Raises:
        UsageError: Not a request, or past the plan's longest prompt or generation.
    """
    fix = "send what the endpoint sends: {'prompt': [ids], 'settings': {...}}."
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as err:
        raise UsageError(f"the message is not JSON: {err}", fix) from err
    if not isinstance(raw, dict) or not isinstance(raw.get("settings", {}), dict):
        raise UsageError("the message is not a JSON object with a prompt.", fix)
    (prompt,), config_ = generation_request(
        {"prompts": [raw.get("prompt")], **raw.get("settings", {})}, vocab
    )
    if len(prompt) > settings.max_prompt_tokens:
        raise UsageError(
            f"the prompt has {len(prompt):,} tokens, over the plan's "
            f"{settings.max_prompt_tokens:,}.",
            "send a shorter prompt, or plan for longer ones.",
        )
    if config_.max_new_tokens > settings.max_new_tokens:
        raise UsageError(
            f"max_tokens {config_.max_new_tokens:,} is over the plan's "
            f"{settings.max_new_tokens:,}.",
            "ask for fewer tokens, or plan for longer generations.",
        )
    return prompt, config_
