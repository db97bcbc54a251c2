"""Held-out splits of a routing trace into whole windows (requests): what a predictor is fitted
on and what it is scored against.

Its own module because both the evaluation (`predictor._evaluate`) and the planner's prediction of
one batch (`predictor._methods.predict_batch`) split a trace the same way, and the evaluation
needs the methods: neither may import the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ground.errors import UsageError
from predictor._trace import RoutingTrace

__all__ = ["Split", "sample_batches", "split_windows"]


@dataclass(frozen=True)
class Split:
    """One repeat: the held-out batch, and the trace to profile on (None: saved tables)."""

    profile: RoutingTrace | None
    held_out: RoutingTrace


def _held_windows(trace: RoutingTrace, eval_tokens: int, repeats: int) -> tuple[np.ndarray, int]:
    """All window ids of the trace and how many make up `eval_tokens`, after checking both."""
    windows = np.unique(trace.window_ids)
    window = int(trace.meta.get("window", 128))
    if eval_tokens < window:
        raise UsageError(
            f"--eval-tokens {eval_tokens} is less than one {window}-token window.",
            f"pass at least {window} (the paper's batch is 10240).",
        )
    if eval_tokens % window:
        raise UsageError(
            f"--eval-tokens {eval_tokens} is not a whole number of {window}-token windows.",
            f"pass a multiple of {window}, e.g. {eval_tokens // window * window}.",
        )
    if repeats < 1:
        raise UsageError(f"--repeats {repeats} is not positive.", "pass --repeats 1 or more.")
    held = eval_tokens // window
    if held > windows.size:
        raise UsageError(
            f"--eval-tokens {eval_tokens} is more than the trace holds ({trace.num_tokens}).",
            f"pass --eval-tokens {windows.size * window} or less, or profile more tokens.",
        )
    return windows, held


def split_windows(
    trace: RoutingTrace,
    *,
    eval_tokens: int,
    repeats: int,
    seed: int,
    profile_tokens: int | None = None,
) -> list[Split]:
    """`repeats` random held-out batches of whole windows, each with the rest for profiling.

    Args:
        profile_tokens: Profile on this many tokens of the rest (a random subset of windows),
            to measure how accuracy grows with profiling data. None: all of the rest.

    Raises:
        UsageError: `eval_tokens` is not a positive whole number of windows, exceeds the trace,
            or leaves fewer profiling windows than held-out ones.
    """
    windows, held = _held_windows(trace, eval_tokens, repeats)
    window = int(trace.meta.get("window", 128))
    if held > windows.size - held:
        raise UsageError(
            f"the trace holds {trace.num_tokens} tokens ({windows.size} windows): too few to "
            f"hold out {eval_tokens} and still profile on at least as many.",
            f"profile at least {2 * eval_tokens} tokens (e.g. `moelambda profile --tokens "
            f"{10 * eval_tokens}`) or pass a smaller --eval-tokens.",
        )
    profile_windows = windows.size - held
    if profile_tokens is not None:
        wanted = profile_tokens // window
        if not 1 <= wanted <= profile_windows:
            raise UsageError(
                f"--profile-tokens {profile_tokens} is not between one window ({window}) and "
                f"the {profile_windows * window} tokens left after holding out {eval_tokens}.",
                "pass a value in that range, or leave it out to profile on all the rest.",
            )
        profile_windows = wanted
    rng = np.random.default_rng(seed)
    splits = []
    for _ in range(repeats):
        chosen = rng.choice(windows, size=held, replace=False)
        rest = np.setdiff1d(windows, chosen)
        rest = rng.choice(rest, size=profile_windows, replace=False)
        splits.append(Split(trace.select_windows(rest), trace.select_windows(chosen)))
    return splits


def sample_batches(
    trace: RoutingTrace, *, eval_tokens: int, repeats: int, seed: int
) -> list[Split]:
    """`repeats` random batches of whole windows to predict with tables profiled elsewhere."""
    windows, held = _held_windows(trace, eval_tokens, repeats)
    rng = np.random.default_rng(seed)
    return [
        Split(None, trace.select_windows(rng.choice(windows, size=held, replace=False)))
        for _ in range(repeats)
    ]
