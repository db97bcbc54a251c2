"""Adjusted predictions: with no pairs they equal the predictor's; with pairs, a table rebuilt
with those counts written in."""

from __future__ import annotations

import numpy as np
import pytest

from ground.errors import UsageError
from predictor import BayesPredictor, CountTable, LayerTable, build_tables, make_predictor
from predictor._adjust import AdjustableBatch, Adjustment
from tests.predictor.synthetic import make_trace

TUNABLE = ("bayes-pos-soft", "bayes-token-soft", "lina-token")


def _trace(seed: int, n: int = 4000):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    tokens = rng.zipf(1.4, n) % 60
    prefer = rng.integers(0, 4, 60)
    first = np.where(rng.random((2, n)) < 0.7, prefer[tokens], rng.integers(0, 4, (2, n)))
    second = (first + 1 + rng.integers(0, 3, (2, n))) % 4
    return make_trace(tokens, np.stack([first, second], axis=2), vocab=60, window=8)


def _written(tables: CountTable, pred: AdjustableBatch, adj: Adjustment) -> CountTable:
    """The tables with every pair written in by hand: entries of the key dropped, one added."""
    adj = adj.last_wins()
    layer, token, position, expert = pred.space.unpack(adj.keys)
    out = []
    for i, t in enumerate(tables.layers):
        keys, counts = t.keys, t.counts
        for j in np.flatnonzero(layer == i):
            same = (t.token == token[j]) & (t.expert == expert[j])
            if pred.space.positions > 1:
                same &= t.position == position[j]
            keep = ~np.isin(keys, t.keys[same])
            keys, counts = keys[keep], counts[keep]
            if adj.values[j] > 0:
                new = ((token[j] * t.positions + position[j]) * t.vocab) * t.experts + expert[j]
                keys, counts = np.r_[keys, new], np.r_[counts, int(adj.values[j])]
            order = np.argsort(keys)
            keys, counts = keys[order], counts[order]
            t = LayerTable(keys, counts, t.vocab, t.positions, t.experts, t.top_k)
        out.append(t)
    return CountTable(tables.meta, out)


@pytest.mark.parametrize("method", TUNABLE)
def test_no_adjustment_is_the_predictor_itself(method: str) -> None:
    profile, batch = _trace(0), _trace(1, 800)
    predictor = make_predictor(method).fit(build_tables(profile), profile)
    adjustable = AdjustableBatch(predictor, batch)
    np.testing.assert_allclose(
        adjustable.counts(), predictor.predict(batch).counts, rtol=1e-12, atol=1e-9
    )


@pytest.mark.parametrize("method", TUNABLE)
@pytest.mark.parametrize("seed", range(3))
def test_adjusted_prediction_equals_a_table_with_the_pairs_written_in(
    method: str, seed: int
) -> None:
    profile, batch = _trace(0), _trace(1, 800)
    tables = build_tables(profile)
    predictor = make_predictor(method).fit(tables, profile)
    adjustable = AdjustableBatch(predictor, batch)
    rng = np.random.default_rng(seed)
    q = 40
    s = adjustable.space
    keys = s.pack(
        rng.integers(0, s.layers, q),
        rng.integers(0, s.vocab, q),
        rng.integers(0, s.positions, q),
        rng.integers(0, s.experts, q),
    )
    keys[-5:] = keys[:5]  # rewritten keys: the last value wins
    adj = Adjustment(keys, rng.integers(0, 17, q).astype(float))
    got = adjustable.counts(adj)
    reference = make_predictor(method).fit(_written(tables, adjustable, adj), profile)
    assert isinstance(reference, BayesPredictor) and isinstance(predictor, BayesPredictor)
    reference.fallback = predictor.fallback  # the unseen-token prior stays the profile's
    np.testing.assert_allclose(got, reference.predict(batch).counts, rtol=1e-9, atol=1e-9)
    assert not np.allclose(got, adjustable.counts())  # the pairs did change the prediction


def test_current_values_are_the_table_counts_summed_over_attention() -> None:
    profile = _trace(0)
    tables = build_tables(profile)
    predictor = make_predictor("bayes-pos-soft").fit(tables, profile)
    adjustable = AdjustableBatch(predictor, _trace(1, 800))
    t = tables.layers[1]
    i = int(np.argmax(t.counts))
    key = adjustable.space.pack(1, t.token[i], t.position[i], t.expert[i])
    same = (t.token == t.token[i]) & (t.position == t.position[i]) & (t.expert == t.expert[i])
    assert adjustable.current_values(np.array([key]))[0] == t.counts[same].sum()
    adj = Adjustment(np.array([key]), np.array([float(t.counts[same].sum())]))
    np.testing.assert_allclose(adjustable.counts(adj), adjustable.counts())  # a no-op write


@pytest.mark.parametrize("method", ["bayes", "history", "lina-path"])
def test_predictors_bo_cannot_tune_are_refused(method: str) -> None:
    profile = _trace(0)
    predictor = make_predictor(method).fit(build_tables(profile), profile)
    with pytest.raises(UsageError, match="cannot be tuned"):
        AdjustableBatch(predictor, _trace(1, 800))
