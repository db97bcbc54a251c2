"""The driver solver's layer merge, done in chunks of new states, equals the merge of every new
state at once bit for bit: the same new states, points, and back pointers, ties broken alike."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from planner.driver_solver import Curve, _Knapsack
from planner.exact import pareto_points

States = dict[int, tuple[np.ndarray, np.ndarray]]
Merged = tuple[States, dict[int, tuple[np.ndarray, ...]]]
Keep = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _points(rng: np.random.Generator, n: int, dearer: float) -> tuple[np.ndarray, np.ndarray]:
    """n points with latencies from a few values and costs to a tenth, `dearer` on average
    (fewer local experts cost more): ties abound, also between states."""
    lat = rng.choice([0.0, 0.1, 0.3], size=n)
    return lat, np.round(rng.uniform(0.0, 0.5, size=n) + dearer, 1)


def _curve(rng: np.random.Generator, n: int, dearer: float) -> Curve:
    lat, cost = _points(rng, n, dearer)
    return lat, cost, np.zeros(n, dtype=int), np.zeros(n, dtype=int)


def _instance(seed: int, collapsed: bool) -> tuple[_Knapsack, States, dict[int, Curve], Keep]:
    """A knapsack, the states before a layer (in a random order), the layer's curves, and a
    bound that drops some candidates."""
    rng = np.random.default_rng(seed)
    experts = int(rng.integers(2, 5))
    limit = int(rng.integers(experts, 3 * experts))
    knapsack = _Knapsack([], experts, limit, collapsed)
    ks = rng.choice(experts + 1, size=int(rng.integers(1, experts + 2)), replace=False)
    curves = {int(k): _curve(rng, int(rng.integers(1, 5)), 0.3 * (experts - k)) for k in ks}
    names = rng.permutation(knapsack.size())[: int(rng.integers(1, knapsack.size() + 1))]
    states = {}
    for w in names.tolist():
        states[w] = _points(rng, int(rng.integers(1, 6)), 0.3 * (knapsack.size() - w))
    budget = float(rng.choice([0.3, 0.5, 10.0]))
    return knapsack, states, curves, lambda lat, cost: (lat <= budget) & (cost < 2.5)


def _unchunked(
    knapsack: _Knapsack, states: States, curves: dict[int, Curve], keep: Keep
) -> Merged:
    """The merge as it was before chunks: every new state's candidates at once."""
    ks = np.array(sorted(curves), dtype=int)
    sizes = [curves[k][0].size for k in ks]
    lat_k = np.concatenate([curves[k][0] for k in ks])
    cost_k = np.concatenate([curves[k][1] for k in ks])
    point_k = np.concatenate([np.arange(n) for n in sizes])
    k_of = np.repeat(ks, sizes)
    parts = []
    for w, (lat_w, cost_w) in states.items():
        target = knapsack.targets(w, k_of)
        cols = np.flatnonzero(target >= 0)
        if cols.size == 0:
            continue
        lat = (lat_w[:, None] + lat_k[None, cols]).ravel()
        cost = (cost_w[:, None] + cost_k[None, cols]).ravel()
        ok = np.flatnonzero(keep(lat, cost))
        rows, which = np.divmod(ok, cols.size)
        col = cols[which]
        parts.append((target[col], lat[ok], cost[ok], np.full(ok.size, w), rows, col))
    new_states: States = {}
    back: dict[int, tuple[np.ndarray, ...]] = {}
    if not parts:
        return new_states, back
    columns = (np.concatenate(p) for p in zip(*parts, strict=True))
    target, lat, cost, prev_w, prev_i, col = columns
    stair_lat, stair_cost = np.zeros(0), np.zeros(0)
    for w in np.unique(target):
        rows = np.flatnonzero(target == w)
        chosen = rows[pareto_points(lat[rows], cost[rows])]
        if stair_lat.size:
            at = np.searchsorted(stair_lat, lat[chosen] * (1 + 1e-12), side="right") - 1
            best = np.where(at >= 0, stair_cost[np.maximum(at, 0)], np.inf)
            chosen = chosen[cost[chosen] < best * (1 - 1e-12)]
        if chosen.size == 0:
            continue
        chosen = chosen[np.argsort(lat[chosen], kind="stable")]
        new_states[int(w)] = (lat[chosen], cost[chosen])
        back[int(w)] = (prev_w[chosen], prev_i[chosen], k_of[col[chosen]], point_k[col[chosen]])
        both_lat = np.r_[stair_lat, lat[chosen]]
        both_cost = np.r_[stair_cost, cost[chosen]]
        stair = pareto_points(both_lat, both_cost)
        stair = stair[np.argsort(both_lat[stair], kind="stable")]
        stair_lat, stair_cost = both_lat[stair], both_cost[stair]
    return new_states, back


def _assert_same(got: Merged, want: Merged) -> None:
    for got_part, want_part in zip(got, want, strict=True):
        assert list(got_part) == list(want_part)  # the same new states, in the same order
        for w, arrays in want_part.items():
            for a, b in zip(got_part[w], arrays, strict=True):
                assert a.dtype == b.dtype
                assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("collapsed", [False, True])
def test_chunked_merge_equals_unchunked(collapsed: bool) -> None:
    decided_by_order = 0  # instances whose result depends on the order of the states
    for seed in range(300):
        knapsack, states, curves, keep = _instance(seed, collapsed)
        want = _unchunked(knapsack, states, curves, keep)
        for chunk in (1, 2, 7, 40, 10**18):  # one new state a chunk .. all in one
            _assert_same(knapsack._merge(states, curves, keep, chunk=chunk), want)
        reordered = _unchunked(knapsack, dict(reversed(states.items())), curves, keep)
        decided_by_order += any(
            not np.array_equal(reordered[1][w][0], want[1][w][0]) for w in want[1]
        )
    assert decided_by_order > 10  # so the test sees a change of order within a new state


def test_tie_goes_to_the_first_state_in_order() -> None:
    """States 2 and 1 reach state 3 with the same point (state 2 by a layer of 1 local expert,
    state 1 by one of 2): the first listed wins, whatever the chunks."""
    knapsack = _Knapsack([], 4, 5, False)
    zero = np.zeros(1, dtype=int)
    curves = {
        1: (np.full(1, 0.1), np.full(1, 0.5), zero, zero),
        2: (np.full(1, 0.1), zero, zero, zero),
    }
    states = {2: (np.zeros(1), np.zeros(1)), 1: (np.zeros(1), np.full(1, 0.5))}
    for chunk in (1, 10**18):
        new_states, back = knapsack._merge(
            states, curves, lambda lat, cost: np.ones(lat.size, dtype=bool), chunk=chunk
        )
        assert list(new_states) == [2, 3, 4]
        assert back[3][0].tolist() == [2]  # from state 2
        assert back[3][2].tolist() == [1]  # by 1 local expert


def test_a_merge_too_large_gives_the_lagrangian_plan_and_says_it_is_not_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past `MERGE_CANDIDATES_MAX` candidates at a layer the exact merge stops: the cheapest
    Lagrangian plan within the budget stands, flagged inexact, never cheaper than the exact
    answer and never over the budget."""
    from planner import driver_solver

    rng = np.random.default_rng(3)
    layers = []
    for _ in range(4):
        curves = {}
        for k in range(3):
            lat = np.sort(rng.uniform(1.0, 5.0, size=6))
            cost = np.sort(rng.uniform(1.0, 5.0, size=6))[::-1].copy()
            curves[k] = (lat, cost, np.zeros(6, int), np.zeros(6, int))
        layers.append(curves)
    knapsack = _Knapsack(layers, 2, 6, False)
    fastest = knapsack.totals(knapsack.scalar(0.0, 1.0))[0]
    cheap = knapsack.totals(knapsack.scalar(1.0, 0.0))[0]
    budget = (fastest + cheap) / 2  # binds: the cheapest plan alone does not fit
    exact = knapsack.cheapest(budget)
    assert exact is not None and exact[2]
    monkeypatch.setattr(driver_solver, "MERGE_CANDIDATES_MAX", 0)
    capped = knapsack.cheapest(budget)
    assert capped is not None and not capped[2]
    latency, cost = knapsack.totals(capped[1])
    assert latency <= budget and cost >= exact[0] - 1e-12
