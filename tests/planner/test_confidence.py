"""Confidence-level planning: the plan meets its SLO in at least Q of the scenarios it was
checked on, and on tiny instances it is compared with the brute-force optimum over every
deployment (the cheapest expected bill among those meeting the SLO in Q of the same draws)."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from ground.errors import InfeasibleError
from planner.confidence import (
    CountDistribution,
    attainment,
    levels,
    plan_with_confidence,
    with_counts,
)
from planner.costmodel import Choice, Solution, evaluate
from planner.exact import solve_exact, solve_frontier
from planner.instance import Instance, Method

from .small import small_instance


def _tiny(seed: int) -> tuple[Instance, CountDistribution]:
    """One layer of two experts whose compute dominates its latency (thousands of tokens)."""
    inst = small_instance(seed, layers=1, experts=2, memories=3, replicas=3, betas=(8,))
    mean = np.maximum(inst.counts, 20.0) * 10
    inst = dataclasses.replace(inst, tokens=4000, counts=mean)
    return inst, CountDistribution(mean, 0.2 * mean + 3.0, inst.tokens)


def _every_choice(inst: Instance) -> list[Choice]:
    memories, replicas = range(inst.memory_mb.size), range(1, inst.max_replicas + 1)
    choices = []
    for method in Method:
        options = itertools.product(itertools.product(memories, replicas), repeat=inst.experts)
        for combo in options:
            choices.append(
                Choice(
                    method=np.array([int(method)]),
                    beta=np.array([8 if method is Method.PIPELINED else 1]),
                    memory=np.array([[j for j, _ in combo]]),
                    replicas=np.array([[g for _, g in combo]]),
                )
            )
    return choices


def _brute_force(
    inst: Instance, draws: np.ndarray, slo_s: float, q: float
) -> tuple[float, float] | None:
    """(expected served cost, attainment) of the cheapest deployment meeting Q on `draws`."""
    best = None
    for choice in _every_choice(inst):
        if not evaluate(inst, choice).feasible:
            continue  # a limit (memory, payload) breaks on the sizing counts themselves
        deployed = SimpleNamespace(choice=choice)
        met, cost = attainment(inst, deployed, draws, slo_s, q)  # type: ignore[arg-type]
        if cost is not None and met >= q and (best is None or cost < best[0]):
            best = (cost, met)
    return best


@pytest.mark.parametrize("seed", [0, 4])
def test_the_confident_plan_meets_q_and_is_near_the_brute_force_optimum(seed: int) -> None:
    inst, dist = _tiny(seed)
    # An SLO just above the third-fastest deployment: the point plan is sized right at it.
    slo_s = sorted(solve_frontier(inst).points())[2][0] * 1.01
    q, scenarios = 0.9, 40
    plan = plan_with_confidence(
        dist,
        q,
        slo_s,
        lambda c: with_counts(inst, c),
        lambda i: solve_exact(i, slo_s),
        scenarios=scenarios,
        seed=seed,
    )
    draws = dist.draw(scenarios, seed)
    share, cost = attainment(plan.inst, plan.solution, draws, slo_s)
    assert share >= q and share == plan.attainment and cost == pytest.approx(plan.expected_cost)
    best = _brute_force(inst, draws, slo_s, q)
    assert best is not None
    # The ladder's plan is feasible for Q; its expected bill is within 25 % of the optimum.
    assert best[0] <= cost * (1 + 1e-9) and cost <= 1.25 * best[0], (cost, best)
    # The point plan, sized for the mean, falls short of Q on the same draws.
    point_plan = solve_exact(inst, slo_s)
    assert attainment(inst, point_plan, draws, slo_s)[0] < q


def test_levels_end_at_the_bonferroni_level_and_infeasible_names_the_best() -> None:
    assert levels(0.99, 10) == [0.5, 0.75, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999]
    assert levels(0.99, 10)[-1] == pytest.approx(1 - 0.01 / 10)
    inst, dist = _tiny(0)
    fastest = solve_exact(inst, None).latency / 100  # nothing is this fast

    def solve(candidate: Instance) -> Solution | None:
        return solve_exact(candidate, fastest)

    with pytest.raises(InfeasibleError, match="probability 0.99"):
        plan_with_confidence(dist, 0.99, fastest, lambda c: with_counts(inst, c), solve)


def test_a_wider_distribution_never_buys_a_cheaper_plan() -> None:
    inst, dist = _tiny(2)
    slo_s = solve_exact(inst, None).latency * 1.3
    costs = []
    for spread in (0.05, 0.2, 0.4):
        wide = dataclasses.replace(dist, std=dist.mean * spread)
        plan = plan_with_confidence(
            wide, 0.95, slo_s, lambda c: with_counts(inst, c), lambda i: solve_exact(i, slo_s)
        )
        costs.append(plan.solution.cost)
    assert costs == sorted(costs)
