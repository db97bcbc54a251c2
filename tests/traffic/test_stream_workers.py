"""The stream workers' simulator (`planner.traffic.workers`): a hand-computed run, exact cases
(one slot per worker), batching, scale-out, the deadline, idle exits, refusals, the bill, and
its speed on an hour of the Azure conversation trace."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from ground.errors import UsageError
from planner.traffic import load_arrivals
from planner.traffic.workers import WorkerPrices, WorkerSpec, admit_window_s, simulate_workers


def _spec(**changes: object) -> WorkerSpec:
    base = WorkerSpec(
        workers=1,
        slots=2,
        step_s=(1.0, 1.5),
        prefill_token_s=0.1,
        prefill_chunk_tokens=4,
        idle_exit_s=5.0,
        poll_s=0.25,
        timeout_s=900.0,
        max_prompt_tokens=100,
        max_new_tokens=100,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _run(spec: WorkerSpec, times: list[float], prompt: list[int], gen: list[int]):  # type: ignore[no-untyped-def]
    return simulate_workers(np.array(times), np.array(prompt), np.array(gen), spec)


def test_one_worker_by_hand() -> None:
    """r0 (t 0, 4 prompt tokens, 3 new) starts the worker: its chunk ends at 0.4 (first
    token), a step of one to 1.4. r1 (t 0.5, 8 tokens, 2 new) waits for the worker's poll at
    1.4 (one worker runs): its first chunk to 1.8, r0's last step to 2.8; its second chunk to
    3.2 (first token), its step alone to 4.2. Then idle 5 s."""
    r = _run(_spec(), [0.0, 0.5], [4, 8], [3, 2])
    assert r.ttft_s == pytest.approx([0.4, 2.7])
    assert r.e2e_s == pytest.approx([2.8, 3.7])
    assert r.tpot_s == pytest.approx([1.2, 1.0])
    assert r.prefill_s == pytest.approx(1.2) and r.decode_s == pytest.approx(3.0)
    assert r.idle_s == pytest.approx(5.0)
    assert r.steps_at.tolist() == [0, 3, 0]
    assert (r.invocations, r.cold_starts, r.peak_workers) == (1, 1, 1)


def test_a_second_worker_takes_the_waiting_request_and_a_batch_shares_its_step() -> None:
    two = _run(_spec(workers=2), [0.0, 0.5], [4, 8], [3, 2])
    # r1 starts its own worker at 0.5: two chunks to 1.3, one step to 2.3
    assert two.ttft_s[1] == pytest.approx(0.8) and two.e2e_s[1] == pytest.approx(1.8)
    assert two.invocations == 2 and two.peak_workers == 2
    # both in one worker: the ESM gives r0; the worker's first poll, at 1.4 after r0's chunk
    # and step, admits r1: its chunk to 1.8 (first token), a step of two (1.5) to 3.3 ends r0,
    # r1's last step alone to 4.3
    together = _run(_spec(poll_s=0.1), [0.0, 0.0], [4, 4], [3, 3])
    assert together.steps_at.tolist() == [0, 2, 1]
    assert together.ttft_s == pytest.approx([0.4, 1.8])
    assert together.e2e_s == pytest.approx([3.3, 4.3])
    assert together.tpot_s == pytest.approx([1.45, 1.25])


def test_one_slot_per_worker_and_enough_workers_is_exact() -> None:
    """Each request alone: TTFT = its prompt's prefill, TPOT = the step of one sequence."""
    rng = np.random.default_rng(1)
    n = 50
    times = np.sort(rng.uniform(0, 100, n))
    prompt, gen = rng.integers(1, 40, n), rng.integers(1, 30, n)
    spec = _spec(workers=n, slots=1, step_s=(0.3,), prefill_chunk_tokens=7)
    r = simulate_workers(times, prompt, gen, spec)
    assert r.ttft_s == pytest.approx(prompt * 0.1)
    many = gen > 1
    assert r.tpot_s[many] == pytest.approx(np.full(many.sum(), 0.3))
    assert np.isnan(r.tpot_s[~many]).all()
    assert r.e2e_s == pytest.approx(prompt * 0.1 + (gen - 1) * 0.3)
    assert r.decode_s == pytest.approx(0.3 * (gen - 1).sum())


def test_every_served_request_is_no_faster_than_alone_and_time_adds_up() -> None:
    arrivals = load_arrivals("poisson:0.5", hours=0.5, seed=2)
    gen = np.minimum(arrivals.generated, 200)
    prompt = np.minimum(arrivals.tokens, 2000)
    spec = _spec(
        workers=3,
        slots=4,
        step_s=(0.1, 0.12, 0.14, 0.16),
        prefill_token_s=0.001,
        prefill_chunk_tokens=256,
        max_prompt_tokens=2000,
        max_new_tokens=200,
        cold_start_s=2.0,
        warm_start_s=0.02,
        reclaim_s=60.0,
    )
    r = simulate_workers(arrivals.times_s, prompt, gen, spec, period_s=arrivals.period_s)
    assert not r.refused.any() and np.isfinite(r.e2e_s).all()
    assert (r.ttft_s >= prompt * 0.001 - 1e-9).all()
    many = gen > 1
    assert (r.tpot_s[many] >= 0.1 - 1e-9).all()
    # every generated token after the first is one sequence's share of a step
    assert (r.steps_at * np.arange(5)).sum() == (gen - 1).sum()
    assert r.prefill_s == pytest.approx(prompt.sum() * 0.001)
    assert r.cold_starts >= 1 and r.invocations >= r.cold_starts
    assert r.peak_workers <= 3


def test_the_deadline_stops_admission_and_a_new_invocation_takes_over() -> None:
    # the longest request (10 prompt tokens, 10 new) takes 1 + 10 * 1.5 = 16 s: a worker of a
    # 20 s timeout admits for 4 s (minus the margin)
    spec = _spec(timeout_s=20.0, max_prompt_tokens=10, max_new_tokens=10, margin_s=0.5)
    assert admit_window_s(spec) == pytest.approx(3.5)
    r = _run(spec, [0.0, 6.0], [4, 4], [2, 2])
    assert r.invocations == 2  # the first may not admit at 6 s: it exits, the ESM starts one
    assert np.isfinite(r.e2e_s).all()
    with pytest.raises(UsageError, match="over the worker's"):
        _spec(timeout_s=10.0, max_prompt_tokens=10, max_new_tokens=10)


def test_idle_exit_and_warm_restarts() -> None:
    spec = _spec(idle_exit_s=2.0, cold_start_s=3.0, warm_start_s=0.05, reclaim_s=100.0)
    r = _run(spec, [0.0, 50.0, 500.0], [4, 4, 4], [1, 1, 1])
    assert r.invocations == 3 and r.cold_starts == 2  # the second reuses the warm environment
    assert r.idle_s == pytest.approx(6.0)
    assert r.ttft_s == pytest.approx([3.4, 0.45, 3.4])


def test_requests_longer_than_admitted_are_refused() -> None:
    r = _run(_spec(max_prompt_tokens=10, max_new_tokens=5), [0.0, 1.0, 2.0], [4, 11, 4], [2, 2, 6])
    assert r.refused.tolist() == [False, True, True]
    assert np.isnan(r.ttft_s[1:]).all() and r.summary()["served"] == 1


def test_the_bill_adds_up_and_splits_into_input_and_output() -> None:
    prices = WorkerPrices(
        memory_mb=2048,
        gb_second_usd=1e-5,
        request_usd=2e-7,
        billing_mb_per_gb=1024,
        init_billed_s=1.0,
        sqs_request_usd=4e-7,
        sqs_long_poll_s=20.0,
        s3_put_usd=5e-6,
        s3_get_usd=4e-7,
        remote_step_usd=(1e-6, 2e-6),
    )
    spec = _spec(flush_tokens=2)
    r = simulate_workers(np.array([0.0, 0.5]), np.array([4, 8]), np.array([3, 2]), spec, prices)
    bill = r.bill_usd
    assert bill is not None
    items = [
        k for k in bill if k.endswith("_usd") and k not in ("total_usd", "input_usd", "output_usd")
    ]
    items = [k for k in items if not k.startswith("per_million")]
    assert bill["total_usd"] == pytest.approx(sum(bill[k] for k in items))
    assert bill["input_usd"] + bill["output_usd"] == pytest.approx(bill["total_usd"])
    assert bill["worker_decode_usd"] == pytest.approx(3.0 * 2 * 1e-5)
    assert bill["remote_decode_usd"] == pytest.approx(3 * 1e-6)
    assert bill["init_usd"] == pytest.approx(1.0 * 2 * 1e-5)
    # chunk PUTs (ground.stream.chunk_sizes): r0's 3 tokens [1, 2], r1's 2 [1], two finals;
    # the client GETs each once
    assert bill["s3_results_usd"] == pytest.approx((2 + 1 + 2) * (5e-6 + 4e-7))
    assert bill["per_million_output_usd"] == pytest.approx(bill["output_usd"] / 5 * 1e6)


def test_an_hour_of_the_azure_trace_at_one_a_second_simulates_in_well_under_a_second() -> None:
    arrivals = load_arrivals("azure-conv", scale=1 / 5.53, hours=1)
    assert arrivals.generated is not None and arrivals.requests > 3000
    spec = _spec(
        workers=8,
        slots=16,
        step_s=tuple(0.09 + 0.01 * b for b in range(16)),
        prefill_token_s=0.002,
        prefill_chunk_tokens=256,
        max_prompt_tokens=4200,
        max_new_tokens=700,
    )
    args = (arrivals.times_s, arrivals.tokens, arrivals.generated, spec)
    simulate_workers(*args)  # compiled (or loaded from numba's cache) first
    started = time.perf_counter()
    r = simulate_workers(*args, period_s=arrivals.period_s)
    assert time.perf_counter() - started < 1.0
    assert r.summary()["served"] == arrivals.requests - int(r.refused.sum())
