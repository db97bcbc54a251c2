"""Bottleneck matching and Theorem 6.2's sorted pairing against brute force over permutations."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest

from gpu.aurora.matching import bottleneck_matching, sorted_pairing


def _all_perms(n: int) -> np.ndarray:
    return np.array(list(permutations(range(n))), dtype=np.intp)


def _brute_min_max(weights: np.ndarray) -> tuple[float, float]:
    """(min over permutations of the max matched weight, least sum among those minimisers)."""
    perms = _all_perms(weights.shape[0])
    matched = weights[np.arange(weights.shape[0]), perms]  # (n!, n)
    maxima = matched.max(axis=1)
    best = maxima.min()
    return float(best), float(matched.sum(axis=1)[maxima == best].min())


@pytest.mark.parametrize("n", range(1, 8))
def test_bottleneck_value_equals_brute_force(n: int) -> None:
    rng = np.random.default_rng(n)
    for trial in range(40 if n < 7 else 10):
        # Half continuous, half small integers so that many matchings tie at the bottleneck.
        if trial % 2:
            weights = rng.integers(0, 5, size=(n, n)).astype(float)
        else:
            weights = rng.random((n, n))
        perm, value = bottleneck_matching(weights)
        best, least_sum = _brute_min_max(weights)
        assert sorted(perm.tolist()) == list(range(n))
        assert value == best
        matched = weights[np.arange(n), perm]
        assert matched.max() == value
        # Tie-break: minimum total weight among the bottleneck-optimal matchings.
        assert matched.sum() == pytest.approx(least_sum, rel=1e-12, abs=1e-12)


def test_bottleneck_hand_example() -> None:
    # The min-sum assignment (0->0, 1->1: sum 1 + 9 = 10) has bottleneck 9; crossing costs
    # 5 + 6 = 11 but its largest weight is only 6.
    weights = np.array([[1.0, 5.0], [6.0, 9.0]])
    perm, value = bottleneck_matching(weights)
    assert perm.tolist() == [1, 0]
    assert value == 6.0


def test_bottleneck_is_deterministic() -> None:
    weights = np.ones((5, 5))
    first = bottleneck_matching(weights)
    again = bottleneck_matching(weights.copy())
    assert np.array_equal(first[0], again[0]) and first[1] == again[1] == 1.0


@pytest.mark.parametrize("n", range(1, 8))
def test_sorted_pairing_is_optimal_theorem_6_2(n: int) -> None:
    rng = np.random.default_rng(100 + n)
    perms = _all_perms(n)
    for trial in range(30):
        a = rng.integers(0, 50, size=n).astype(float) if trial % 2 else rng.random(n)
        b = rng.integers(0, 50, size=n).astype(float) if trial % 2 else rng.random(n)
        perm = sorted_pairing(a, b)
        assert sorted(perm.tolist()) == list(range(n))
        brute = (a + b[perms]).max(axis=1).min()
        assert (a + b[perm]).max() == brute


def test_sorted_pairing_pairs_small_with_large() -> None:
    perm = sorted_pairing(np.array([3.0, 1.0, 2.0]), np.array([10.0, 30.0, 20.0]))
    # a ascending: 1 (idx 1), 2 (idx 2), 3 (idx 0); b descending: 30 (idx 1), 20 (idx 2), 10.
    assert perm.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.ones((2, 3)), "square"),
        (np.ones(3), "square"),
        (np.zeros((0, 0)), "non-empty"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), "finite"),
    ],
)
def test_bottleneck_rejects_bad_weights(weights: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bottleneck_matching(weights)


def test_sorted_pairing_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="same length"):
        sorted_pairing(np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="1-D"):
        sorted_pairing(np.ones((2, 2)), np.ones(2))
    with pytest.raises(ValueError, match="finite"):
        sorted_pairing(np.array([np.inf]), np.ones(1))
