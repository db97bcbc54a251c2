"""Held-out splits and scores: disjoint whole windows, the metrics, and bad sizes."""

from __future__ import annotations

import numpy as np
import pytest

from ground.errors import UsageError
from predictor import Prediction, evaluate_methods, score, split_windows

from .synthetic import make_trace


@pytest.fixture()
def trace():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    n = 8 * 40  # 40 windows of 8 tokens
    experts = np.stack([rng.permutation(4)[:2] for _ in range(2 * n)]).reshape(2, n, 2)
    return make_trace(rng.integers(0, 16, n), experts, window=8)


def test_splits_hold_out_whole_windows_disjointly(trace) -> None:  # type: ignore[no-untyped-def]
    splits = split_windows(trace, eval_tokens=80, repeats=3, seed=1)
    assert len(splits) == 3
    for split in splits:
        held, rest = set(split.held_out.window_ids), set(split.profile.window_ids)
        assert len(held) == 10 and len(rest) == 30 and not held & rest
        assert split.held_out.num_tokens == 80
    assert set(splits[0].held_out.window_ids) != set(splits[1].held_out.window_ids)
    again = split_windows(trace, eval_tokens=80, repeats=3, seed=1)
    assert np.array_equal(again[2].held_out.token_ids, splits[2].held_out.token_ids)
    fewer = split_windows(trace, eval_tokens=80, repeats=1, seed=1, profile_tokens=40)
    assert fewer[0].profile.num_tokens == 40


@pytest.mark.parametrize(
    ("eval_tokens", "repeats", "message"),
    [
        (4, 1, "less than one 8-token window"),
        (12, 1, "not a whole number"),
        (400, 1, "more than the trace holds"),
        (200, 1, "too few to hold out"),
        (80, 0, "--repeats 0"),
    ],
)
def test_bad_sizes(trace, eval_tokens: int, repeats: int, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match=message):
        split_windows(trace, eval_tokens=eval_tokens, repeats=repeats, seed=0)


def test_score_of_the_truth_and_of_an_underestimate(trace) -> None:  # type: ignore[no-untyped-def]
    real = trace.popularity().astype(float)
    perfect = score(Prediction(real, trace.experts, np.zeros_like(real)), trace)
    assert perfect["mean_abs_diff"].tolist() == [0, 0]
    assert perfect["topk_accuracy"].tolist() == [1, 1]
    assert perfect["underestimate_rate"].tolist() == [0, 0]
    low = trace.popularity().astype(float)
    low[0, 0] -= 8
    worse = score(Prediction(low, trace.experts, np.zeros_like(low)), trace)
    assert worse["mean_abs_diff"][0] == 2 and worse["underestimate_rate"][0] == 0.25


def test_evaluation_reports_every_method(trace) -> None:  # type: ignore[no-untyped-def]
    splits = split_windows(trace, eval_tokens=80, repeats=2, seed=0)
    evaluation = evaluate_methods(splits, ["bayes", "history"])
    summary = evaluation.scores["bayes"].summary()
    assert len(summary["mean_abs_diff_per_layer"]) == 2
    assert summary["predict_s"] >= 0 and summary["profile_s"] > 0
    assert evaluation.first_predictions["history"].counts.shape == (2, 4)
