"""Hand-made routing traces with known answers, for the predictor tests."""

from __future__ import annotations

import numpy as np

from predictor import TRACE_VERSION, RoutingTrace


def make_trace(
    tokens: np.ndarray,
    experts: np.ndarray,
    *,
    attention: np.ndarray | None = None,
    num_experts: int = 4,
    window: int = 4,
    vocab: int = 16,
    model: str = "synthetic",
) -> RoutingTrace:
    """A trace of windows of `window` tokens; `experts` is (L, N, k), attention (L, N)."""
    n = tokens.size
    layers = experts.shape[0]
    if attention is None:
        attention = np.broadcast_to(tokens, (layers, n))
    meta = {
        "format_version": TRACE_VERSION,
        "model": model,
        "experts": num_experts,
        "top_k": int(experts.shape[2]),
        "layers": layers,
        "vocab_size": vocab,
        "window": window,
        "tokens": n,
    }
    return RoutingTrace(
        meta=meta,
        token_ids=tokens.astype(np.int32),
        position_ids=(np.arange(n) % window).astype(np.int16),
        window_ids=(np.arange(n) // window).astype(np.int32),
        attention_ids=np.ascontiguousarray(attention, dtype=np.int32),
        experts=experts.astype(np.uint8),
        probs=np.full(experts.shape, 1.0 / experts.shape[2], dtype=np.float16),
    )
