"""The predictor's benchmarks: `moelambda bench profiler` and `bench predictor` as calls."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import UsageError
from predictor._methods import DEFAULT_METHOD, make_predictor
from predictor._profile import profile_windows
from predictor._tables import build_tables

if TYPE_CHECKING:
    from moe import MoEModel
    from predictor._trace import RoutingTrace

__all__ = ["bench_profiler", "bench_tables"]

PROFILER_TARGET_TOKENS_PER_S = 5000
BUILD_TARGET_S = 1.0  # 100 batches of 10,240 tokens
PREDICT_TARGET_S = 0.2  # 10 batches
BATCH_TOKENS = 10240


def bench_profiler(
    model: MoEModel,
    *,
    tokens: int = 10240,
    repeats: int = 3,
    batch_windows: int = 32,
    corpus: str = "wiki",
) -> dict[str, Any]:
    """Profiler throughput on the corpus (target: >= 5,000 tokens/s for MiniLM).

    One untimed warm-up pass of one batch, then `repeats` timed passes over the same windows;
    the median is the result.

    Args:
        model: The loaded MoE model (`moe.load_model`).
        tokens: Tokens per profiling pass. Defaults to 10,240.
        repeats: Timed passes. Defaults to 3.
        batch_windows: Windows of 128 tokens per forward pass. Defaults to 32.
        corpus: The text profiled (`moe.load_corpus`). Defaults to "wiki".

    Returns:
        The median and every pass's tokens per second, the target and whether it is met, and
        torch's thread count.

    Raises:
        UsageError: `repeats` is not positive.
    """
    import torch

    from moe import load_corpus, make_windows

    if repeats < 1:
        raise UsageError(f"--repeats {repeats} is not positive.", "pass --repeats 1 or more.")
    windows = make_windows(load_corpus(corpus), model.tokenizer, tokens=tokens, window=128, seed=0)
    profile_windows(model, windows[:batch_windows], tokens=batch_windows * 128)
    rates = [profile_windows(model, windows, tokens=tokens).tokens_per_s for _ in range(repeats)]
    median = statistics.median(rates)
    return {
        "tokens": tokens,
        "batch_windows": batch_windows,
        "tokens_per_s": round(median, 1),
        "tokens_per_s_runs": [round(r, 1) for r in rates],
        "target_tokens_per_s": PROFILER_TARGET_TOKENS_PER_S,
        "meets_target": median >= PROFILER_TARGET_TOKENS_PER_S,
        "torch_threads": torch.get_num_threads(),
    }


def bench_tables(
    trace: RoutingTrace, *, batches: int = 100, predict_batches: int = 10, seed: int = 0
) -> dict[str, Any]:
    """Table building and prediction speed (targets: 100 batches <= 1 s, 10 batches <= 0.2 s).

    The profiling data is `trace` resampled by whole windows (with replacement) to `batches`
    x 10,240 tokens, so keys repeat as they do in real text. The paper reports 28.89 s and
    20.31 s for the same two jobs.

    Args:
        trace: A real routing trace to resample.
        batches: Profiling batches of 10,240 tokens. Defaults to 100.
        predict_batches: Batches to predict. Defaults to 10.
        seed: Seeds the resampling. Defaults to 0.

    Returns:
        The trace's shape, the table's entries, the build time and each method's fit and
        predict times against the targets and the paper's times.

    Raises:
        UsageError: A batch count that is not positive.
    """
    if batches < 1 or predict_batches < 1:
        raise UsageError("--batches and --predict-batches must be positive.", "pass 1 or more.")
    windows = np.unique(trace.window_ids)
    window = int(trace.meta.get("window", 128))
    rng = np.random.default_rng(seed)
    order = np.argsort(trace.window_ids, kind="stable")

    def resample(tokens: int) -> RoutingTrace:
        chosen = rng.choice(windows, size=tokens // window, replace=True)
        starts = np.searchsorted(trace.window_ids[order], chosen)
        return trace.take(order[(starts[:, None] + np.arange(window)).ravel()])

    profile = resample(batches * BATCH_TOKENS)
    started = time.perf_counter()
    tables = build_tables(profile)
    build_s = time.perf_counter() - started
    eval_batches = [resample(BATCH_TOKENS) for _ in range(predict_batches)]
    result: dict[str, Any] = {}
    for name in dict.fromkeys((DEFAULT_METHOD, "bayes")):
        predictor = make_predictor(name)
        started = time.perf_counter()
        predictor.fit(tables, profile)
        fit_s = time.perf_counter() - started
        started = time.perf_counter()
        for batch in eval_batches:
            predictor.predict(batch)
        result[name] = {
            "fit_s": round(fit_s, 4),
            "predict_s": round(time.perf_counter() - started, 4),
        }
    return {
        "model": trace.meta["model"],
        "experts": trace.num_experts,
        "top_k": trace.top_k,
        "layers": trace.num_layers,
        "profile_tokens": profile.num_tokens,
        "table_entries": int(sum(layer.keys.size for layer in tables.layers)),
        "build_tables_s": round(build_s, 4),
        "build_target_s": BUILD_TARGET_S,
        "predict_tokens": predict_batches * BATCH_TOKENS,
        "methods": result,
        "predict_target_s": PREDICT_TARGET_S,
        "paper_s": {"build": 28.89, "predict": 20.31},
        "meets_targets": build_s <= BUILD_TARGET_S
        and all(r["predict_s"] <= PREDICT_TARGET_S for r in result.values()),
    }
