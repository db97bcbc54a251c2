"""Predictive distributions of expert counts: the model error is recovered from held-out
residuals, intervals cover what they claim on data drawn from the model they describe, and a
real predictor's draw variance is the sum of its per-token Bernoulli variances."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import make_predictor
from predictor._tables import build_tables
from predictor._uncertainty import ErrorModel, Residual, coverage, interval, quantile

from .synthetic import make_trace


def _residuals(rho: np.ndarray, batches: int, seed: int) -> list[Residual]:
    """Counts drawn as mean * (1 + rho e1) + sqrt(var) e2: what the error model assumes."""
    rng = np.random.default_rng(seed)
    layers, experts = rho.size, 16
    out = []
    for _ in range(batches):
        mean = rng.uniform(200, 1200, size=(layers, experts))
        var = mean * 0.9
        real = mean * (1 + rho[:, None] * rng.standard_normal(mean.shape))
        real += np.sqrt(var) * rng.standard_normal(mean.shape)
        out.append(Residual(real, mean, var))
    return out


def test_the_model_error_is_recovered_and_its_intervals_cover_what_they_claim() -> None:
    rho = np.array([0.0, 0.1, 0.3])
    fitted = ErrorModel.fit(_residuals(rho, 400, seed=0), 3)
    assert np.sqrt(fitted.rho2) == pytest.approx(rho, abs=0.01)
    for level in (0.9, 0.99):
        shares = [
            coverage(r.real, r.mean, fitted.std(r.mean, r.sampling_var), level, 10**6)
            for r in _residuals(rho, 50, seed=1)
        ]
        assert np.mean(shares) == pytest.approx(level, abs=0.01)
        # Without the model error, the draws alone are too narrow where rho > 0.
        narrow = [
            coverage(r.real[2], r.mean[2], np.sqrt(r.sampling_var[2]), level, 10**6)
            for r in _residuals(rho, 50, seed=1)
        ]
        assert np.mean(narrow) < level - 0.2
    assert (ErrorModel.fit([], 2).rho2 == 0).all()


def test_quantiles_are_clipped_to_the_batch_and_intervals_are_central() -> None:
    mean, std = np.array([[0.5, 500.0, 990.0]]), np.array([[10.0, 10.0, 10.0]])
    low, high = interval(mean, std, 0.9, tokens=1000)
    assert low[0, 0] == 0 and high[0, 2] == 1000
    assert (high[0, 1] - 500) == pytest.approx(500 - low[0, 1]) == pytest.approx(16.449, abs=1e-3)
    assert quantile(mean, std, 0.5, 1000)[0, 1] == 500


def test_a_bayes_predictors_draw_variance_is_its_per_token_bernoulli_sum() -> None:
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 16, size=512)
    # Two distinct experts of 4 per token and layer, leaning on the token id.
    experts = np.stack(
        [
            np.stack([(t + layer + np.array([0, 1 + (t % 3)])) % 4 for t in tokens])
            for layer in (0, 1)
        ]
    )
    flip = rng.random(tokens.size) < 0.3
    experts[0, flip] = experts[0, flip][:, ::-1]
    experts[1, flip, 1] = (experts[1, flip, 0] + 2) % 4
    trace = make_trace(tokens, experts)
    predictor = make_predictor("bayes-soft").fit(build_tables(trace), trace)
    batch = trace.select_windows(np.unique(trace.window_ids)[:16])
    inverse, n, posteriors = predictor.posteriors(batch)
    prediction = predictor.predict(batch)
    for layer, posterior in enumerate(posteriors):
        q = np.clip(2 * posterior[inverse], 0, 1)  # each token's chance of each expert
        assert prediction.variance[layer] == pytest.approx((q * (1 - q)).sum(axis=0))
        assert prediction.counts[layer] == pytest.approx(q.sum(axis=0), rel=1e-6, abs=1e-6)
