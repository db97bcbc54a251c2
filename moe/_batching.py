"""Continuous batching: sequences join and leave one running decode batch between steps.

`generate_tokens` (moe._generate) decodes a fixed batch from one prefill to its last token. A
stream worker (`ground.stream`) cannot wait for that: requests arrive while others decode. This
module holds the worker's model side, `ContinuousBatch`, which owns the running sequences and
their KV cache, and advances them one *iteration* at a time:

    prefill: one chunk (at most `prefill_chunk_tokens`) of the oldest newcomer's prompt, in its
      own cache, so a long prompt delays the running sequences by one chunk per step, not by
      the whole prompt. After its last chunk its first token is sampled and its cache joins
      the batch's, in time for this iteration's decode step;
    decode: one token for every running sequence, all rows through every layer together (a
      remote expert gets a step's rows for it in one call).

This is the order the planner's simulator prices (`planner.traffic.workers`).

The batch's cache is one `GrowingCache` (`moe._kv_cache`) whose rows are the running sequences
only (a finished sequence's row is dropped, so no step computes for it). Sequences started at
different times hold different numbers of keys: each row's keys are right-aligned in a shared
column space and the columns a row does not use are holes, masked (`decode_masks`), exactly as a
left-padded batch in `generate_tokens`; columns no row uses any more are trimmed. Positions
count each row's own tokens, so a sequence sees the positions, keys and mask it would see
decoded alone, which is what the worker's tests hold it to, token for token.

Each sequence samples with its own settings and its own seeded generator, so its tokens do not
depend on which other sequences share its steps (a request retried on another worker gets the
same tokens).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from moe._decode_context import DecodeContext
from moe._generate import FinishReason, GenerationConfig, _sample, _Stops, decode_masks, finish
from moe._stages import ExpertCall, Stages, run_stages

__all__ = ["ContinuousBatch", "Emitted", "IterationTiming", "TextStream"]


@dataclass
class IterationTiming:
    """What the last `ContinuousBatch.step` computed and how long each part took: what a
    worker reports, so a run's step times can be set against the planner's table."""

    prefill_tokens: int
    prefill_s: float
    batch: int  # sequences in the decode step (0: none)
    decode_s: float


@dataclass
class Emitted:
    """What one iteration did for one sequence: its new token, and its end if it ended."""

    key: str
    token: int
    index: int  # the token's index in the sequence's output (0: the first token)
    finish_reason: FinishReason | None = None
    text: str | None = None  # the whole answer's text, once finished


@dataclass
class _Sequence:
    key: str
    prompt: list[int]
    config: GenerationConfig
    stops: _Stops
    generator: torch.Generator
    new_ids: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens already in its own cache
    cache: Any = None  # its own GrowingCache while it prefills


class ContinuousBatch:
    """The running sequences of a worker and their KV cache (see the module docstring).

    Example::

        batch = ContinuousBatch(loader, m.num_layers, experts, slots=8, pad_id=0)
        batch.admit("a", [1, 2, 3], GenerationConfig(max_new_tokens=4))
        while batch.busy:
            for emitted in batch.step():
                print(emitted.key, emitted.token, emitted.finish_reason)

    Args:
        stages: The serving stages (`StageLoader`, a function's warm cache, `model_stages`).
        num_layers: MoE layers.
        experts: The layer's expert call (local, remote or both); every row it sees is real.
        slots: Sequences held at most (running and prefilling).
        pad_id: The id of holes (never attended to, never routed).
        eos_ids: Ids that end a sequence.
        sliding_window: The model's attention window in tokens, if any.
        tokenizer: For stop strings and the answers' text (None: neither).
        prefill_chunk_tokens: Prompt tokens per prefill pass.
        device: Where the stages compute.
    """

    def __init__(
        self,
        stages: Stages,
        num_layers: int,
        experts: ExpertCall,
        *,
        slots: int,
        pad_id: int,
        eos_ids: Sequence[int] = (),
        sliding_window: int | None = None,
        tokenizer: Any = None,
        prefill_chunk_tokens: int = 256,
        device: torch.device | str = "cpu",
    ) -> None:
        if slots < 1 or prefill_chunk_tokens < 1:
            raise ValueError("slots and prefill_chunk_tokens must be at least 1")
        self.stages, self.num_layers, self.experts = stages, num_layers, experts
        self.slots, self.pad_id, self.chunk = slots, pad_id, prefill_chunk_tokens
        self.eos = set(int(e) for e in eos_ids)
        self.sliding_window, self.tokenizer = sliding_window, tokenizer
        self.device = torch.device(device)
        self.waiting: deque[_Sequence] = deque()  # admitted, prefilling in order
        self.running: list[_Sequence] = []  # decoding: row b of the cache is running[b]
        self.cache: Any = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # (rows, columns) real keys
        self.timing = IterationTiming(0, 0.0, 0, 0.0)  # of the last step

    @property
    def free(self) -> int:
        """Slots a newcomer may take."""
        return self.slots - len(self.running) - len(self.waiting)

    @property
    def busy(self) -> bool:
        """Whether any sequence is held (prefilling or decoding)."""
        return bool(self.running or self.waiting)

    @property
    def decoding(self) -> int:
        """Sequences in the decode batch."""
        return len(self.running)

    @property
    def prefill_pending(self) -> int:
        """Prompt tokens still to prefill, over every newcomer."""
        return sum(len(s.prompt) - s.prefilled for s in self.waiting)

    def admit(self, key: str, prompt: Sequence[int], config: GenerationConfig) -> None:
        """Take a sequence into a free slot; its prefill starts at the next `step`.

        Raises:
            ValueError: No free slot, an empty prompt, or a key already held.
        """
        if self.free < 1:
            raise ValueError("no free slot: admit only while `free` > 0")
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        if any(s.key == key for s in (*self.waiting, *self.running)):
            raise ValueError(f"sequence '{key}' is already held")
        self.waiting.append(
            _Sequence(
                key=key,
                prompt=[int(t) for t in prompt],
                config=config,
                stops=_Stops(config.stop, self.tokenizer),
                generator=torch.Generator().manual_seed(config.seed),
            )
        )

    @torch.inference_mode()
    def step(self) -> list[Emitted]:
        """One iteration: one prefill chunk of the oldest newcomer (its first token, if that
        was its last chunk, and it joins the batch), then a decode step of the running
        sequences. Returns what each sequence got, in that order (a sequence that joined gets
        two tokens)."""
        started = time.perf_counter()
        before = self.prefill_pending
        out = self._prefill_chunk() if self.waiting else []
        prefilled = time.perf_counter()
        self.timing = IterationTiming(before - self.prefill_pending, prefilled - started, 0, 0.0)
        if self.running:
            self.timing.batch = len(self.running)
            out += self._decode()
            self.timing.decode_s = time.perf_counter() - prefilled
        return out

    def _run(self, ids: torch.Tensor, cache: Any, valid: torch.Tensor) -> torch.Tensor:
        """The last column's logits of `ids` (B, T) over `cache`, `valid` (B, S + T)."""
        positions, mask = decode_masks(valid, ids.shape[1], self.sliding_window, torch.float32)
        rows = valid[:, -ids.shape[1] :].reshape(-1)
        context = DecodeContext(
            cache, positions.to(self.device), mask.to(self.device), rows.to(self.device)
        )
        logits = run_stages(
            self.stages, self.num_layers, ids.to(self.device), self.experts, context=context
        )
        return logits[:, -1].float().cpu()

    def _decode(self) -> list[Emitted]:
        last = torch.tensor([[s.new_ids[-1]] for s in self.running], dtype=torch.long)
        self.valid = torch.cat([self.valid, torch.ones(len(self.running), 1, dtype=torch.bool)], 1)
        logits = self._run(last, self.cache, self.valid)
        out = self._sample(self.running, logits)
        done = {e.key for e in out if e.finish_reason is not None}
        if done:
            self._drop([b for b, s in enumerate(self.running) if s.key not in done])
        return out

    def _prefill_chunk(self) -> list[Emitted]:
        from moe._kv_cache import GrowingCache

        seq = self.waiting[0]
        if seq.cache is None:
            seq.cache = GrowingCache()
        end = min(seq.prefilled + self.chunk, len(seq.prompt))
        ids = torch.tensor([seq.prompt[seq.prefilled : end]], dtype=torch.long)
        valid = torch.ones(1, end, dtype=torch.bool)
        logits = self._run(ids, seq.cache, valid)
        seq.prefilled = end
        if end < len(seq.prompt):
            return []
        self.waiting.popleft()
        (emitted,) = self._sample([seq], logits)
        if emitted.finish_reason is None:
            self._join(seq)
        seq.cache = None
        return [emitted]

    def _sample(self, seqs: list[_Sequence], logits: torch.Tensor) -> list[Emitted]:
        """Each sequence's next token from its row of `logits`, with its own settings."""
        greedy = logits.argmax(dim=-1)
        out = []
        for b, seq in enumerate(seqs):
            if seq.config.temperature == 0.0:
                token = int(greedy[b])
            else:
                token = int(_sample(logits[b : b + 1], seq.config, seq.generator)[0])
            seq.new_ids.append(token)
            ended = (
                token in self.eos
                or seq.stops.hit(seq.new_ids)
                or len(seq.new_ids) >= seq.config.max_new_tokens
            )
            emitted = Emitted(seq.key, token, len(seq.new_ids) - 1)
            if ended:
                emitted.text, emitted.finish_reason = finish(
                    seq.new_ids, self.tokenizer, seq.config, sorted(self.eos)
                )
            out.append(emitted)
        return out

    def _join(self, seq: _Sequence) -> None:
        """Add a prefilled sequence's cache as the batch's last row, right-aligned."""
        from moe._kv_cache import GrowingCache

        own = seq.cache
        width = len(seq.prompt)
        if not self.running:
            self.cache, self.valid = own, torch.ones(1, width, dtype=torch.bool)
            self.running = [seq]
            return
        columns = self.valid.shape[1]
        total = max(columns, width)
        merged = GrowingCache()
        for i, (mine, theirs) in enumerate(zip(self.cache.layers, own.layers, strict=True)):
            keys = torch.cat([_pad_left(mine.keys, total), _pad_left(theirs.keys, total)], 0)
            values = torch.cat([_pad_left(mine.values, total), _pad_left(theirs.values, total)], 0)
            merged.update(keys, values, i)
        row = torch.zeros(1, total, dtype=torch.bool)
        row[0, total - width :] = True
        valid = torch.zeros(len(self.running), total, dtype=torch.bool)
        valid[:, total - columns :] = self.valid
        self.cache, self.valid = merged, torch.cat([valid, row], 0)
        self.running.append(seq)

    def _drop(self, keep: list[int]) -> None:
        """Keep only rows `keep` of the batch; trim the columns no kept row uses."""
        from moe._kv_cache import GrowingCache

        self.running = [self.running[b] for b in keep]
        if not keep:
            self.cache, self.valid = None, torch.zeros(0, 0, dtype=torch.bool)
            return
        rows = torch.tensor(keep, dtype=torch.long)
        valid = self.valid[rows]
        used = valid.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else valid.shape[1]
        kept = GrowingCache()
        index = rows.to(self.device)
        for i, layer in enumerate(self.cache.layers):
            kept.update(
                layer.keys.index_select(0, index)[:, :, first:],
                layer.values.index_select(0, index)[:, :, first:],
                i,
            )
        self.cache, self.valid = kept, valid[:, first:]


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """(B, H, S, D) -> (B, H, width, D), zeros on the left (holes)."""
    missing = width - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], dim=2)


class TextStream:
    """A sequence's text as it grows, handed out only where later tokens cannot change it.

    Decoding a prefix of the ids can end in half a character (a byte-level token split a UTF-8
    sequence: the replacement character), in a space a later punctuation token's clean-up
    removes, or in the start of a stop string the answer will be cut before. Such a tail is
    held back; what is handed out is always a prefix of the final text (`finish`), so the
    streamed text, joined, equals the final text.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.sent = ""

    def _settled(self, text: str) -> str:
        """The part of `text` no later token can change: before a stop string it holds, else
        without a tail that could begin one; without half a character or a trailing space."""
        cuts = [i for s in self.stop if (i := text.find(s)) >= 0]
        if cuts:
            text = text[: min(cuts)]
        else:
            held = max(
                (n for s in self.stop for n in range(1, len(s)) if text.endswith(s[:n])),
                default=0,
            )
            text = text[: len(text) - held]
        return text.rstrip("\ufffd").rstrip()

    def delta(self, ids: Sequence[int]) -> str:
        """The text of `ids` (the sequence so far) not handed out yet and safe to hand out."""
        safe = self._settled(self.tokenizer.decode(list(ids), skip_special_tokens=True))
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        new, self.sent = safe[len(self.sent) :], safe
        return new

    def rest(self, final_text: str) -> str:
        """What is left of `final_text` once the sequence ended.

        Raises:
            ValueError: The text handed out is not a prefix of the final text.
        """
        if not final_text.startswith(self.sent):
            raise ValueError("the streamed text is not a prefix of the final text")
        new, self.sent = final_text[len(self.sent) :], final_text
        return new
