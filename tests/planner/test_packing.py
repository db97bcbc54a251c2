"""Expert packing: balanced groups, the packed instance, and the grouping heuristic's gap to every
grouping of small layers."""

from __future__ import annotations

import numpy as np
import pytest

from planner.confidence import (
    CountDistribution,
    attainment,
    plan_with_confidence,
    with_counts,
)
from planner.exact import solve_exact
from planner.instance import default_betas
from planner.packing import (
    balanced_groups,
    brute_force_groups,
    function_counts,
    group_sizes,
    pack,
    unpacked,
)
from tests.planner.small import small_instance


def test_group_sizes_are_the_divisors_unpacked_first() -> None:
    assert group_sizes(16) == [1, 2, 4, 8, 16]
    assert group_sizes(60)[:6] == [1, 2, 3, 4, 5, 6]
    assert group_sizes(7) == [1, 7]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 12])
def test_balanced_groups_host_every_expert_once_with_near_equal_loads(size: int) -> None:
    rng = np.random.default_rng(size)
    counts = np.floor(rng.dirichlet(np.full(12, 0.5), size=5) * 1000)
    groups = balanced_groups(counts, size)
    assert groups.shape == (5, 12 // size, size)
    for layer in range(5):
        assert sorted(groups[layer].ravel().tolist()) == list(range(12))
        assert all(list(g) == sorted(g) for g in groups[layer])
        loads = counts[layer][groups[layer]].sum(axis=1)
        # LPT with equal group sizes: the spread is at most the largest single expert's count
        assert loads.max() - loads.min() <= counts[layer].max()
    with pytest.raises(ValueError, match="do not divide"):
        balanced_groups(counts, 5)


def test_a_packed_instance_is_its_groups_sums_and_repacks_other_counts() -> None:
    inst = small_instance(3, layers=2, experts=4, memories=4, replicas=3, betas=())
    groups = balanced_groups(inst.counts, 2)
    packed = pack(inst, groups)
    assert packed.experts == 2 and packed.hosted == 2 and unpacked(packed) is inst
    for layer in range(2):
        for f in range(2):
            members = groups[layer, f]
            assert packed.counts[layer, f] == inst.counts[layer, members].sum()
            assert packed.expert_bytes[layer, f] == inst.expert_bytes[layer, members].sum()
    doubled = with_counts(packed, inst.counts * 2)
    assert np.array_equal(doubled.counts, packed.counts * 2) and doubled.hosted == 2
    assert packed.betas == default_betas(packed.counts)  # the candidates follow the shards


def test_groups_of_one_plan_exactly_like_the_unpacked_instance() -> None:
    inst = small_instance(5, layers=2, experts=3, memories=3, replicas=2)
    single = pack(inst, np.arange(3)[None, :, None].repeat(2, axis=0))
    for slo in (None, 2.0):
        a, b = solve_exact(inst, slo), solve_exact(single, slo)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert b.cost == pytest.approx(a.cost, rel=1e-12)


def _cheapest(inst, groups, slo):  # type: ignore[no-untyped-def]
    solution = solve_exact(pack(inst, groups[None]), slo)
    return np.inf if solution is None else solution.cost


@pytest.mark.parametrize(("experts", "size"), [(6, 2), (6, 3), (8, 2), (8, 4)])
def test_balanced_grouping_is_within_its_measured_gap_of_every_grouping(
    experts: int, size: int
) -> None:
    """One layer, every grouping solved exactly: the heuristic's cost over the best one's.

    Measured over these 4 cases x 6 seeds x 2 SLOs (none, and a tight one): mean 1.010x,
    worst 1.075x (6 experts in pairs); the test holds it to 1.10x, and to the best grouping
    in some case.
    """
    gaps = []
    for seed in range(6):
        inst = small_instance(seed, layers=1, experts=experts, memories=4, replicas=3)
        for slo in (None, 1.5 * (inst.fixed_s() + 0.5)):
            best = min(_cheapest(inst, g, slo) for g in brute_force_groups(experts, size))
            ours = _cheapest(inst, balanced_groups(inst.counts, size)[0], slo)
            if np.isfinite(best):
                assert np.isfinite(ours)
                gaps.append(ours / best)
    assert min(gaps) == pytest.approx(1.0)
    assert max(gaps) <= 1.10, gaps


def test_brute_force_enumerates_every_grouping_once() -> None:
    found = [tuple(map(tuple, g)) for g in brute_force_groups(6, 2)]
    assert len(found) == len(set(found)) == 15  # 5 x 3 x 1
    assert len(list(brute_force_groups(6, 3))) == 10
    assert len(list(brute_force_groups(8, 4))) == 35


def test_a_packed_plan_is_sized_and_served_on_its_functions_sums() -> None:
    """`plan --confidence` with packing: scenarios are drawn per expert and served per function."""
    inst = small_instance(2, layers=2, experts=4, memories=4, replicas=3, betas=())
    groups = balanced_groups(inst.counts, 2)
    packed = pack(inst, groups)
    dist = CountDistribution(inst.counts, 0.2 * inst.counts + 1.0, inst.tokens, None)
    slo = solve_exact(packed, None).latency * 1.2  # type: ignore[union-attr]
    confident = plan_with_confidence(
        dist,
        0.9,
        slo,
        lambda c: with_counts(packed, c),
        lambda i: solve_exact(i, slo),
        scenarios=40,
        seed=0,
    )
    assert confident.inst.hosted == 2 and np.array_equal(confident.inst.groups, groups)
    draws = dist.draw(40, 0)
    share, _ = attainment(confident.inst, confident.solution, draws, slo)
    assert share == confident.attainment >= 0.9
    quantile = dist.quantile(confident.level)
    assert np.allclose(confident.inst.counts, function_counts(groups, quantile))
