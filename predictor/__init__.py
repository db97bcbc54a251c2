"""Expert-selection prediction: routing traces and the profiler that records them, count tables,
the Bayesian posterior with its variants, the Lina and history baselines, and their evaluation.

The names load lazily (PEP 562): the profiler and the evaluation import torch and scipy.stats,
seconds that a command reading one routing trace (`plan --shape`, `plan --counts`) need not pay.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predictor._bench import bench_profiler, bench_tables
    from predictor._counts import COUNTS_VERSION, PredictedCounts
    from predictor._evaluate import Evaluation, MethodScore, evaluate_methods, score
    from predictor._methods import (
        DEFAULT_METHOD,
        METHODS,
        BayesPredictor,
        HistoryPredictor,
        LinaPathPredictor,
        LinaTokenPredictor,
        Method,
        Prediction,
        Predictor,
        make_predictor,
        predict_batch,
    )
    from predictor._plot import plot_counts
    from predictor._profile import ProfileResult, profile_windows
    from predictor._splits import Split, sample_batches, split_windows
    from predictor._tables import TABLE_FILE, TABLE_VERSION, CountTable, LayerTable, build_tables
    from predictor._trace import TRACE_FILE, TRACE_VERSION, RoutingTrace

_EXPORTS = {
    "bench_profiler": "_bench",
    "bench_tables": "_bench",
    "COUNTS_VERSION": "_counts",
    "PredictedCounts": "_counts",
    "Evaluation": "_evaluate",
    "MethodScore": "_evaluate",
    "evaluate_methods": "_evaluate",
    "score": "_evaluate",
    "DEFAULT_METHOD": "_methods",
    "METHODS": "_methods",
    "BayesPredictor": "_methods",
    "HistoryPredictor": "_methods",
    "LinaPathPredictor": "_methods",
    "LinaTokenPredictor": "_methods",
    "Method": "_methods",
    "Prediction": "_methods",
    "Predictor": "_methods",
    "make_predictor": "_methods",
    "predict_batch": "_methods",
    "plot_counts": "_plot",
    "ProfileResult": "_profile",
    "profile_windows": "_profile",
    "Split": "_splits",
    "sample_batches": "_splits",
    "split_windows": "_splits",
    "TABLE_FILE": "_tables",
    "TABLE_VERSION": "_tables",
    "CountTable": "_tables",
    "LayerTable": "_tables",
    "build_tables": "_tables",
    "TRACE_FILE": "_trace",
    "TRACE_VERSION": "_trace",
    "RoutingTrace": "_trace",
}
"""Each public name and the module (predictor.<module>) that defines it."""

__all__ = [
    "COUNTS_VERSION",
    "DEFAULT_METHOD",
    "METHODS",
    "TABLE_FILE",
    "TABLE_VERSION",
    "TRACE_FILE",
    "TRACE_VERSION",
    "BayesPredictor",
    "CountTable",
    "Evaluation",
    "HistoryPredictor",
    "LayerTable",
    "LinaPathPredictor",
    "LinaTokenPredictor",
    "Method",
    "MethodScore",
    "PredictedCounts",
    "Prediction",
    "Predictor",
    "ProfileResult",
    "RoutingTrace",
    "Split",
    "bench_profiler",
    "bench_tables",
    "build_tables",
    "evaluate_methods",
    "make_predictor",
    "plot_counts",
    "predict_batch",
    "profile_windows",
    "sample_batches",
    "score",
    "split_windows",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'predictor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"predictor.{module}"), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
