"""Routing traces: invariants on real MiniLM routing, storage round trip, and bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ground.errors import OutputExistsError, TraceError
from moe import MoEModel
from predictor import RoutingTrace, profile_windows


@pytest.fixture(scope="module")
def trace(minilm: MoEModel, wiki_windows: np.ndarray) -> RoutingTrace:
    return profile_windows(minilm, wiki_windows, tokens=500, batch_size=2).trace


def test_counts_sum_to_tokens_times_k(trace: RoutingTrace) -> None:
    popularity = trace.popularity()
    assert popularity.shape == (6, 4)
    assert (popularity.sum(axis=1) == 500 * 2).all()
    # Real routing is skewed, not uniform: the busiest expert of some layer takes 1.2x its share.
    assert (popularity.max(axis=1) > 1.2 * 500 * 2 / 4).any()


def test_top_k_experts_are_distinct_and_probabilities_ordered(trace: RoutingTrace) -> None:
    assert (trace.experts[..., 0] != trace.experts[..., 1]).all()
    assert (trace.probs[..., 0] >= trace.probs[..., 1]).all()
    assert ((trace.probs > 0) & (trace.probs <= 1)).all()


def test_attention_id_is_a_token_of_the_same_window(
    trace: RoutingTrace, wiki_windows: np.ndarray
) -> None:
    for layer in range(trace.num_layers):
        for w in np.unique(trace.window_ids):
            in_window = trace.window_ids == w
            assert np.isin(trace.attention_ids[layer, in_window], wiki_windows[w]).all()
    assert (trace.position_ids[:128] == np.arange(128)).all()
    assert (trace.token_ids[:128] == wiki_windows[0]).all()


def test_same_seed_same_trace(
    minilm: MoEModel, wiki_windows: np.ndarray, trace: RoutingTrace
) -> None:
    again = profile_windows(minilm, wiki_windows, tokens=500, batch_size=4).trace
    for name in ("token_ids", "attention_ids", "experts", "probs"):
        assert np.array_equal(getattr(trace, name), getattr(again, name))


def test_round_trip_and_overwrite_protection(trace: RoutingTrace, tmp_path: Path) -> None:
    path = trace.save(tmp_path / "t")
    assert path.stat().st_size < 500 * (12 + 6 * 7 * 2)
    loaded = RoutingTrace.load(tmp_path / "t")
    assert loaded.meta == trace.meta
    assert np.array_equal(loaded.experts, trace.experts)
    with pytest.raises(OutputExistsError):
        trace.save(tmp_path / "t")
    trace.save(tmp_path / "t", force=True)


def test_bad_trace_files(trace: RoutingTrace, tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="missing"):
        RoutingTrace.load(tmp_path)
    (tmp_path / "trace.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceError, match="not a readable"):
        RoutingTrace.load(tmp_path)
    old = RoutingTrace(**{**trace.__dict__, "meta": {**trace.meta, "format_version": 99}})
    old.save(tmp_path / "old")
    with pytest.raises(TraceError, match="version 99"):
        RoutingTrace.load(tmp_path / "old")
