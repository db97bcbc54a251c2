"""Bottleneck bipartite matching and the sorted pairing of Aurora's Theorem 6.2 (spec §2.4).

Aurora pairs expert i of model a with expert j of model b so that the heaviest pair is as light as
possible: the aggregated all-to-all time is the largest line sum of the combined traffic, so only
the worst pair matters (a min-max, not a min-sum, objective). Case I of §6.2 (every expert sends
what it receives) has a closed form, the sorted rule; Case II needs a bottleneck matching.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

__all__ = ["bottleneck_matching", "sorted_pairing"]


def _square(weights: np.ndarray) -> np.ndarray:
    w = np.asarray(weights, dtype=float)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
        raise ValueError(f"weights must be a non-empty square (n, n) matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite (no NaN or inf)")
    return w


def _has_perfect_matching(allowed: np.ndarray) -> bool:
    """Hopcroft-Karp on the 0/1 graph of allowed (row, column) edges."""
    match = maximum_bipartite_matching(csr_matrix(allowed.astype(np.int8)), perm_type="column")
    return bool(np.all(match >= 0))


def bottleneck_matching(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """Perfect matching of rows to columns minimising the largest matched weight.

    Returns `(perm, bottleneck)`: row i is matched to column `perm[i]` and `bottleneck` is the
    largest matched weight. The optimal bottleneck is one of the weights, so a binary search over
    the sorted distinct weights finds the smallest threshold whose graph {W_ij <= threshold} still
    has a perfect matching (Burkard & Derigs; O(n^2.5 log n) with Hopcroft-Karp). Many matchings
    usually share that bottleneck; the one returned has the minimum total weight among them
    (Hungarian method on the thresholded graph), so the answer is deterministic and the
    non-bottleneck pairs are not needlessly heavy.
    """
    w = _square(weights)
    values = np.unique(w)
    lo, hi = 0, len(values) - 1  # the complete graph (threshold = max weight) always matches
    while lo < hi:
        mid = (lo + hi) // 2
        if _has_perfect_matching(w <= values[mid]):
            hi = mid
        else:
            lo = mid + 1
    bottleneck = float(values[lo])
    _, perm = linear_sum_assignment(np.where(w <= bottleneck, w, np.inf))
    return perm.astype(np.intp), bottleneck


def _vector(values: np.ndarray, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return v


def sorted_pairing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Theorem 6.2: pair a sorted ascending with b sorted descending, index by index.

    Returns `perm` with a[i] paired to b[perm[i]]. This minimises max_i a[i] + b[perm[i]] (the
    aggregated load when every expert sends what it receives): the k-th smallest a must share with
    one of the n-k+1 smallest b's or force a larger b onto a larger a. Ties keep index order.
    """
    a = _vector(a, "a")
    b = _vector(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same length, got {a.size} and {b.size}")
    perm = np.empty(a.size, dtype=np.intp)
    perm[np.argsort(a, kind="stable")] = np.argsort(-b, kind="stable")
    return perm
