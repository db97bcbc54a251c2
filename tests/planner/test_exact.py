"""The exact frontier solver (serverless-model.md §7 [beyond]) against brute force.

Brute force enumerates every complete decision of tiny instances, so agreement on the optimum,
on infeasibility and on every breakpoint of the cost-vs-SLO curve shows that no Pareto point is
lost by the threshold enumeration or by the pruning between merges.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.costmodel import evaluate, global_terms
from planner.exact import (
    Frontier,
    hull_sum,
    lower_hull,
    pareto_points,
    solve_bounded,
    solve_exact,
    solve_frontier,
)
from planner.instance import Instance, Method

from .small import brute_force, layer_table, small_instance

RTOL = 1e-9
SHAPES = {
    "default": {},
    "deep": {"layers": 3, "experts": 2, "memories": 2},
    "standard": {"workflow": "standard"},  # transitions instead of Express duration
    "experts": {"objective": "experts"},  # the paper's objective
    "whole_batch": {"betas": (8, 512, 4096)},  # degrees above every count: one stands for all
}
METHODS = [tuple(Method), (Method.PIPELINED,), (Method.S3,), (Method.DIRECT,)]
CASES = [(shape, seed) for shape in SHAPES for seed in range(12 if len(shape) < 8 else 6)]


def _instance(shape: str, seed: int) -> Instance:
    return small_instance(seed, **SHAPES[shape])


def _all_plans(inst: Instance, methods: tuple[Method, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(latency including fixed_s, cost) of every complete decision, by exhaustive enumeration."""
    usd, per_s = global_terms(inst)
    latency, cost = np.zeros(1), np.array([usd + per_s * inst.fixed_s()])
    for layer in range(inst.layers):
        rows = layer_table(inst, layer, methods)
        latency = (latency[:, None] + np.array([r[1] for r in rows] or [np.inf])).ravel()
        cost = (cost[:, None] + np.array([r[0] for r in rows] or [np.inf])).ravel()
    return inst.fixed_s() + latency, cost


def _check_solution(
    frontier: Frontier,
    slo: float | None,
    expected: tuple | None,
    methods: tuple[Method, ...] = tuple(Method),
) -> None:
    """The whole curve's answer and the SLO-bounded solve's both equal brute force."""
    solution = frontier.best(slo)
    bounded = solve_exact(frontier.inst, slo, methods)
    assert (bounded is None) == (expected is None)
    if bounded is not None:
        assert bounded.cost == pytest.approx(expected[0], rel=RTOL, abs=0)
        assert evaluate(frontier.inst, bounded.choice, slo).feasible
    assert (solution is None) == (expected is None)
    if solution is None:
        return
    assert solution.solver == "exact" and solution.optimal is True and solution.seconds > 0
    assert solution.cost == pytest.approx(expected[0], rel=RTOL, abs=0)
    assert solution.evaluation.violations == []
    again = evaluate(frontier.inst, solution.choice, slo)
    assert again.cost == pytest.approx(solution.cost, rel=RTOL) and again.feasible


@pytest.mark.parametrize("methods", METHODS, ids=lambda m: "+".join(x.label for x in m))
@pytest.mark.parametrize(("shape", "seed"), CASES)
def test_optimum_matches_brute_force(shape: str, seed: int, methods: tuple[Method, ...]) -> None:
    inst = _instance(shape, seed)
    frontier = solve_frontier(inst, methods)
    latency, _ = _all_plans(inst, methods)
    fastest = float(latency.min())
    assert frontier.min_latency() == pytest.approx(fastest, rel=1e-12)
    cheapest = brute_force(inst, None, methods)
    _check_solution(frontier, None, cheapest, methods)
    if cheapest is None:
        assert not np.isfinite(fastest) and frontier.best(1e6) is None
        return
    slowest = evaluate(inst, cheapest[1]).latency
    for slo in (
        fastest,
        (fastest + slowest) / 2,
        2 * slowest,
        fastest - 1e-6,
        0.5 * inst.fixed_s(),
    ):
        _check_solution(frontier, slo, brute_force(inst, slo, methods), methods)


@pytest.mark.parametrize(("shape", "seed"), CASES[::3])
def test_every_breakpoint_of_the_curve(shape: str, seed: int) -> None:
    """At each curve latency brute force finds that point's cost; just below, the previous's."""
    inst = _instance(shape, seed)
    frontier = solve_frontier(inst)
    latency, cost = _all_plans(inst, tuple(Method))
    slos = frontier.latency_s
    at = np.array([cost[latency <= slo * (1 + RTOL)].min() for slo in slos])
    np.testing.assert_allclose(frontier.cost_usd, at, rtol=RTOL)
    below = [cost[latency < slo * (1 - 1e-7)] for slo in slos]
    assert below[0].size == 0
    np.testing.assert_allclose([b.min() for b in below[1:]], frontier.cost_usd[:-1], rtol=RTOL)
    assert frontier.cost_usd[-1] == pytest.approx(cost.min(), rel=RTOL)


@pytest.mark.parametrize(("shape", "seed"), CASES[::4])
def test_curve_is_monotone_and_each_point_re_evaluates(shape: str, seed: int) -> None:
    inst = _instance(shape, seed)
    frontier = solve_frontier(inst)
    assert np.all(np.diff(frontier.latency_s) > 0) and np.all(np.diff(frontier.cost_usd) < 0)
    assert frontier.points() == list(zip(frontier.latency_s, frontier.cost_usd, strict=True))
    for point, (slo, cost) in enumerate(frontier.points()):
        evaluation = evaluate(inst, frontier.choice(point), slo)
        assert evaluation.cost == pytest.approx(cost, rel=RTOL) and evaluation.feasible
        assert evaluation.latency == pytest.approx(slo, rel=1e-12)
    grid = np.linspace(frontier.min_latency(), 1.2 * frontier.latency_s[-1], 40)
    costs = [frontier.best(float(slo)).cost for slo in grid]
    assert np.all(np.diff(costs) <= 0)


def test_forced_method_and_pipeline_degree() -> None:
    inst = small_instance(3, layers=3)
    for method in Method:
        solution = solve_exact(inst, None, (method,))
        if solution is None:
            continue
        assert set(solution.choice.method) == {int(method)}
        allowed = set(inst.betas) if method is Method.PIPELINED else {1}
        assert set(solution.choice.beta) <= allowed


def test_idle_layer_and_determinism() -> None:
    base = small_instance(5)
    counts = base.counts.copy()
    counts[1] = 0
    inst = dataclasses.replace(base, counts=counts)
    first, second = solve_exact(inst, None), solve_exact(inst, None)
    expected = brute_force(inst, None)
    assert first.cost == pytest.approx(expected[0], rel=RTOL)
    assert first.evaluation.expert_cost[1].sum() == 0  # an idle layer's experts cost nothing
    for field in ("method", "beta", "memory", "replicas"):
        np.testing.assert_array_equal(getattr(first.choice, field), getattr(second.choice, field))


def test_the_bounded_solve_equals_the_whole_curve_everywhere() -> None:
    """solve_exact prunes by the SLO and a Lagrangian bound: at every breakpoint of the curve,
    between breakpoints, below the fastest plan and with no SLO it returns the curve's optimum."""
    inst = small_instance(7, layers=4, experts=8, memories=6, replicas=8, betas=(1, 4, 16, 64))
    frontier = solve_frontier(inst)
    latency = frontier.latency_s
    slos = [None, latency[0] * (1 - 1e-6), *latency[::3], *((latency[1:] + latency[:-1]) / 2)]
    for slo in slos:
        whole, bounded = frontier.best(slo), solve_exact(inst, slo)
        assert (whole is None) == (bounded is None)
        if whole is not None:
            assert bounded.cost == pytest.approx(whole.cost, rel=RTOL)
            assert evaluate(inst, bounded.choice, slo).feasible
    middle = float(latency[latency.size // 2])
    part = solve_bounded(inst, middle)
    assert part.cost_usd.size < frontier.cost_usd.size  # the bound prunes
    assert part.min_latency() == pytest.approx(frontier.min_latency(), rel=1e-12)
    assert part.best(middle).note.startswith("bounded curve of ")


def test_larger_instance_is_consistent() -> None:
    """Beyond brute force's reach: the curve still re-evaluates exactly, point by point."""
    inst = small_instance(7, layers=4, experts=8, memories=6, replicas=8, betas=(1, 4, 16, 64))
    frontier = solve_frontier(inst)
    assert frontier.layer_sizes and frontier.merged_sizes[-1] == frontier.cost_usd.size
    assert max(frontier.merged_sizes) <= np.prod(frontier.layer_sizes)
    for point in range(0, frontier.cost_usd.size, 7):
        evaluation = evaluate(inst, frontier.choice(point), float(frontier.latency_s[point]))
        assert evaluation.cost == pytest.approx(frontier.cost_usd[point], rel=RTOL)
        assert evaluation.feasible
    assert solve_exact(inst, frontier.min_latency() * 0.999) is None


def _staircase(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A random Pareto curve: latency ascending, cost strictly descending."""
    latency, cost = rng.uniform(0, 10, size), rng.uniform(0, 10, size)
    keep = pareto_points(latency, cost)
    return latency[keep], cost[keep]


@pytest.mark.parametrize("seed", range(20))
def test_lower_hull_is_convex_and_under_every_point(seed: int) -> None:
    """The bound's hull: vertices from the curve, slopes ascending, no point below it."""
    latency, cost = _staircase(np.random.default_rng(seed), 60)
    x, y = lower_hull(latency, cost)
    assert set(zip(x, y, strict=True)) <= set(zip(latency, cost, strict=True))
    assert x[0] == latency[0] and x[-1] == latency[-1]
    assert np.all(np.diff(np.diff(y) / np.diff(x)) > 0)
    assert np.all(np.interp(latency, x, y) <= cost + 1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_hull_of_a_minkowski_sum_is_the_sum_of_hulls(seed: int) -> None:
    """Against brute force: the hull of every combination of points of three curves."""
    rng = np.random.default_rng(seed)
    curves = [_staircase(rng, 12) for _ in range(3)]
    latency, cost = np.zeros(1), np.zeros(1)
    for t, c in curves:
        latency = (latency[:, None] + t).ravel()
        cost = (cost[:, None] + c).ravel()
    keep = pareto_points(latency, cost)
    expected = lower_hull(latency[keep], cost[keep])
    x, y = hull_sum([lower_hull(t, c) for t, c in curves])
    assert x[0] == pytest.approx(expected[0][0]) and x[-1] == pytest.approx(expected[0][-1])
    probe = np.linspace(x[0], x[-1], 200)
    np.testing.assert_allclose(np.interp(probe, x, y), np.interp(probe, *expected), atol=1e-9)
    assert np.all(np.interp(latency, x, y) <= cost + 1e-9)  # a lower bound on every plan
