"""The driver and monolithic shapes' cost model and exact solver, against a brute force."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from ground.driver import driver_request_counts, overflows, shard_counts
from ground.errors import InfeasibleError
from ground.semantics import direct_event_bytes
from planner import load_calibration
from planner.compute import compute_s_at, expert_compute_s
from planner.driver import (
    DriverChoice,
    DriverInstance,
    driver_options_mb,
    driver_usage,
    evaluate_driver,
    remote_options,
)
from planner.driver_solver import ALL_SUBSETS_MAX, local_families, solve_driver, solve_monolithic
from tests.planner.small import small_instance


def small_driver(seed: int, *, layers: int = 2, experts: int = 3) -> DriverInstance:
    """A driver problem small enough to enumerate: 2 to 3 driver memories, a payload limit
    that some shards pass (so overflow through S3 is in play), memory that may bind."""
    rng = np.random.default_rng(1000 + seed)
    base = small_instance(seed, layers=layers, experts=experts, memories=2, replicas=2)
    memory = np.sort(rng.choice([1024.0, 1769.0, 3538.0, 5307.0], size=3, replace=False))
    unit = float(base.expert_bytes.max()) / 2**20
    u = 3e-5 * 1769 / np.minimum(memory, 1769.0)
    return DriverInstance(
        base=base,
        top_k=2,
        runtime_mb=400.0,
        nonmoe_mb=float(rng.uniform(100, 400)),
        unit_mb=unit,
        experts_mb=base.expert_bytes / 2**20,
        layer_flops=np.full(layers, 1e6),
        tail_flops=1e5,
        expert_flops=1e6,
        memory_mb=memory,
        u_layer=np.repeat(u[:, None] * rng.uniform(0.5, 2.0), layers, axis=1),
        u_expert=u * rng.uniform(0.5, 4.0),
        u_tail=u * 0.1,
        activations_mb=float(rng.uniform(50, 400)),
        activations_local_mb=float(rng.uniform(20, 50)),
        payload_limit=int(rng.choice([60_000, 200_000, 6_291_456])),
        round_trip_s=0.03,
        max_memory_mb=10240.0,
    )


def brute_force(dinst: DriverInstance, slo_s: float | None) -> float:
    """The least cost of any driver plan with at least one remote expert, by enumeration."""
    L, E = dinst.layers, dinst.experts
    b = dinst.base
    options = list(itertools.product(range(b.memory_mb.size), range(b.max_replicas)))
    best = math.inf
    for d in range(dinst.memory_mb.size):
        for flat in itertools.product([False, True], repeat=L * E):
            local = np.array(flat).reshape(L, E)
            if local.all():
                continue
            remote = np.argwhere(~local)
            for combo in itertools.product(options, repeat=len(remote)):
                memory = np.zeros((L, E), int)
                replicas = np.ones((L, E), int)
                for (layer, expert), (j, g) in zip(remote, combo, strict=True):
                    memory[layer, expert], replicas[layer, expert] = j, g + 1
                ev = evaluate_driver(dinst, DriverChoice(d, local, memory, replicas), slo_s)
                if ev.feasible:
                    best = min(best, ev.cost)
    return best


SHAPES = [(1, 2), (1, 3), (2, 2)]  # (layers, experts): 5^(L E) plans at most per memory


@pytest.mark.parametrize("seed", range(60))
def test_the_exact_driver_solver_equals_brute_force(seed: int) -> None:
    layers, experts = SHAPES[seed % 3]
    dinst = small_driver(seed, layers=layers, experts=experts)
    loose = solve_driver(dinst, None)
    slo = None if seed % 3 == 0 else loose.min_latency * (1.0 + (seed % 5) * 0.15)
    expected = brute_force(dinst, slo)
    try:
        found = solve_driver(dinst, slo)
    except InfeasibleError:
        assert expected == math.inf
        return
    assert found.evaluation.feasible, found.evaluation.violations
    assert found.cost == pytest.approx(expected, rel=1e-9)
    assert not found.choice.local.all()


def test_the_smallest_slo_is_the_fastest_plan_brute_force_finds() -> None:
    for seed in range(6):
        dinst = small_driver(seed, layers=1, experts=2 + seed % 2)
        found = solve_driver(dinst, None)
        fastest = min(
            evaluate_driver(dinst, choice).latency
            for choice in _every_choice(dinst)
            if not evaluate_driver(dinst, choice).violations
        )
        assert found.min_latency == pytest.approx(fastest, rel=1e-9)
        with pytest.raises(InfeasibleError, match="fastest takes"):
            solve_driver(dinst, fastest * 0.99)


def _every_choice(dinst: DriverInstance):  # type: ignore[no-untyped-def]
    L, E = dinst.layers, dinst.experts
    b = dinst.base
    options = list(itertools.product(range(b.memory_mb.size), range(b.max_replicas)))
    for d in range(dinst.memory_mb.size):
        for flat in itertools.product([False, True], repeat=L * E):
            local = np.array(flat).reshape(L, E)
            if local.all():
                continue
            for combo in itertools.product(options, repeat=L * E):
                memory = np.array([c[0] for c in combo]).reshape(L, E)
                replicas = np.array([c[1] + 1 for c in combo]).reshape(L, E)
                yield DriverChoice(d, local, memory, replicas)


def test_monolithic_takes_the_cheapest_memory_that_meets_the_slo() -> None:
    dinst = small_driver(3)
    dinst = dataclasses.replace(dinst, activations_local_mb=10.0)
    everything = np.ones((dinst.layers, dinst.experts), bool)
    zeros = np.zeros((dinst.layers, dinst.experts), int)
    evaluations = [
        evaluate_driver(dinst, DriverChoice(d, everything, zeros, zeros + 1))
        for d in range(dinst.memory_mb.size)
    ]
    fits = [e for e in evaluations if not e.violations]
    cheapest = min(fits, key=lambda e: e.cost)
    assert solve_monolithic(dinst, None).cost == pytest.approx(cheapest.cost)
    fastest = min(e.latency for e in fits)
    tight = solve_monolithic(dinst, fastest * 1.0001)
    assert tight.latency == pytest.approx(fastest)
    with pytest.raises(InfeasibleError, match="fastest takes"):
        solve_monolithic(dinst, fastest * 0.999)


def test_monolithic_refuses_a_model_past_the_largest_function() -> None:
    dinst = dataclasses.replace(small_driver(4), nonmoe_mb=20_000.0)
    with pytest.raises(InfeasibleError, match=r"weights 21\.\d GB > 10,240 MB"):
        solve_monolithic(dinst, None)
    with pytest.raises(InfeasibleError, match="no driver holds the non-MoE stack"):
        solve_driver(dinst, None)


def test_a_shard_past_the_payload_limit_goes_through_s3() -> None:
    limit = 6 * 2**20
    token_bytes = 16384
    fits = 1
    while direct_event_bytes(fits + 1, token_bytes) <= limit:
        fits += 1
    assert not overflows(fits, token_bytes, limit)
    assert overflows(fits + 1, token_bytes, limit)
    # 2 replicas: one shard of fits + 1 rows overflows, the other (fits rows) stays inline
    assert shard_counts(2 * fits + 1, 2, token_bytes, limit) == (2, 1, fits)
    tokens = np.array([[2 * fits + 1, 0, 3]])
    counts, largest = driver_request_counts(
        tokens, np.array([[2, 1, 1]]), np.array([[False, False, True]]), token_bytes, limit
    )
    # driver + 2 shards; input GET, output PUT; the overflow shard: 2 PUT, 2 GET; cleanup
    assert counts.as_dict() == {
        "lambda_requests": 3,
        "s3_put": 3,
        "s3_get": 3,
        "s3_get_poll": 0,
        "s3_list": 1,
        "s3_delete": 1,
        "transitions": 1,
    }
    assert largest == direct_event_bytes(fits, token_bytes)


def test_remote_options_price_overflow_with_its_requests() -> None:
    dinst = small_driver(7, layers=1, experts=3)
    b = dinst.base
    opts = remote_options(dinst, 0)
    for i in range(3):
        d = math.ceil(b.counts[0, i])
        for g in range(b.max_replicas):
            over = shard_counts(d, g + 1, int(b.token_bytes_in), dinst.payload_limit)[1]
            assert (opts.overflow[i, :, g] == over).all()
            busy = min(d, g + 1)
            gb_usd = opts.experts_usd[i, :, g]
            extra = opts.cost[i, :, g] - gb_usd
            assert extra == pytest.approx(
                busy * b.request_usd + over * 2 * (b.s3_put_usd + b.s3_get_usd)
            )


def test_usage_counts_what_the_driver_requests() -> None:
    dinst = small_driver(11)
    found = solve_driver(dinst, None)
    used = driver_usage(dinst, found.choice, found.evaluation)
    tokens = np.ceil(dinst.base.counts).astype(int)
    counts, _ = driver_request_counts(
        tokens,
        found.choice.replicas,
        found.choice.local,
        int(dinst.base.token_bytes_in),
        dinst.payload_limit,
    )
    assert {k: used[k] for k in counts.as_dict()} == counts.as_dict()
    driver_gb_s = dinst.memory_mb[found.choice.memory] * found.latency / 1024
    assert used["gb_s"] == pytest.approx(driver_gb_s + used["experts_gb_s"])


def test_local_sets_are_every_subset_then_popularity_prefixes_and_suffixes() -> None:
    small = local_families(np.array([5.0, 1.0, 3.0]))
    assert small.shape == (8, 3) and len({tuple(r) for r in small}) == 8
    experts = ALL_SUBSETS_MAX + 2
    counts = np.arange(experts, dtype=float)[::-1].copy()  # expert 0 most popular
    big = local_families(counts)
    assert len(big) == len({tuple(r) for r in big}) == (experts + 1) * (experts + 2) // 2 - experts
    for row in big:  # the locals are a top block and a bottom block of popularity
        chosen = np.flatnonzero(row)
        a = next((i for i in range(experts + 1) if i == experts or not row[i]), experts)
        assert set(chosen) == set(range(a)) | set(chosen[chosen >= a])
        tail = chosen[chosen >= a]
        assert tail.size == 0 or (tail == np.arange(experts - tail.size, experts)).all()


def test_compute_at_any_memory_matches_the_calibrated_options() -> None:
    cal = load_calibration()
    options = np.array(cal.memory_options_mb, float)
    flops = 2.0 * 1e6
    assert compute_s_at(cal, flops, options) == pytest.approx(
        expert_compute_s(cal, flops), rel=2e-3
    )
    # past the calibrated options: faster with each vCPU, never faster than linear
    options = driver_options_mb(cal)
    times = compute_s_at(cal, flops, options)
    assert (np.diff(times) <= 0).all()
    assert times[-1] >= times[0] * options[0] / options[-1]
    assert options.max() == cal.lambda_max_memory_mb
