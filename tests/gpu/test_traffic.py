"""Routing matrices of the data-parallel split, against a per-token count."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.traffic import gpu_matrix, placement_matrix, processed, shard_counts
from predictor import RoutingTrace


def _trace(tokens: int = 600, layers: int = 3, experts: int = 4, k: int = 2) -> RoutingTrace:
    rng = np.random.default_rng(0)
    experts_chosen = np.stack(
        [
            np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
            for _ in range(layers)
        ]
    ).astype(np.uint8)
    return RoutingTrace(
        meta={"experts": experts, "model": "synthetic"},
        token_ids=rng.integers(0, 1000, tokens).astype(np.int32),
        position_ids=(np.arange(tokens) % 50).astype(np.int16),
        window_ids=(np.arange(tokens) // 50).astype(np.int32),
        attention_ids=np.zeros((layers, tokens), np.int32),
        experts=experts_chosen,
        probs=np.full((layers, tokens, k), 0.5, np.float16),
    )


def test_shard_counts_match_a_per_token_count() -> None:
    trace = _trace()
    counts = shard_counts(trace, 3)
    windows = np.unique(trace.window_ids)
    expected = np.zeros_like(counts)
    for token in range(trace.num_tokens):
        shard = int(np.searchsorted(windows, trace.window_ids[token])) * 3 // windows.size
        for layer in range(trace.num_layers):
            for e in trace.experts[layer, token]:
                expected[layer, shard, e] += 1
    np.testing.assert_array_equal(counts, expected)
    assert counts[0].sum() == trace.num_tokens * trace.top_k
    assert (counts.sum(axis=2) == 200 * 2).all()  # 12 windows of 50 tokens, 4 per shard


def test_too_few_requests_for_the_gpus() -> None:
    with pytest.raises(ValueError, match="fewer than 13 GPUs"):
        shard_counts(_trace(), 13)


def test_gpu_matrix_with_replicas_and_packing() -> None:
    counts = np.array([[10.0, 4.0, 2.0], [6.0, 0.0, 8.0]])  # 2 shards x 3 experts
    placement = [[(0, 0.5), (2, 1.0)], [(0, 0.5), (1, 1.0)]]
    share = placement_matrix(placement, 3)
    np.testing.assert_allclose(share, [[0.5, 0.5], [0.0, 1.0], [1.0, 0.0]])
    matrix = gpu_matrix(counts, placement)
    np.testing.assert_allclose(matrix, [[5 + 2, 5 + 4], [3 + 8, 3 + 0]])
    np.testing.assert_allclose(processed(counts, placement), [7 + 11, 9 + 3])
    assert matrix.sum() == counts.sum()  # every pair goes somewhere exactly once
