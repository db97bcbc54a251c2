"""The simulator over a real (tiny) plan: by hand on deterministic streams, and against the
brute-force twins over random streams."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ground.coldstart import retry_waits
from planner.traffic import Arrivals, BatchPolicy, Capacity, Platform, simulate, workflow_model
from tests.traffic.brute import brute_batches, brute_pools
from tests.traffic.plans import tiny_plan

RATE = 0.0000166667


def _platform(count: int, init: float | np.ndarray = 2.0, **extra: float) -> Platform:
    args = dict(
        init_s=np.broadcast_to(np.asarray(init, dtype=float), (count,)).copy(),
        init_limit_s=10.0,
        init_billed=True,
        idle_s=600.0,
        gb_second_usd=RATE,
        request_usd=2e-7,
        ping_s=0.02,
        scheduler_invocation_usd=1e-6,
        billing_mb_per_gb=1024.0,
        provisioned_allocated_usd=0.0000041667,
        provisioned_duration_usd=0.0000097222,
    )
    return Platform(**(args | extra))  # type: ignore[arg-type]


def _stream(times: list[float] | np.ndarray, tokens: int | np.ndarray, period: float) -> Arrivals:
    times = np.asarray(times, dtype=float)
    return Arrivals(
        times, np.broadcast_to(np.asarray(tokens), times.shape).astype(np.int64), period
    )


@pytest.fixture(scope="module", params=["s3", "pipelined", "direct"])
def model(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return workflow_model(tiny_plan(method=request.param), 4096)


def test_every_request_cold_when_the_gaps_exceed_the_idle_time(model) -> None:  # type: ignore[no-untyped-def]
    # 20 requests of 300 tokens, 100 s apart, environments reclaimed after 50 s: every stage
    # of every request starts cold, each adding its INIT (2 s, all functions alike).
    fns = model.functions
    stream = _stream(np.arange(20) * 100.0, 300, 2000.0)
    result = simulate(model, stream, BatchPolicy(4096, 0.0), _platform(fns.count, idle_s=50.0))
    reps = model.replicas[300]
    stages = len({int(fns.stage[f]) for f in range(fns.count) if reps[f] > 0})
    warm = float(model.at(model.latency_s, np.array([300]))[0])
    np.testing.assert_allclose(result.latency_s, warm + 2.0 * stages, rtol=1e-12)
    assert sum(result.cold_starts.values()) == 20 * int(reps.sum())
    gb = fns.memory_mb / 1024
    assert result.bill_usd["init_usd"] == pytest.approx(20 * (reps * 2.0 * gb).sum() * RATE)


def test_only_the_first_request_is_cold_when_environments_stay(model) -> None:  # type: ignore[no-untyped-def]
    fns = model.functions
    stream = _stream(np.arange(20) * 100.0, 300, 2000.0)
    result = simulate(model, stream, BatchPolicy(4096, 0.0), _platform(fns.count, idle_s=1e9))
    warm = float(model.at(model.latency_s, np.array([300]))[0])
    assert result.latency_s[0] > warm + 1.0
    np.testing.assert_allclose(result.latency_s[1:], warm, rtol=1e-12)
    assert sum(result.cold_starts.values()) == int(model.replicas[300].sum())


def test_provisioned_concurrency_removes_cold_starts_and_is_billed(model) -> None:  # type: ignore[no-untyped-def]
    fns = model.functions
    stream = _stream(np.arange(20) * 100.0, 300, 2000.0)
    k = np.maximum(model.replicas[300], 1)
    capacity = [Capacity("provisioned", int(n)) for n in k]
    result = simulate(model, stream, BatchPolicy(4096, 0.0), _platform(fns.count), capacity)
    warm = float(model.at(model.latency_s, np.array([300]))[0])
    np.testing.assert_allclose(result.latency_s, warm)
    assert sum(result.cold_starts.values()) == 0 and result.bill_usd["init_usd"] == 0
    gb = fns.memory_mb / 1024
    seconds = model.at(model.duration_s, np.array([300]))[0] * model.replicas[300]
    want = (k * gb).sum() * 2000.0 * 0.0000041667 + 20 * (seconds * gb).sum() * (
        0.0000097222 - RATE
    )
    assert result.bill_usd["provisioned_usd"] == pytest.approx(want, rel=1e-9)


def test_warmers_are_billed_per_ping(model) -> None:  # type: ignore[no-untyped-def]
    fns = model.functions
    stream = _stream([1000.0], 300, 2000.0)
    capacity = [Capacity("warmer", 0, 300.0, 2)] * fns.count
    result = simulate(
        model, stream, BatchPolicy(4096, 0.0), _platform(fns.count), capacity, reserve=False
    )
    pings = math.ceil(2000.0 / 300.0) * 2
    gb = fns.memory_mb / 1024
    want = (pings * (2e-7 + 0.02 * gb * RATE + 1e-6)).sum()
    assert result.bill_usd["warmers_usd"] == pytest.approx(want)
    warm = float(model.at(model.latency_s, np.array([300]))[0])
    np.testing.assert_allclose(result.latency_s, [warm], rtol=1e-12)  # warmed since t = 0
    assert sum(result.cold_starts.values()) == 2 * fns.count  # the pings at t = 0


def test_a_batch_too_large_is_refused() -> None:
    model = workflow_model(tiny_plan(method="direct", tokens=256), 10**5)
    big = model.feasible_tokens + 1
    stream = _stream([0.0, 10.0], np.array([100, big]), 100.0)
    result = simulate(model, stream, BatchPolicy(10**5, 0.0), _platform(model.functions.count))
    assert result.refused_batches == 1
    assert np.isfinite(result.latency_s[0]) and np.isinf(result.latency_s[1])
    assert result.quantiles()["max"] is None
    assert result.attainment(1e9) == 0.5


@pytest.mark.parametrize("seed", range(6))
def test_simulation_equals_brute_force(model, seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    fns = model.functions
    n = int(rng.integers(20, 120))
    times = np.sort(rng.uniform(0, 3000, n))
    tokens = rng.integers(1, 1500, n)
    stream = Arrivals(times, tokens, 3000.0)
    policy = BatchPolicy(int(rng.integers(500, 4096)), float(rng.choice([0.0, 0.5, 5.0])))
    init = rng.uniform(0.5, 6.0, fns.count)
    idle = float(rng.uniform(30, 400))
    capacity = [
        Capacity("provisioned", int(rng.integers(1, 3)))
        if rng.random() < 0.2
        else Capacity("warmer", 0, float(rng.uniform(100, 500)), 1)
        if rng.random() < 0.3
        else Capacity()
        for _ in range(fns.count)
    ]
    platform = _platform(fns.count, init, idle_s=idle)
    result = simulate(model, stream, policy, platform, capacity)
    batches = brute_batches(
        times.tolist(), tokens.tolist(), policy.max_tokens, policy.max_wait_s, n + 1
    )
    size = np.array([b[2] for b in batches])
    dispatch = np.array([b[1] for b in batches])
    want = brute_pools(
        dispatch,
        model.at(model.offset_s, size),
        model.at(model.duration_s, size),
        model.replicas[size],
        fns.stage,
        init,
        np.array([c.provisioned for c in capacity]),
        idle,
        np.array([c.warmer_interval_s for c in capacity]),
        np.array([c.warmer_concurrency for c in capacity]),
        0.02,
        3000.0,
        fns.reserved,
        retry_waits(),
    )
    finish = dispatch + model.at(model.latency_s, size) + want["delay"]
    finish[want["failed"]] = np.inf
    latency = np.concatenate([finish[k] - times[b[0]] for k, b in enumerate(batches)])
    np.testing.assert_allclose(result.latency_s, latency, rtol=0, atol=1e-9)
    cold = want["cold"].sum(axis=0) + want["cold_pings"]
    assert list(result.cold_starts.values()) == cold.tolist()


def _door(**extra: float) -> object:
    from planner.traffic.simulate import FrontDoor

    args = dict(
        window_limit_s=300.0,
        records_max=10_000,
        records_max_without_window=10,
        sqs_request_usd=4e-7,
        chunk_bytes=65536,
        receive_max=10,
        idle_pollers=5,
        long_poll_s=20.0,
        batcher_memory_mb=1769.0,
        batcher_init_s=0.7,
        start_s=0.05,
        put_s=0.02,
        input_limit_bytes=262144,
        s3_put_usd=5e-6,
        s3_get_usd=4e-7,
    )
    return FrontDoor(**(args | extra))  # type: ignore[arg-type]


def test_the_front_door_by_hand() -> None:
    """Requests at 0, 0.2 (300 tokens each) and 100 s (3,000), cap 512, wait 0.4 s deployed as
    1 s: deliveries at 1 s (two executions: 300 + 300 do not fit 512) and 101 s (one); the
    batcher starts cold (0.7 s), then warm; each execution starts a step after the previous;
    the tail writes each execution's one request's result (one PUT, 0.02 s)."""
    model = workflow_model(tiny_plan(method="s3"), 4096)
    fns = model.functions
    stream = _stream([0.0, 0.2, 100.0], np.array([300, 300, 3000]), 200.0)
    platform = _platform(fns.count, idle_s=600.0, front_door=_door())  # type: ignore[arg-type]
    cold = _platform(fns.count, idle_s=600.0)
    result = simulate(model, stream, BatchPolicy(512, 0.4), platform)
    plain = simulate(model, stream, BatchPolicy(512, 1.0), cold)  # the same batches, no door
    assert result.batch_tokens.tolist() == [300, 300, 3000]
    delay = np.array([1.0 + 0.7 + 0.05, 1.0 - 0.2 + 0.7 + 0.1, 1.0 + 0.05]) + 0.02
    np.testing.assert_allclose(result.latency_s - plain.latency_s, delay - [1.0, 0.8, 1.0])
    door = result.front_door
    assert (door["window_s"], door["records_per_delivery"], door["deliveries"]) == (1, 512, 2)
    assert door["batcher_cold_starts"] == 1
    assert door["usage"]["sqs_requests"] == 3 + 2 + 2  # sends, receives, deletes
    gb = 1769 / 1024
    want = {
        "sqs_usd": (7 + 5 * 200 / 20) * 4e-7,
        "batcher_usd": 2 * 2e-7 + 3 * 0.05 * gb * RATE,
        "batcher_init_usd": 0.7 * gb * RATE,
        "inputs_s3_usd": 0.0,  # every input fits the execution's (inline ids)
        "results_s3_usd": 3 * 5e-6,
        "results_tail_usd": 3 * 0.02 * fns.memory_mb[fns.role.index("tail")] / 1024 * RATE,
    }
    assert door["bill_usd"] == pytest.approx(want)
    bill = result.bill_usd
    assert bill["front_door_usd"] == pytest.approx(sum(want.values()))
    others = sum(v for k, v in bill.items() if k not in ("total_usd", "per_million_tokens_usd"))
    assert bill["total_usd"] == pytest.approx(others)
    assert any("whole seconds" in note for note in result.notes)
    # With a 4 KB input limit the 3,000-token batch's ids go to S3: a PUT, and 20 ms more.
    small = _platform(fns.count, front_door=_door(input_limit_bytes=4096))  # type: ignore[arg-type]
    stored = simulate(model, stream, BatchPolicy(512, 0.4), small)
    assert stored.front_door["usage"]["s3_put"] == 1
    assert stored.front_door["bill_usd"]["inputs_s3_usd"] == pytest.approx(5e-6)
    np.testing.assert_allclose(stored.latency_s - result.latency_s, [0, 0, 0.02], atol=1e-12)
    # An inline input saves the head's GET of it: the workflow's S3 is one GET less for each.
    assert plain.bill_usd["s3_usd"] - result.bill_usd["s3_usd"] == pytest.approx(3 * 4e-7)
    assert plain.bill_usd["s3_usd"] - stored.bill_usd["s3_usd"] == pytest.approx(2 * 4e-7)
    direct = simulate(model, stream, BatchPolicy(512, 0.4, front_door=False), platform)
    assert direct.bill_usd["front_door_usd"] == 0.0 and direct.front_door == {}
    assert direct.batch_tokens.tolist() == [300, 300, 3000]  # no window: none shares
