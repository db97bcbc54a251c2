"""Expert-selection prediction: routing traces and the profiler that records them, count tables,
the Bayesian posterior with its variants, the Lina and history baselines, and their evaluation."""

from __future__ import annotations

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
