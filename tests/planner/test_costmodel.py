"""The cost and latency model against values computed by hand from serverless-model.md §4-§5."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.costmodel import Choice, bill, evaluate, expert_options, layer_latency
from planner.instance import MB, Instance, Method


def _instance(**changes: object) -> Instance:
    """One layer, expert 0 with 100 tokens, expert 1 idle; round numbers throughout."""
    base = Instance(
        counts=np.array([[100.0, 0.0]]),
        expert_bytes=np.array([[1e6, 1e6]]),
        token_bytes_in=1000.0,
        token_bytes_out=1000.0,
        memory_mb=np.array([1024.0, 2048.0]),
        compute_s=np.array([2e-3, 1e-3]),
        max_replicas=2,
        warm_start_s=0.02,
        s3_delay_s=0.02,
        s3_bandwidth=1e6,
        invoke_bandwidth=2e6,
        direct_payload_bytes=150_000,
        runtime_mb=300.0,
        price_mb_s=1e-6,
        request_usd=2e-7,
        s3_put_usd=5e-6,
        s3_get_usd=4e-7,
        transition_usd=2.5e-5,
        nonmoe_memory_mb=1769.0,
        head_s=0.1,
        tail_s=0.1,
        layer_s=np.array([0.2]),
        load_s=np.array([0.06]),
        tokens=100,
        betas=(30,),
    )
    return dataclasses.replace(base, **changes)


def test_s3_method_by_hand() -> None:
    opts = expert_options(_instance(), 0, Method.S3)
    # T^h = 0.02 + 0.02 + 1e6 / 1e6 = 1.04; body = 2 * 0.02 + r * (2000 / 1e6 + U_j)
    assert opts.time[0, 0, 0] == pytest.approx(1.04 + 0.04 + 100 * 0.004)  # 1.48
    assert opts.cost[0, 0, 0] == pytest.approx(1.48 * 1024 * 1e-6)
    assert opts.time[0, 0, 1] == pytest.approx(1.08 + 50 * 0.004)  # two replicas of 50 tokens
    assert opts.cost[0, 0, 1] == pytest.approx(2 * 1.28 * 1024 * 1e-6)
    assert opts.time[0, 1, 0] == pytest.approx(1.08 + 100 * 0.003)  # U = 1 ms at 2,048 MB
    assert opts.finish[0, 0, 0] == pytest.approx(1.48)  # the gate's upload (0.12 s) is faster
    # latency = max(finish, T^load) + T^dl + 100 tokens * 1000 B / 1e6 B/s
    assert layer_latency(_instance(), 0, Method.S3, 1.48) == pytest.approx(1.48 + 0.12)
    assert opts.cost[1].max() == 0 and opts.finish[1].max() == 0 and opts.feasible[1].all()


def test_gate_upload_delays_s3_experts() -> None:
    slow_gate = _instance(counts=np.array([[100.0, 2000.0]]))  # T^up = 0.02 + 2.1 = 2.12 s
    opts = expert_options(slow_gate, 0, Method.S3)
    assert opts.finish[0, 0, 0] == pytest.approx(2.12 + 0.04 + 100 * 0.004)


def test_pipelined_method_by_hand() -> None:
    opts = expert_options(_instance(), 0, Method.PIPELINED, 30)
    block = 0.02 + 30 * max(1000 / 1e6 + 2e-3, 1000 / 1e6)  # 0.11
    last = 0.02 + 30 * 1000 / 1e6  # 0.05
    assert opts.time[0, 0, 0] == pytest.approx(1.04 + 4 * block + last)  # ceil(100/30) = 4
    # two replicas of 50 tokens: ceil(50/30) = 2 blocks each
    assert opts.time[0, 0, 1] == pytest.approx(1.04 + 2 * block + last)
    big_beta = expert_options(_instance(), 0, Method.PIPELINED, 500)  # one minibatch of r
    one = 0.02 + 100 * 0.003
    assert big_beta.time[0, 0, 0] == pytest.approx(1.04 + one + 0.02 + 100 * 1000 / 1e6)


def test_direct_method_and_payload_limit() -> None:
    opts = expert_options(_instance(), 0, Method.DIRECT)
    assert opts.time[0, 0, 0] == pytest.approx(1.04 + 100 * (1000 / 2e6 + 2e-3))  # 1.29
    assert opts.send[0, 0] == pytest.approx(100 * 1000 / 2e6)
    assert layer_latency(_instance(), 0, Method.DIRECT, 1.29, 0.05) == pytest.approx(1.40)
    big = expert_options(_instance(counts=np.array([[200.0, 0.0]])), 0, Method.DIRECT)
    assert not big.feasible[0, :, 0].any()  # 200,000 B > 150,000 B
    assert big.feasible[0, :, 1].all()  # two shards of 100 tokens fit


def test_memory_limit() -> None:
    heavy = _instance(expert_bytes=np.array([[800 * MB, 1e6]]))  # 800 + 300 MB > 1,024 MB
    opts = expert_options(heavy, 0, Method.S3)
    assert not opts.feasible[0, 0].any() and opts.feasible[0, 1].all()
    resident = _instance(expert_bytes=np.array([[700 * MB, 1e6]]), counts=np.array([[20000.0, 0]]))
    # 700 + 300 + 20,000 tokens * 2,000 B = 1,038 MB > 1,024 MB; two replicas hold half each.
    opts = expert_options(resident, 0, Method.S3)
    assert not opts.feasible[0, 0, 0] and opts.feasible[0, 0, 1]
    pipelined = dataclasses.replace(resident, pipelined_residency=True)
    assert expert_options(pipelined, 0, Method.PIPELINED, 30).feasible[0, 0, 0]


def test_evaluate_names_violations_and_bill_counts_requests() -> None:
    inst = _instance(counts=np.array([[200.0, 10.0]]))
    direct = Choice(np.array([3]), np.array([1]), np.array([[0, 0]]), np.array([[1, 1]]))
    ev = evaluate(inst, direct, slo_s=0.5)
    assert "layer 0 expert 0: payload or memory limit" in ev.violations
    assert any("exceeds the SLO" in v for v in ev.violations) and not ev.feasible
    s3 = Choice(np.array([2]), np.array([1]), np.array([[0, 0]]), np.array([[2, 1]]))
    ok = evaluate(inst, s3, slo_s=10.0)
    assert ok.feasible
    assert ok.latency == pytest.approx(0.1 + 0.1 + 0.2 + ok.layer_latency[0])
    assert ok.cost == pytest.approx(ok.expert_cost.sum())
    piped = Choice(np.array([1]), np.array([30]), np.array([[0, 0]]), np.array([[2, 1]]))
    s3_bill, piped_bill = bill(inst, s3, ok), bill(inst, piped, evaluate(inst, piped))
    # S3: 3 shards, 2 PUTs each. Pipelined: ceil(100/30) = 4 and 1 minibatches per shard.
    assert s3_bill["s3_usd"] == pytest.approx(6 * 5e-6 + (6 + 3 + 1 + 2) * 4e-7)
    assert piped_bill["s3_usd"] == pytest.approx(18 * 5e-6 + (18 + 3 + 1 + 2) * 4e-7)
    # Head and tail, then the layer's states of the emitted workflow and one per mapped shard.
    assert s3_bill["transitions_usd"] == pytest.approx((2 + 2 + 3) * 2.5e-5)
    assert piped_bill["transitions_usd"] == pytest.approx((2 + 6 + 3) * 2.5e-5)
    direct_ok = Choice(np.array([3]), np.array([1]), np.array([[0, 0]]), np.array([[2, 1]]))
    direct_bill = bill(inst, direct_ok, evaluate(inst, direct_ok))
    assert direct_bill["transitions_usd"] == pytest.approx((2 + 1) * 2.5e-5)
    assert s3_bill["total_usd"] == pytest.approx(
        sum(v for k, v in s3_bill.items() if k != "total_usd")
    )
