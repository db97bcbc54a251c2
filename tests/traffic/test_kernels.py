"""The compiled batcher and environment pools against hand-computed cases and brute force."""

from __future__ import annotations

import numpy as np
import pytest

from planner.traffic._kernels import batch_requests, run_pools
from tests.traffic.brute import brute_batches, brute_pools


def _pools(
    dispatch: list[float] | np.ndarray,
    offset: np.ndarray,
    duration: np.ndarray,
    replicas: np.ndarray,
    stage: list[int] | np.ndarray,
    init_s: list[float] | np.ndarray,
    *,
    provisioned: list[int] | None = None,
    idle_s: float = 300.0,
    ping_interval_s: list[float] | None = None,
    ping_count: list[int] | None = None,
    ping_s: float = 0.02,
    period_s: float = 1e6,
    reserved: list[int] | None = None,
    retry_waits: tuple[float, ...] = (),
) -> tuple[np.ndarray, ...]:
    """run_pools with one grid point per batch (batch b reads grid row b exactly); returns
    (delay, stage delay, cold, cold pings, pings, provisioned seconds, peak, histogram, failed)."""
    batches, functions = offset.shape
    grid_i = np.arange(batches, dtype=np.int64)
    pad = np.vstack([offset, offset[-1:]]), np.vstack([duration, duration[-1:]])
    out = run_pools(
        np.asarray(dispatch, dtype=float),
        grid_i,
        np.zeros(batches),
        grid_i,  # batch b's "tokens" index row b of the replica table
        np.asarray(stage, dtype=np.int64),
        pad[0],
        pad[1],
        np.asarray(replicas, dtype=np.int64),
        np.asarray(init_s, dtype=float),
        np.asarray(provisioned or [0] * functions, dtype=np.int64),
        np.asarray(reserved or [0] * functions, dtype=np.int64),
        np.asarray(retry_waits, dtype=float),
        float(idle_s),
        np.asarray(ping_interval_s or [0.0] * functions, dtype=float),
        np.asarray(ping_count or [0] * functions, dtype=np.int64),
        float(ping_s),
        float(period_s),
    )
    delay, failed, *rest = out
    return (delay, *rest, failed)


def test_one_function_idle_timeout_by_hand() -> None:
    # Arrivals at 0, 100, 200, 600, 650 s; 1 s of work; INIT 5 s; reclaimed after 300 s idle.
    # The environment is free at 6, 101, 201: 600 - 201 = 399 > 300, so 600 starts cold again.
    dispatch = [0.0, 100.0, 200.0, 600.0, 650.0]
    ones = np.ones((5, 1))
    delay, stage_delay, cold, cold_pings, pings, pc_s, peak, _, failed = _pools(
        dispatch, 0 * ones, ones, ones.astype(int), [0], [5.0], idle_s=300.0
    )
    assert delay.tolist() == [5.0, 0.0, 0.0, 5.0, 0.0]
    assert stage_delay.tolist() == [10.0]
    assert cold.tolist() == [2] and cold_pings.tolist() == [0] and pings.tolist() == [0]
    assert peak.tolist() == [1]


def test_scale_out_and_provisioned_by_hand() -> None:
    # Two overlapping invocations need two environments; with one provisioned only the second
    # starts cold, and the provisioned one serves 1 s.
    ones = np.ones((2, 1))
    args = ([0.0, 0.5], 0 * ones, ones, ones.astype(int), [0], [5.0])
    delay, *_ = _pools(*args)
    assert delay.tolist() == [5.0, 5.0]
    delay, _, cold, _, _, pc_s, peak, *_ = _pools(*args, provisioned=[1])
    assert delay.tolist() == [0.0, 5.0] and cold.tolist() == [1] and pc_s.tolist() == [1.0]
    assert peak.tolist() == [2]


def test_warmer_keeps_an_environment_by_hand() -> None:
    # Pings every 200 s from 0 (the first one starts the environment: a cold ping), so the
    # arrival at 650 finds the environment pinged at 600 and is warm; without the warmer it
    # would start cold (idle since 101 s).
    dispatch = [100.0, 650.0]
    ones = np.ones((2, 1))
    delay, _, cold, cold_pings, pings, *_ = _pools(
        dispatch,
        0 * ones,
        ones,
        ones.astype(int),
        [0],
        [5.0],
        idle_s=300.0,
        ping_interval_s=[200.0],
        ping_count=[1],
        period_s=700.0,
    )
    assert delay.tolist() == [0.0, 0.0]
    assert cold.tolist() == [0] and cold_pings.tolist() == [1] and pings.tolist() == [4]
    alone = _pools(dispatch, 0 * ones, ones, ones.astype(int), [0], [5.0], idle_s=300.0)
    assert alone[0].tolist() == [5.0, 5.0]


def test_stage_delay_is_absorbed_by_a_slower_warm_function() -> None:
    # One stage of two functions: f0 ends at 1 s warm, f1 at 4 s. f0 starting cold (INIT 2 s)
    # ends at 3 s, still before f1: the stage is not late. INIT 5 s would end at 6 s: 2 s late.
    offset = np.zeros((1, 2))
    duration = np.array([[1.0, 4.0]])
    reps = np.ones((1, 2), dtype=int)
    warm_f1 = dict(provisioned=[0, 1])
    assert _pools([0.0], offset, duration, reps, [0, 0], [2.0, 9.0], **warm_f1)[0].tolist() == [
        0.0
    ]
    assert _pools([0.0], offset, duration, reps, [0, 0], [5.0, 9.0], **warm_f1)[0].tolist() == [
        2.0
    ]


def test_a_later_stage_starts_after_the_earlier_cold_delay() -> None:
    # Stage 0 (f0) starts cold: 3 s late; stage 1's function then starts at 3 + its offset.
    offset = np.array([[0.0, 1.0]])
    duration = np.array([[1.0, 1.0]])
    delay, stage_delay, *_ = _pools(
        [0.0], offset, duration, np.ones((1, 2), dtype=int), [0, 1], [3.0, 4.0]
    )
    assert stage_delay.tolist() == [3.0, 4.0] and delay.tolist() == [7.0]


@pytest.mark.parametrize("seed", range(12))
def test_pools_equal_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batches, functions = int(rng.integers(5, 60)), int(rng.integers(1, 6))
    stage = np.sort(rng.integers(0, 3, functions))
    stage = np.unique(stage, return_inverse=True)[1]  # stages 0..k without gaps
    dispatch = np.sort(rng.uniform(0, 2000, batches))
    offset = rng.uniform(0, 2, (batches, functions)) + stage[None, :] * 2.0
    duration = rng.uniform(0.1, 30, (batches, functions))
    replicas = rng.integers(0, 4, (batches, functions))
    init_s = rng.uniform(0.5, 8, functions)
    provisioned = rng.integers(0, 3, functions) * (rng.random(functions) < 0.4)
    ping = (rng.random(functions) < 0.4) & (provisioned == 0)
    interval = np.where(ping, rng.uniform(50, 400, functions), 0.0)
    count = np.where(ping, rng.integers(1, 3, functions), 0)
    idle = float(rng.uniform(20, 300))
    reserved = np.where(rng.random(functions) < 0.4, rng.integers(1, 4, functions), 0)
    waits = (0.5, 1.0, 2.0)
    got = _pools(
        dispatch,
        offset,
        duration,
        replicas,
        stage,
        init_s,
        provisioned=provisioned.tolist(),
        idle_s=idle,
        ping_interval_s=interval.tolist(),
        ping_count=count.tolist(),
        period_s=2100.0,
        reserved=reserved.tolist(),
        retry_waits=waits,
    )
    want = brute_pools(
        dispatch,
        offset,
        duration,
        replicas,
        stage,
        init_s,
        provisioned,
        idle,
        interval,
        count,
        0.02,
        2100.0,
        reserved,
        waits,
    )
    delay, _, cold, cold_pings, pings, pc_seconds, _, hist, failed = got
    np.testing.assert_allclose(delay, want["delay"], rtol=0, atol=1e-9)
    assert failed.tolist() == want["failed"].tolist()
    assert cold.tolist() == want["cold"].sum(axis=0).tolist()
    assert cold_pings.tolist() == want["cold_pings"].tolist()
    assert pings.tolist() == want["pings"].tolist()
    np.testing.assert_allclose(pc_seconds, want["pc_seconds"], rtol=1e-12)
    if not reserved.any():
        assert hist.sum(axis=1).tolist() == (replicas > 0).sum(axis=0).tolist()


def test_batcher_by_hand() -> None:
    times = np.array([0.0, 0.0, 0.3, 0.4, 2.0, 5.0])
    tokens = np.array([10, 20, 50, 30, 200, 5])
    first, dispatch, size, delivery = batch_requests(times, tokens, 100, 1.0, 100)
    # The window opened at 0.0 gathers [0, 0, 0.3, 0.4] and is delivered at 1.0: 80 tokens,
    # then 0.4's 30 in an execution of its own (it does not fit). 2.0's 200 tokens exceed the
    # cap: alone, delivered at 3.0. 5.0 at 6.0.
    assert first.tolist() == [0, 3, 4, 5, 6]
    np.testing.assert_allclose(dispatch, [1.0, 1.0, 3.0, 6.0])
    assert size.tolist() == [80, 30, 200, 5]
    assert delivery.tolist() == [0, 0, 1, 2]
    first, dispatch, size, delivery = batch_requests(times, tokens, 100, 0.0, 10)
    assert first.tolist() == [0, 2, 3, 4, 5, 6]  # no window: only simultaneous arrivals share
    np.testing.assert_allclose(dispatch, [0.0, 0.3, 0.4, 2.0, 5.0])
    first, dispatch, size, delivery = batch_requests(times, tokens, 100, 1.0, 2)
    # Two messages per delivery: the second arrival closes the first delivery at once.
    assert first.tolist() == [0, 2, 4, 5, 6]
    np.testing.assert_allclose(dispatch, [0.0, 0.4, 3.0, 6.0])
    assert delivery.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(10))
def test_batcher_equals_brute_force_and_the_ground_rule(seed: int) -> None:
    from ground.frontdoor import batches

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    times = np.sort(np.round(rng.exponential(0.3, n).cumsum(), 1))  # ties now and then
    tokens = rng.integers(1, 400, n)
    cap, wait = int(rng.integers(50, 1500)), float(rng.choice([0.0, 1.0, 3.0]))
    records = int(rng.choice([2, 10, 10_000]))
    first, dispatch, size, delivery = batch_requests(times, tokens, cap, wait, records)
    want = brute_batches(times.tolist(), tokens.tolist(), cap, wait, records)
    assert [list(range(first[k], first[k + 1])) for k in range(len(want))] == [w[0] for w in want]
    np.testing.assert_allclose(dispatch, [w[1] for w in want])
    assert size.tolist() == [w[2] for w in want]
    rule = batches(times.tolist(), tokens.tolist(), cap, wait, records)
    assert [(a, b) for a, b, _, _ in rule] == [(first[k], first[k + 1]) for k in range(len(rule))]
    assert [d for *_, d in rule] == delivery.tolist()
