"""Held-out evaluation of the predictors: the paper's metric and two more, over several splits.

Each repeat holds out whole windows (requests) worth `eval_tokens` tokens, chosen with the seed,
profiles on every other window (`predictor._splits`), and compares each method's prediction with
the real routing of the held-out batch:

* ``mean_abs_diff``: mean over layers and experts of |real - predicted| tokens (paper §V-B);
* ``topk_accuracy``: share of the k predicted experts of a token that are among its real k;
* ``underestimate_rate``: share of (layer, expert) whose predicted count is below the real one
  (an underestimated expert is the one that runs out of memory);
* ``coverage_90``, ``coverage_99``: share of held-out (layer, expert) counts inside the predicted
  90 % and 99 % intervals (`predictor._uncertainty`), each batch's model error measured on the
  other repeats' batches only (leave one batch out), so no interval has seen its own batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor._methods import Prediction, make_predictor
from predictor._splits import Split
from predictor._tables import CountTable, build_tables
from predictor._trace import RoutingTrace
from predictor._uncertainty import LEVELS, ErrorModel, Residual, coverage

__all__ = ["Evaluation", "MethodScore", "evaluate_methods", "score"]


def score(prediction: Prediction, real: RoutingTrace) -> dict[str, np.ndarray]:
    """Per-layer metrics of one prediction against the real routing of the same batch."""
    actual = real.popularity()
    hits = (prediction.topk[:, :, :, None] == real.experts[:, :, None, :]).any(axis=3)
    return {
        "mean_abs_diff": np.abs(actual - prediction.counts).mean(axis=1),
        "topk_accuracy": hits.mean(axis=(1, 2)),
        "underestimate_rate": (prediction.counts < actual - 1e-9).mean(axis=1),
    }


@dataclass(frozen=True)
class MethodScore:
    """One method's metrics over all repeats: per repeat and layer, and timings."""

    name: str
    per_repeat: dict[str, np.ndarray]  # metric -> (repeats, layers)
    profile_s: float
    predict_s: float
    residuals: tuple[Residual, ...]  # per repeat: what its intervals are measured against
    tokens: int  # of each held-out batch

    def error_model(self, leave_out: int | None = None) -> ErrorModel:
        """Model error from every held-out batch but `leave_out`."""
        kept = [r for i, r in enumerate(self.residuals) if i != leave_out]
        return ErrorModel.fit(kept, self.residuals[0].mean.shape[0])

    def coverage(self, level: float) -> float | None:
        """Leave-one-batch-out coverage of the central `level` intervals; None for one batch."""
        if len(self.residuals) < 2:
            return None
        shares = []
        for i, r in enumerate(self.residuals):
            model = self.error_model(i)
            std = model.std(r.mean, r.sampling_var)
            shares.append(coverage(r.real, r.mean, std, level, self.tokens, model.z))
        return float(np.mean(shares))

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for metric, values in self.per_repeat.items():
            overall = values.mean(axis=1)
            out[metric] = round(float(overall.mean()), 4)
            out[f"{metric}_std"] = round(float(overall.std()), 4)
            out[f"{metric}_per_layer"] = [round(float(v), 4) for v in values.mean(axis=0)]
        for level in LEVELS:
            share = self.coverage(level)
            out[f"coverage_{round(level * 100)}"] = None if share is None else round(share, 4)
        rho = np.sqrt(self.error_model().rho2)
        out["model_error_per_layer"] = [round(float(v), 4) for v in rho]
        out["profile_s"] = round(self.profile_s, 4)
        out["predict_s"] = round(self.predict_s, 4)
        return out


@dataclass(frozen=True)
class Evaluation:
    """Every method's scores, and its prediction of the first held-out batch (for plots)."""

    scores: dict[str, MethodScore]
    first_batch: RoutingTrace
    first_predictions: dict[str, Prediction]


def evaluate_methods(
    splits: Sequence[Split], methods: Sequence[str], *, tables: CountTable | None = None
) -> Evaluation:
    """Fit every method on each split's profiling part and score it on the held-out part.

    With `tables`, every split is predicted from those saved tables instead of its own
    profiling part. `profile_s` is the mean time to build the count tables plus the method's
    own fitting; `predict_s` the mean time to predict one held-out batch.
    """
    predictors = {name: make_predictor(name) for name in methods}  # re-fitted on each split
    results: dict[str, list[dict[str, np.ndarray]]] = {m: [] for m in methods}
    fit_s = dict.fromkeys(methods, 0.0)
    predict_s = dict.fromkeys(methods, 0.0)
    first: dict[str, Prediction] = {}
    residuals: dict[str, list[Residual]] = {m: [] for m in methods}
    for split in splits:
        started = time.perf_counter()
        split_tables = tables if split.profile is None else build_tables(split.profile)
        assert split_tables is not None, "a split without a profile trace needs saved tables"
        table_s = time.perf_counter() - started
        for name in methods:
            started = time.perf_counter()
            predictor = predictors[name].fit(split_tables, split.profile)
            fit_s[name] += table_s + time.perf_counter() - started
            started = time.perf_counter()
            prediction = predictor.predict(split.held_out)
            predict_s[name] += time.perf_counter() - started
            results[name].append(score(prediction, split.held_out))
            real = split.held_out.popularity().astype(float)
            residuals[name].append(Residual(real, prediction.counts, prediction.variance))
            first.setdefault(name, prediction)
    n = len(splits)
    scores = {
        name: MethodScore(
            name,
            {metric: np.stack([r[metric] for r in runs]) for metric in runs[0]},
            fit_s[name] / n,
            predict_s[name] / n,
            tuple(residuals[name]),
            splits[0].held_out.num_tokens,
        )
        for name, runs in results.items()
    }
    return Evaluation(scores, splits[0].held_out, first)
