"""The routing-trace profiler: run the MoE model over real text and record every routing choice."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ground import __version__
from moe import LayerRouting, MoEModel
from predictor._trace import TRACE_VERSION, RoutingTrace

__all__ = ["ProfileResult", "profile_windows"]


@dataclass(frozen=True)
class ProfileResult:
    """A trace and how fast it was recorded (model forward only, not loading)."""

    trace: RoutingTrace
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.trace.num_tokens / self.seconds if self.seconds > 0 else float("inf")


def profile_windows(
    model: MoEModel,
    windows: np.ndarray,
    *,
    tokens: int,
    batch_size: int = 32,
    meta: dict[str, object] | None = None,
    advance: Callable[[int], None] | None = None,
) -> ProfileResult:
    """Run `windows` (n, T) through `model` in batches and keep the first `tokens` tokens.

    Args:
        model: The MoE model.
        windows: Token-ID windows from `make_windows`.
        tokens: How many tokens to keep (the windows may hold a few more).
        batch_size: Windows per forward pass. Defaults to 32 (4,096 tokens of 128), the
            fastest on 2 cores.
        meta: Extra metadata for the trace (corpus, seed, window).
        advance: Called with the number of tokens done after each batch (progress bars).
    """
    n_windows, length = windows.shape
    ids = torch.from_numpy(windows)
    per_batch: list[list[LayerRouting]] = []
    start = time.perf_counter()
    for first in range(0, n_windows, batch_size):
        routing: list[LayerRouting] = []
        batch = ids[first : first + batch_size]
        model.forward(batch, routing=routing, tail=False)
        per_batch.append(routing)
        if advance is not None:
            advance(batch.numel())
    seconds = time.perf_counter() - start

    def stacked(field: str, dtype: type) -> np.ndarray:
        layers = [
            torch.cat([getattr(batch[layer], field) for batch in per_batch])
            for layer in range(model.num_layers)
        ]
        return torch.stack(layers).numpy()[:, :tokens].astype(dtype)

    trace = RoutingTrace(
        meta={
            "format_version": TRACE_VERSION,
            "moelambda_version": __version__,
            "model": model.name,
            "model_type": model.family.config.model_type,
            "moefied": model.moefied,
            "moefy_seed": model.seed,
            "moefy": None if model.options is None else model.options.describe(),
            "weights": model.weights.label(),
            "layers": model.num_layers,
            "experts": model.experts,
            "top_k": model.top_k,
            "vocab_size": int(model.family.config.vocab_size),
            "tokens": tokens,
            **(meta or {}),
        },
        token_ids=windows.reshape(-1)[:tokens].astype(np.int32),
        position_ids=np.tile(np.arange(length, dtype=np.int16), n_windows)[:tokens],
        window_ids=np.repeat(np.arange(n_windows, dtype=np.int32), length)[:tokens],
        attention_ids=stacked("attention_ids", np.int32),
        experts=stacked("experts", np.uint8),
        probs=stacked("probs", np.float16),
    )
    return ProfileResult(trace, seconds)
