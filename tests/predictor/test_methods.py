"""Predictors: eq. (1) against a brute-force computation, MAP picks, fallbacks, and baselines that
recover known answers on synthetic routing."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ground.errors import UsageError
from predictor import METHODS, BayesPredictor, build_tables, make_predictor, score

from .synthetic import make_trace


def _brute_force_eq1(profile, batch, layer: int) -> dict[int, np.ndarray]:  # type: ignore[no-untyped-def]
    """Eq. (1) term by term from raw counts, with P'(f2) uniform and P'(f3) the batch frequency."""
    e, positions = profile.num_experts, int(profile.meta["window"])
    c4: Counter = Counter()
    for t in range(profile.num_tokens):
        f = (
            int(profile.token_ids[t]),
            int(profile.position_ids[t]),
            int(profile.attention_ids[layer, t]),
        )
        for i in profile.experts[layer, t]:
            c4[(*f, int(i))] += 1
    c3: Counter = Counter()
    c2: Counter = Counter()
    c1: Counter = Counter()
    for (f1, f2, f3, _), c in c4.items():
        c3[(f1, f2, f3)] += c
        c2[(f1, f2)] += c
        c1[f1] += c
    total = sum(c4.values())
    freq = Counter(batch.token_ids.tolist())
    p_f3 = {t: freq[t] / batch.num_tokens for t in freq}
    out = {}
    for f1 in set(batch.token_ids.tolist()):
        post = np.zeros(e)
        for (g1, f2, f3, i), c in c4.items():
            if g1 != f1:
                continue
            p_i = c / c3[(f1, f2, f3)]
            w3 = (c3[(f1, f2, f3)] / total) * p_f3.get(f3, 0.0) / (c2[(f1, f2)] / total)
            w2 = (c2[(f1, f2)] / total) * (1 / positions) / (c1[f1] / total)
            post[i] += p_i * w3 * w2
        out[f1] = post / post.sum()
    return out


def test_posterior_equals_brute_force_eq1() -> None:
    rng = np.random.default_rng(7)
    n, layers, e, vocab = 96, 2, 4, 6
    tokens = rng.integers(0, vocab, n)
    attention = rng.choice(vocab, (layers, n), p=[0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
    experts = np.stack([rng.permutation(e)[:2] for _ in range(layers * n)]).reshape(layers, n, 2)
    profile = make_trace(tokens, experts, attention=attention, window=8, vocab=vocab)
    batch_tokens = np.r_[np.arange(vocab), rng.integers(0, vocab, 26)]
    batch = make_trace(batch_tokens, np.zeros((layers, 32, 2), int), window=8, vocab=vocab)

    bayes = BayesPredictor(name="t", soft=True, attention_smoothing=0.0)
    bayes.fit(build_tables(profile), profile)
    inverse, _, posteriors = bayes.posteriors(batch)
    row_of = {int(t): int(r) for t, r in zip(batch.token_ids, inverse, strict=True)}
    for layer in range(layers):
        expected = _brute_force_eq1(profile, batch, layer)
        for token, p in expected.items():
            np.testing.assert_allclose(posteriors[layer][row_of[token]], p, atol=1e-12)


def _hand_table():  # type: ignore[no-untyped-def]
    """Token 5 picks (2, 0) three times and (1, 3) once; token 6 always (3, 1)."""
    pairs = [(2, 0), (2, 0), (2, 0), (1, 3), (3, 1), (3, 1)]
    tokens = np.array([5, 5, 5, 5, 6, 6])
    return make_trace(tokens, np.array(pairs)[None], window=2)


def test_map_picks_the_right_experts() -> None:
    profile = _hand_table()
    batch = make_trace(np.array([5] * 10 + [6] * 2), np.zeros((1, 12, 2), int), window=2)
    hard = make_predictor("bayes").fit(build_tables(profile), profile).predict(batch)
    assert hard.topk[0, 0].tolist() == [0, 2]  # tie 3/8 each, broken by expert index
    assert hard.topk[0, -1].tolist() == [1, 3]
    assert hard.counts[0].tolist() == [10, 2, 10, 2]
    soft = BayesPredictor(name="s", soft=True).fit(build_tables(profile), profile)
    # 10 tokens * k=2 * (3/8, 1/8, 3/8, 1/8) plus 2 * 2 * (0, 1/2, 0, 1/2)
    np.testing.assert_allclose(soft.predict(batch).counts[0], [7.5, 4.5, 7.5, 4.5])


@pytest.mark.parametrize("method", sorted(set(METHODS) - {"lina-path"}))
def test_popularity_sums_to_tokens_times_k(method: str) -> None:
    rng = np.random.default_rng(1)
    n, layers, e = 400, 3, 4
    experts = np.stack([rng.permutation(e)[:2] for _ in range(layers * n)]).reshape(layers, n, 2)
    trace = make_trace(rng.integers(0, 16, n), experts, window=8)
    profile, batch = trace.take(np.arange(320)), trace.take(np.arange(320, 400))
    prediction = make_predictor(method).fit(build_tables(profile), profile).predict(batch)
    np.testing.assert_allclose(prediction.counts.sum(axis=1), 80 * 2)
    assert prediction.topk.shape == (layers, 80, 2)


def test_unseen_tokens_fall_back_to_the_documented_prior() -> None:
    profile = make_trace(
        np.array([1, 1, 1, 1, 2, 3]), np.array([0, 0, 0, 0, 2, 3])[None, :, None], window=2
    )
    batch = make_trace(np.array([9, 9]), np.zeros((1, 2, 1), int), window=2)
    tables = build_tables(profile)
    paper = make_predictor("bayes").fit(tables, profile)
    assert paper.predict(batch).counts[0].tolist() == [2, 0, 0, 0]  # MAP of the layer prior
    soft = make_predictor("bayes-soft").fit(tables, profile)
    np.testing.assert_allclose(soft.predict(batch).counts[0], [0, 0, 1, 1])  # rare tokens' routing


def test_lina_token_recovers_a_deterministic_token_map() -> None:
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 16, 800)
    experts = np.stack([tokens % 4, (tokens + 1) % 4], axis=-1)[None]
    trace = make_trace(tokens, experts, window=8)
    profile, batch = trace.take(np.arange(640)), trace.take(np.arange(640, 800))
    # Smoothing costs the soft default a little: one pseudo-entry against ~80 real ones.
    for method, tolerance in (("lina-token", 1e-9), ("bayes", 1e-9), ("bayes-soft", 0.5)):
        prediction = make_predictor(method).fit(build_tables(profile), profile).predict(batch)
        metrics = score(prediction, batch)
        assert metrics["mean_abs_diff"].max() <= tolerance, method
        assert metrics["topk_accuracy"].min() == 1.0, method


def test_lina_path_recovers_a_deterministic_path() -> None:
    rng = np.random.default_rng(4)
    n, layers = 800, 4
    first = rng.integers(0, 4, n)
    experts = np.stack([(first + layer) % 4 for layer in range(layers)])[:, :, None]
    trace = make_trace(rng.integers(0, 16, n), experts, window=8)
    profile, batch = trace.take(np.arange(640)), trace.take(np.arange(640, 800))
    prediction = make_predictor("lina-path").fit(build_tables(profile), profile).predict(batch)
    np.testing.assert_allclose(prediction.counts[1:], batch.popularity()[1:])
    assert np.array_equal(prediction.topk[1:], batch.experts[1:])


def test_history_recovers_a_stationary_share() -> None:
    experts = np.tile(np.array([0, 0, 1, 2]), 50)[None, :, None]
    trace = make_trace(np.arange(200) % 16, experts, window=4)
    prediction = make_predictor("history").fit(build_tables(trace), trace).predict(trace)
    np.testing.assert_allclose(prediction.counts, trace.popularity())


def test_unknown_method_names_the_choices() -> None:
    with pytest.raises(UsageError, match="Did you mean 'bayes-soft'"):
        make_predictor("bayes_soft")


def test_predicting_a_batch_the_size_of_the_trace_names_plans_option() -> None:
    """`plan --traces` predicts a held-out batch of --tokens: the trace must keep windows to
    fit on, and the refusal names --tokens (plan's option) and how many fit."""
    from predictor._methods import predict_batch

    rng = np.random.default_rng(0)
    trace = make_trace(
        rng.integers(0, 16, 128), rng.integers(0, 4, (2, 128, 2)), num_experts=4, window=16
    )
    counts, batch = predict_batch(trace, 64)
    assert batch == 64 and counts.shape == (2, 4)
    with pytest.raises(UsageError, match=r"--tokens 128[\s\S]*--tokens 112 or less"):
        predict_batch(trace, trace.num_tokens)
