"""Predictive distributions of a batch's expert counts, and how well their intervals cover.

A predictor's count of expert i is a sum over the batch's tokens of draws "is i among this
token's k experts", each with the probability its posterior gives (`Prediction.variance` is the
variance of that sum). That alone is too narrow: the posteriors are learnt from other text, and a
batch drifts from them as a whole (topics, lengths), which per-token draws cannot express. The
model error is measured on held-out batches, as a relative variance per layer,

    rho2 = max(0, sum((real - mean)^2 - sampling_var)) / sum(mean^2),

pooled over experts and batches, and the predictive scale is `sqrt(sampling_var + rho2 *
mean^2)`. The shape comes from the same held-out batches: each count's standardised residual
z = (real - mean) / scale, pooled, and a count's q-quantile is mean + scale * (the empirical
q-quantile of z, at the split-conformal level ceil((n + 1) q) / n), clipped to [0, tokens] (an
expert gets each token at most once). Errors of real routing are heavier-tailed and more
skewed than a normal's; with no held-out residuals the normal's quantiles are used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

__all__ = ["ErrorModel", "Residual", "coverage", "interval", "quantile", "z_quantile"]

LEVELS = (0.90, 0.99)  # the central intervals `moelambda predict` reports coverage of


@dataclass(frozen=True)
class Residual:
    """One held-out batch: real counts, predicted mean and sampling variance, all (L, E)."""

    real: np.ndarray
    mean: np.ndarray
    sampling_var: np.ndarray


def z_quantile(z: np.ndarray | None, q: float) -> float:
    """The q-quantile of standardised residuals `z` at the split-conformal level (the normal's
    when there are none); past the largest, the largest."""
    if z is None or z.size == 0:
        return float(norm.ppf(q))
    n = z.size
    level = np.ceil((n + 1) * q) / n if q >= 0.5 else np.floor((n + 1) * q) / n
    return float(np.quantile(z, np.clip(level, 0.0, 1.0), method="inverted_cdf"))


@dataclass(frozen=True)
class ErrorModel:
    """Relative model-error variance per layer, `rho2` (L,), and the sorted standardised
    residuals `z` of the held-out batches it was measured on."""

    rho2: np.ndarray
    z: np.ndarray

    @classmethod
    def fit(cls, residuals: list[Residual], layers: int) -> ErrorModel:
        """Pooled over experts and batches; no batches gives no model error (rho2 = 0)."""
        if not residuals:
            return cls(np.zeros(layers), np.zeros(0))
        excess = sum(((r.real - r.mean) ** 2 - r.sampling_var).sum(axis=1) for r in residuals)
        scale = sum((r.mean**2).sum(axis=1) for r in residuals)
        rho2 = np.maximum(np.asarray(excess, float), 0.0) / np.maximum(scale, 1e-300)
        model = cls(rho2, np.zeros(0))
        z = [((r.real - r.mean) / model.std(r.mean, r.sampling_var)).ravel() for r in residuals]
        return cls(rho2, np.sort(np.concatenate(z)))

    def std(self, mean: np.ndarray, sampling_var: np.ndarray) -> np.ndarray:
        """Predictive scale (L, E), at least one token (a count is whole tokens)."""
        return np.sqrt(np.maximum(sampling_var, 0.0) + self.rho2[:, None] * mean**2 + 1.0)


def quantile(
    mean: np.ndarray, std: np.ndarray, q: float, tokens: int, z: np.ndarray | None = None
) -> np.ndarray:
    """The q-quantile of each count, clipped to [0, tokens]."""
    return np.clip(mean + z_quantile(z, q) * std, 0.0, tokens)


def interval(
    mean: np.ndarray, std: np.ndarray, level: float, tokens: int, z: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The central `level` interval of each count."""
    tail = (1.0 - level) / 2
    return quantile(mean, std, tail, tokens, z), quantile(mean, std, 1.0 - tail, tokens, z)


def coverage(
    real: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    level: float,
    tokens: int,
    z: np.ndarray | None = None,
) -> float:
    """Share of counts inside their central `level` interval."""
    low, high = interval(mean, std, level, tokens, z)
    return float(((real >= low - 1e-9) & (real <= high + 1e-9)).mean())
