"""Generation: prefill, then decode steps with a KV cache, through the one layer loop.

A decoder's request is its prompt (one pass over every prompt token, the *prefill*) followed by
decode steps, each one new token per unfinished sequence through every layer. The stages are the
serving stages (`moe.run_stages`): what differs from a forward pass is the `DecodeContext` each
layer's attention block reads, which carries the KV cache, the tokens' positions and the mask.

Several sequences decode together. Prompts are left-padded to one length, so every sequence's
next token sits in the same column; a padded (or finished) position is a *hole*: no query
attends to it, and its row goes to no expert (a remote expert is never invoked for padding).
Positions count each sequence's own tokens, so a padded prompt sees the positions it would see
alone. This is the layout Hugging Face `generate` uses for a left-padded batch, which the
tests hold it to token for token.

Sampling is greedy at temperature 0, else temperature and nucleus (top-p) sampling from one
seeded generator. A sequence stops at an end-of-sequence token, at a stop string (its text ends
before the stop string) or after `max_new_tokens`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ground.errors import UsageError
from moe._decode_context import DecodeContext
from moe._stages import ExpertCall, LayerOutput, Stages, run_stages

__all__ = [
    "Generated",
    "GenerationConfig",
    "Step",
    "decode_masks",
    "eos_ids",
    "finish",
    "generate_tokens",
    "generation_request",
]

FinishReason = Literal["eos", "stop", "length"]


class GenerationConfig(BaseModel):
    """How to sample and when to stop (the request's `generate` block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(64, gt=0)
    temperature: float = Field(0.0, ge=0.0)  # 0: greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    stop: tuple[str, ...] = ()


def generation_request(raw: Any, vocab_size: int) -> tuple[list[list[int]], GenerationConfig]:
    """The prompts and settings of a generation request (`{"prompts": [[ids], ...], ...the
    GenerationConfig fields}`), checked: a driver must refuse what would fail mid-request.

    Raises:
        UsageError: Not a mapping, no prompts, an empty prompt, an id outside the vocabulary,
            or settings `GenerationConfig` refuses.
    """
    fix = 'send {"prompts": [[ids of prompt 1], ...], "max_new_tokens": N, ...}.'
    if not isinstance(raw, dict):
        raise UsageError("the generate request is not a JSON object.", fix)
    prompts = raw.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise UsageError("the generate request has no prompts.", fix)
    checked = []
    for i, prompt in enumerate(prompts):
        ok = isinstance(prompt, list) and all(type(t) is int for t in prompt)
        if not ok or not prompt or not all(0 <= t < vocab_size for t in prompt):
            raise UsageError(
                f"prompt {i} is not a non-empty list of token ids below {vocab_size:,}.", fix
            )
        checked.append(prompt)
    try:
        settings = GenerationConfig.model_validate(
            {k: v for k, v in raw.items() if k != "prompts"}
        )
    except ValidationError as err:
        raise UsageError(f"the generate request's settings are invalid: {err}", fix) from err
    return checked, settings


def eos_ids(config: Any) -> list[int]:
    """The model's end-of-sequence ids (its config's `eos_token_id`: one, a list, or none)."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])]


@dataclass
class Step:
    """One step's outcome, as `generate_tokens` hands it to its `on_step` observer."""

    index: int  # 0: the prefill's token
    tokens: torch.Tensor  # (B,) the token each sequence got (meaningless where not `active`)
    active: torch.Tensor  # (B,) bool: sequences that got a token this step
    seconds: float  # since generation started


@dataclass
class Generated:
    """One sequence's result."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    ttft_s: float
    tpot_s: float | None  # None with one token
    step_times: list[float] = field(default_factory=list)


def decode_masks(
    valid: torch.Tensor, new: int, sliding_window: int | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (B, new) and the additive mask (B, 1, new, S) of the last `new` columns.

    `valid` (B, S) marks the real tokens among all S keys (cached and new). A query sees the real
    keys at or before its column, within the sliding window counted in its own tokens.
    """
    count = valid.long().cumsum(dim=1)  # real tokens up to each column
    positions = (count - 1).clamp(min=0)[:, -new:]
    length = valid.shape[1]
    key = torch.arange(length)
    query = key[-new:]
    allowed = (key[None, :] <= query[:, None])[None] & valid[:, None, :]
    if sliding_window is not None:
        own = count[:, -new:, None] - count[:, None, :]  # the query's tokens after each key
        allowed &= own < sliding_window
    mask = torch.zeros(valid.shape[0], new, length, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return positions, mask[:, None]


def _only_rows(experts: ExpertCall, rows: torch.Tensor) -> ExpertCall:
    """`experts` on the real rows only; holes get a zero expert sum."""

    def call(layer: int, out: LayerOutput) -> torch.Tensor:
        if bool(rows.all()):
            return experts(layer, out)
        kept = LayerOutput(
            out.residual,
            out.ffn_in[rows],
            out.experts[rows],
            out.weights[rows],
            out.probs[rows],
        )
        total = out.ffn_in.new_zeros(out.ffn_in.shape)
        if kept.ffn_in.shape[0]:
            total[rows] = experts(layer, kept)
        return total

    return call


def _sample(
    logits: torch.Tensor, config: GenerationConfig, generator: torch.Generator
) -> torch.Tensor:
    """(B, V) logits -> (B,) tokens: argmax at temperature 0, else top-p sampling."""
    if config.temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.double() / config.temperature, dim=-1)
    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # the mass ranked above each token
    ordered = ordered.masked_fill(before >= config.top_p, 0.0)  # the first token always stays
    pick = torch.multinomial(ordered, 1, generator=generator)
    return order.gather(1, pick)[:, 0]


class _Stops:
    """Stop strings, checked on the tail of each new token's text (a token adds >= 1 char)."""

    def __init__(self, stop: Sequence[str], tokenizer: Any) -> None:
        if stop and tokenizer is None:
            raise ValueError("stop strings need the model's tokenizer")
        self.stop = [s for s in stop if s]
        self.tokenizer = tokenizer
        self.window = max((len(s) for s in self.stop), default=0) + 1

    def hit(self, new_ids: list[int]) -> bool:
        if not self.stop:
            return False
        text = self.tokenizer.decode(new_ids[-self.window :], skip_special_tokens=True)
        return any(s in text for s in self.stop)


def finish(
    new_ids: Sequence[int], tokenizer: Any, config: GenerationConfig, eos_ids: Sequence[int]
) -> tuple[str, FinishReason]:
    """A sequence's text, cut before its first stop string, and why it ended: the one rule the
    in-process loop and a deployment's client apply to the ids a driver returns."""
    text = "" if tokenizer is None else tokenizer.decode(new_ids, skip_special_tokens=True)
    cuts = [i for s in config.stop if s and (i := text.find(s)) >= 0]
    if cuts:
        return text[: min(cuts)], "stop"
    if new_ids and new_ids[-1] in set(eos_ids):
        return text, "eos"
    return text, "length"


@torch.inference_mode()
def generate_tokens(
    stages: Stages,
    num_layers: int,
    prompts: Sequence[Sequence[int]],
    experts: ExpertCall,
    config: GenerationConfig,
    *,
    pad_id: int,
    eos_ids: Sequence[int] = (),
    sliding_window: int | None = None,
    tokenizer: Any = None,
    on_step: Callable[[Step], None] | None = None,
) -> list[Generated]:
    """Generate for every prompt together: one prefill pass, then one decode step per token.

    Example::

        loader = StageLoader(export_dir)
        m = loader.manifest
        out = generate_tokens(
            loader, m.num_layers, [[1, 2, 3]], local_experts(loader.expert, m.experts,
            m.hidden_size), GenerationConfig(max_new_tokens=8), pad_id=0)

    Args:
        stages: The serving stages (`StageLoader`, a function's warm cache, `model_stages`).
        num_layers: MoE layers.
        prompts: Token ids per sequence, each non-empty.
        experts: The layer's expert call (local, remote, or both); it sees real rows only.
        config: Sampling and stopping.
        pad_id: The id written into holes (never attended to, never routed).
        eos_ids: Ids that end a sequence (kept as its last token, as Hugging Face does).
        sliding_window: The model's attention window in tokens, if any.
        tokenizer: Decodes the text and checks stop strings (None: no text).
        on_step: Called after every step with the tokens it produced (streaming).

    Returns:
        One `Generated` per prompt, in order.
    """
    from moe._kv_cache import GrowingCache

    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    started = time.perf_counter()
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        valid[b, width - len(prompt) :] = True
    cache = GrowingCache()
    generator = torch.Generator().manual_seed(config.seed)
    stops = _Stops(config.stop, tokenizer)
    eos = torch.as_tensor(list(eos_ids), dtype=torch.long)
    new_ids: list[list[int]] = [[] for _ in prompts]
    times: list[list[float]] = [[] for _ in prompts]
    active = torch.ones(batch, dtype=torch.bool)
    step_input, step_valid = ids, valid
    for step in range(config.max_new_tokens):
        positions, mask = decode_masks(valid, step_input.shape[1], sliding_window, torch.float32)
        context = DecodeContext(cache, positions, mask, step_valid.reshape(-1))
        logits = run_stages(
            stages, num_layers, step_input, _only_rows(experts, context.rows), context=context
        )
        tokens = _sample(logits[:, -1].float(), config, generator)
        now = time.perf_counter() - started
        got = active.clone()
        for b in got.nonzero().flatten().tolist():
            token = int(tokens[b])
            new_ids[b].append(token)
            times[b].append(now)
            if (eos.numel() and bool((eos == token).any())) or stops.hit(new_ids[b]):
                active[b] = False
        if on_step is not None:
            on_step(Step(step, tokens, got, now))
        if not bool(active.any()):
            break
        step_input = torch.where(active, tokens, pad_id)[:, None]
        step_valid = active[:, None]
        valid = torch.cat([valid, step_valid], dim=1)
    results = []
    for b in range(batch):
        text, why = finish(new_ids[b], tokenizer, config, eos_ids)
        t = times[b]
        results.append(
            Generated(
                token_ids=new_ids[b],
                text=text,
                finish_reason=why,
                ttft_s=t[0],
                tpot_s=(t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None,
                step_times=t,
            )
        )
    return results
