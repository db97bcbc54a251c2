"""Count tables: counts equal a brute-force tally, the views decode keys, storage round trips."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ground.errors import TraceError
from predictor import CountTable, build_tables

from .synthetic import make_trace


@pytest.fixture()
def random_trace():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    n, layers, e = 64, 2, 4
    experts = np.stack([rng.permutation(e)[:2] for _ in range(layers * n)]).reshape(layers, n, 2)
    return make_trace(
        rng.integers(0, 16, n), experts, attention=rng.integers(0, 16, (layers, n)), window=8
    )


def test_counts_equal_a_brute_force_tally(random_trace) -> None:  # type: ignore[no-untyped-def]
    tables = build_tables(random_trace)
    for layer, table in enumerate(tables.layers):
        expected = Counter()
        for t in range(random_trace.num_tokens):
            for e in random_trace.experts[layer, t]:
                key = (
                    int(random_trace.token_ids[t]),
                    int(random_trace.position_ids[t]),
                    int(random_trace.attention_ids[layer, t]),
                    int(e),
                )
                expected[key] += 1
        got = dict(
            zip(
                zip(
                    table.token.tolist(),
                    table.position.tolist(),
                    table.attention.tolist(),
                    table.expert.tolist(),
                    strict=True,
                ),
                table.counts.tolist(),
                strict=True,
            )
        )
        assert got == dict(expected)
        assert np.all(np.diff(table.keys) > 0)
        assert table.token_expert.sum() == random_trace.num_tokens * 2


def test_round_trip_and_mismatch(random_trace, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tables = build_tables(random_trace)
    tables.save(tmp_path / "t")
    loaded = CountTable.load(tmp_path / "t")
    assert loaded.meta == tables.meta
    for a, b in zip(loaded.layers, tables.layers, strict=True):
        assert np.array_equal(a.keys, b.keys) and np.array_equal(a.counts, b.counts)
    other = make_trace(random_trace.token_ids, random_trace.experts, num_experts=8, window=8)
    with pytest.raises(TraceError, match="experts = 4, but the trace has 8"):
        loaded.check_matches(other)
    (tmp_path / "bad.npz").write_bytes(b"not a table")
    with pytest.raises(TraceError, match="not a readable count table"):
        CountTable.load(tmp_path / "bad.npz")


def test_rare_prior_is_the_routing_of_rare_tokens() -> None:
    # Token 1 appears 4 times (always expert 0); tokens 2 and 3 once each (experts 2 and 3).
    tokens = np.array([1, 1, 1, 1, 2, 3])
    experts = np.array([0, 0, 0, 0, 2, 3])[None, :, None]
    layer = build_tables(make_trace(tokens, experts, window=2)).layers[0]
    assert np.allclose(layer.prior, [4 / 6, 0, 1 / 6, 1 / 6])
    assert np.allclose(layer.rare_prior(1), [0, 0, 0.5, 0.5])
    assert np.allclose(layer.rare_prior(4), layer.prior)
