"""The contention-free all-to-all schedule of Aurora's Theorem 4.2 (spec §2.2).

The paper proves the bound (the busiest sender's or receiver's bytes over its NIC) reachable with
Farkas' lemma, which gives no order. We build one: pad the time matrix with the north-west-corner
rule until every line sum equals the bound, then peel perfect matchings off it (Birkhoff-von
Neumann). Each matching is one round in which every receiver hears at most one sender, so nobody is
ever slowed by contention, and the rounds add up to exactly the bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = ["Round", "Schedule", "lower_bound", "pad", "schedule", "verify"]

Mode = Literal["min_pair", "own_nic"]

# Non-integral time matrices are rounded up onto a grid of 2**40 steps per bound, so the
# decomposition runs in exact integer arithmetic (no drift, every matching perfect) at a cost of
# at most n grid steps (~1e-11 relative) on the makespan.
_GRID_STEPS = 2.0**40


@dataclass(frozen=True)
class Round:
    """One permutation slot: every sender talks to at most one receiver and vice versa.

    `dest[i]` is -1 whenever sender i moves no real tokens in this round (its matched cell is
    padding or its own diagonal), so an executor can skip it without looking at `tokens`.
    """

    seconds: float
    dest: np.ndarray
    tokens: np.ndarray


@dataclass(frozen=True)
class Schedule:
    """Rounds to run back to back; `makespan_s` is the sum of their durations.

    `lower_bound_s` is the bound of the requested communication model, so
    `makespan_s / lower_bound_s` shows what one-flow-at-a-time senders give up (1 for
    `min_pair`, >= 1 for `own_nic`).
    """

    rounds: tuple[Round, ...]
    makespan_s: float
    lower_bound_s: float


def lower_bound(tokens: np.ndarray, bandwidth: np.ndarray, token_bytes: float) -> float:
    """Seconds no order can beat: the busiest sender's or receiver's bytes over its own NIC.

    `tokens` is the (n, n) matrix of tokens GPU i sends GPU j (the diagonal stays local and is
    ignored); `bandwidth` the (n,) NIC rates in bytes/s. Theorem 5.2's bound as printed (each GPU
    at its own rate); for equal rates it is Theorem 4.2's b_max.
    """
    sent = np.asarray(tokens, dtype=float).copy()
    np.fill_diagonal(sent, 0.0)
    rate = np.asarray(bandwidth, dtype=float)
    rows = sent.sum(axis=1) * token_bytes / rate
    cols = sent.sum(axis=0) * token_bytes / rate
    return float(max(rows.max(initial=0.0), cols.max(initial=0.0)))


def pad(time_matrix: np.ndarray) -> np.ndarray:
    """Padding X >= 0 that lifts every row and column sum of T + X to T's largest line sum.

    Appendix A only shows X exists (Farkas); the north-west-corner rule of the transportation
    problem builds it directly, because the row slacks and the column slacks have the same total
    (n * max - sum(T)). X may use the diagonal: padding is idle time, not traffic. Integral T
    gives integral X.
    """
    t = _square(time_matrix, "time_matrix")
    rows, cols = t.sum(axis=1), t.sum(axis=0)
    top = max(rows.max(initial=0.0), cols.max(initial=0.0))
    row_slack, col_slack = top - rows, top - cols
    x = np.zeros_like(t)
    i = j = 0
    while i < len(t) and j < len(t):
        step = min(row_slack[i], col_slack[j])
        x[i, j] += step
        row_slack[i] -= step
        col_slack[j] -= step
        if row_slack[i] <= col_slack[j]:
            i += 1
        else:
            j += 1
    return x


def schedule(
    tokens: np.ndarray, bandwidth: np.ndarray, token_bytes: float, mode: Mode = "min_pair"
) -> Schedule:
    """Contention-free rounds that move `tokens` (n, n) over NICs of `bandwidth` (n,) bytes/s.

    Senders send one flow at a time (Fig. 4), so a flow i -> j runs at min(B_i, B_j); the rounds
    are the Birkhoff-von Neumann decomposition of the padded time matrix d_ij * bytes / min(B_i,
    B_j) (Appendix B). Their makespan is that matrix's largest line sum, which is Theorem 4.2's
    b_max when bandwidth is homogeneous; with integer tokens every chunk is whole tokens and the
    makespan equals `lower_bound` exactly.

    `mode` only chooses `lower_bound_s`. "min_pair" reports the Appendix-B bound, which the rounds
    reach. "own_nic" reports Theorem 5.2 as printed (`lower_bound`: every GPU at its own rate);
    with heterogeneous NICs that is reachable only by senders that split their rate over several
    receivers at once, which rounds cannot express, so the rounds (and `makespan_s`) stay those of
    "min_pair" and the gap is visible in the result.

    The matchings come from `linear_sum_assignment` (maximum weight on the support), which is
    deterministic, so every rank of a distributed run computes the same rounds, and which peels
    far fewer rounds than an arbitrary matching (about 3n instead of the n^2 - 2n + 2 worst case).
    """
    d = _square(tokens, "tokens")
    rate = _bandwidth(bandwidth, len(d))
    if token_bytes <= 0:
        raise ValueError(f"token_bytes must be positive, got {token_bytes}")
    if mode not in ("min_pair", "own_nic"):
        raise ValueError(f"mode must be 'min_pair' or 'own_nic', got {mode!r}")
    np.fill_diagonal(d, 0.0)
    ref = float(rate.max()) if len(rate) else 1.0
    time_ref = d * (ref / np.minimum.outer(rate, rate))  # in token times at rate `ref`
    bound = _max_line(time_ref) * token_bytes / ref
    own = lower_bound(d, rate, token_bytes) if mode == "own_nic" else bound
    if not d.any():
        return Schedule(rounds=(), makespan_s=0.0, lower_bound_s=own)
    units, steps = _grid(time_ref)
    unit_s = token_bytes / (ref * steps)
    rounds = tuple(
        Round(seconds=w * unit_s, dest=dest, tokens=sent) for w, dest, sent in _decompose(units, d)
    )
    return Schedule(
        rounds=rounds, makespan_s=_max_line(units) * token_bytes / (ref * steps), lower_bound_s=own
    )


def verify(samples: int = 200, max_n: int = 10, seed: int = 0) -> bool:
    """Check Theorem 4.2 constructively on random integer traffic (used by `moelambda bench gpu`).

    For every sample: the makespan equals `lower_bound`, every round is a partial permutation whose
    chunks fit its duration, and the chunks add back up to the matrix. Matrices are sparse as often
    as dense, since zeros are what force padding onto the diagonal.
    """
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        n = int(rng.integers(2, max_n + 1))
        tokens = rng.integers(0, 50, (n, n)) * (rng.random((n, n)) < rng.uniform(0.2, 1.0))
        bandwidth = np.full(n, float(rng.choice([12.5e9, 25e9, 50e9])))
        if not _sound(tokens.astype(float), bandwidth, 1536.0):
            return False
    return True


def _sound(tokens: np.ndarray, bandwidth: np.ndarray, token_bytes: float) -> bool:
    plan = schedule(tokens, bandwidth, token_bytes)
    bound = lower_bound(tokens, bandwidth, token_bytes)
    sent = np.zeros_like(tokens)
    senders = np.arange(len(tokens))
    for r in plan.rounds:
        busy = r.dest >= 0
        if len(np.unique(r.dest[busy])) != busy.sum() or (r.dest[busy] == senders[busy]).any():
            return False
        rate = np.minimum(bandwidth[busy], bandwidth[r.dest[busy]])
        if (r.tokens[busy] * token_bytes / rate > r.seconds * (1 + 1e-12)).any():
            return False
        sent[senders[busy], r.dest[busy]] += r.tokens[busy]
    off = tokens.copy()
    np.fill_diagonal(off, 0.0)
    return bool(np.isclose(plan.makespan_s, bound, rtol=1e-9, atol=0.0) and (sent == off).all())


def _decompose(
    units: np.ndarray, tokens: np.ndarray
) -> Iterator[tuple[float, np.ndarray, np.ndarray]]:
    """Yield (weight, dest, real tokens) per Birkhoff-von Neumann round of the padded `units`.

    Each sender spends a round's weight on real traffic first and idles for the rest; a flow's
    tokens are split in proportion to the units it gets, so integral units give whole tokens.
    """
    n = len(units)
    real = units.copy()
    left = units + pad(units)
    senders = np.arange(n)
    while left.any():
        _, dest = linear_sum_assignment(np.where(left > 0, -left, np.inf))
        weight = left[senders, dest].min()
        left[senders, dest] -= weight
        chunk = np.minimum(real[senders, dest], weight)
        real[senders, dest] -= chunk
        flow = units[senders, dest]
        sent = np.divide(tokens[senders, dest] * chunk, flow, out=np.zeros(n), where=flow > 0)
        yield float(weight), np.where(sent > 0, dest, -1), sent


def _grid(time_ref: np.ndarray) -> tuple[np.ndarray, float]:
    """Integral units for the decomposition and how many of them make one time unit."""
    if (time_ref == np.round(time_ref)).all() and _max_line(time_ref) < _GRID_STEPS:
        return time_ref.copy(), 1.0
    steps = _GRID_STEPS / _max_line(time_ref)
    return np.ceil(time_ref * steps), steps


def _max_line(m: np.ndarray) -> float:
    return float(max(m.sum(axis=1).max(initial=0.0), m.sum(axis=0).max(initial=0.0)))


def _square(m: np.ndarray, name: str) -> np.ndarray:
    a = np.array(m, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} must be a square (n, n) matrix, got shape {a.shape}")
    if not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"{name} must be finite and non-negative")
    return a


def _bandwidth(bandwidth: np.ndarray, n: int) -> np.ndarray:
    rate = np.asarray(bandwidth, dtype=float)
    if rate.shape != (n,):
        raise ValueError(f"bandwidth must have shape ({n},) for {n} GPUs, got {rate.shape}")
    if not np.isfinite(rate).all() or (rate <= 0).any():
        raise ValueError("bandwidth must be finite and positive (bytes/s)")
    return rate
