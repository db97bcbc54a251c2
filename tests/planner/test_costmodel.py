"""The cost and latency model against values computed by hand (serverless-model.md §4-§5, §8b).

Warm functions: a call costs its warm start and its own S3 traffic, each request T^dl plus its
bytes at B^s. Times are from the end of the gate's pre-scatter work (`layer_s`, 0.2 s here).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ground.semantics import direct_event_bytes
from planner.costmodel import Choice, bill, evaluate, expert_options, usage
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
        s3_list_usd=5e-6,
        s3_delete_usd=5e-6,
        transition_usd=2.5e-5,
        express_request_usd=1e-6,
        express_mb_s_usd=1e-8,
        express_memory_mb=64.0,
        express_step_s=0.1,
        nonmoe_memory_mb=1769.0,
        head_s=0.1,
        tail_s=0.1,
        layer_s=np.array([0.2]),
        tokens=100,
        betas=(30,),
        objective="experts",
    )
    return dataclasses.replace(base, **changes)


def test_s3_method_by_hand() -> None:
    opts = expert_options(_instance(), 0, Method.S3)
    # warm start 0.02, GET shard and PUT output 2 x 0.02, 100 tokens x (2,000 B / 1e6 + U_j)
    assert opts.time[0, 0, 0] == pytest.approx(0.02 + 0.04 + 100 * 0.004)  # 0.46
    assert opts.cost[0, 0, 0] == pytest.approx(0.46 * 1024 * 1e-6)
    assert opts.time[0, 0, 1] == pytest.approx(0.06 + 50 * 0.004)  # two replicas of 50
    assert opts.cost[0, 0, 1] == pytest.approx(2 * 0.26 * 1024 * 1e-6)
    assert opts.time[0, 1, 0] == pytest.approx(0.06 + 100 * 0.003)  # U = 1 ms at 2,048 MB
    # The Map starts after the gate's upload returns: T^dl + 100 x 1,000 B / 1e6 = 0.12 s.
    assert opts.finish[0, 0, 0] == pytest.approx(0.12 + 0.46)
    assert opts.cost[1].max() == 0 and opts.finish[1].max() == 0 and opts.feasible[1].all()


def test_pipelined_method_by_hand() -> None:
    opts = expert_options(_instance(), 0, Method.PIPELINED, 30)
    block = 0.02 + 30 * max(1000 / 1e6 + 2e-3, 1000 / 1e6)  # 0.11
    last = 0.02 + 30 * 1000 / 1e6  # 0.05
    # Started with the gate: its own work (0.02 + 4 blocks + last, less the gate's 0.2 s), or
    # the gate's upload (0.12) plus one block and the last upload, whichever ends later.
    finish = max(0.02 + 4 * block + last - 0.2, 0.12 + block + last)
    assert opts.finish[0, 0, 0] == pytest.approx(finish)  # 0.31
    assert opts.time[0, 0, 0] == pytest.approx(0.2 + finish)  # billed from its start
    # The idle expert's replica still starts, waits for its done marker and reads it.
    idle = 0.2 + 0.02 + 0.02
    assert opts.cost[1, 0, 0] == pytest.approx(idle * 1024 * 1e-6)
    assert opts.cost[1, 0, 1] == pytest.approx(2 * idle * 1024 * 1e-6)
    two = expert_options(_instance(counts=np.array([[1.0, 0.0]])), 0, Method.PIPELINED, 30)
    # One token on two replicas: one busy, one idle, both billed.
    busy = 0.2 + two.finish[0, 0, 1]
    assert two.cost[0, 0, 1] == pytest.approx((busy + idle) * 1024 * 1e-6)


def test_direct_method_and_payload_limit() -> None:
    opts = expert_options(_instance(), 0, Method.DIRECT)
    assert opts.time[0, 0, 0] == pytest.approx(0.02 + 100 * (1000 / 2e6 + 2e-3))  # 0.27
    # send 100 x 1,000 B / 2e6, the replica, then the gate stores the outputs (0.02 + 0.1)
    assert opts.finish[0, 0, 0] == pytest.approx(0.05 + 0.27 + 0.12)
    assert direct_event_bytes(100, 1000) < 150_000 < direct_event_bytes(200, 1000)
    big = expert_options(_instance(counts=np.array([[200.0, 0.0]])), 0, Method.DIRECT)
    assert not big.feasible[0, :, 0].any()  # 200 rows, base64 in JSON, exceed 150,000 B
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
    # An expert predicted idle must still hold one token: the gate may send it some.
    idle_heavy = _instance(expert_bytes=np.array([[1e6, 800 * MB]]))
    assert not expert_options(idle_heavy, 0, Method.S3).feasible[1, 0].any()


def test_evaluate_names_violations_and_bill_counts_requests() -> None:
    inst = _instance(counts=np.array([[200.0, 10.0]]), workflow="standard")
    direct = Choice(np.array([3]), np.array([1]), np.array([[0, 0]]), np.array([[1, 1]]))
    ev = evaluate(inst, direct, slo_s=0.5)
    assert "layer 0 expert 0: payload or memory limit" in ev.violations
    assert any("exceeds the SLO" in v for v in ev.violations) and not ev.feasible
    s3 = Choice(np.array([2]), np.array([1]), np.array([[0, 0]]), np.array([[2, 1]]))
    ok = evaluate(inst, s3, slo_s=10.0)
    assert ok.feasible
    assert ok.latency == pytest.approx(0.1 + 0.1 + 0.2 + ok.layer_latency[0])
    assert ok.cost == pytest.approx(ok.expert_cost.sum()) == pytest.approx(ok.experts_usd)
    s3_use = usage(inst, s3, ok)
    # 3 shards. PUT: hidden, residual, routing, 3 shards, 3 outputs, the output = 10. GET: input,
    # hidden, 3 shards, then the tail's routing, 3 outputs and residual = 10. LIST: the outputs
    # and the request's keys; one DeleteObjects. Lambda: head, gate, 3 experts, tail.
    assert (s3_use["s3_put"], s3_use["s3_get"], s3_use["s3_list"], s3_use["s3_delete"]) == (
        10,
        10,
        2,
        1,
    )
    assert s3_use["lambda_requests"] == 6 and s3_use["s3_get_poll"] == 0
    # Head and tail; gate Task, Map, one inner Map per expert, one Task per shard.
    assert s3_use["transitions"] == 2 + 2 + 2 + 3
    s3_bill = bill(inst, s3, ok)
    assert s3_bill["s3_usd"] == pytest.approx(10 * 5e-6 + 10 * 4e-7 + 2 * 5e-6 + 5e-6)
    assert s3_bill["workflow_usd"] == pytest.approx(9 * 2.5e-5)
    piped = Choice(np.array([1]), np.array([30]), np.array([[0, 0]]), np.array([[2, 1]]))
    piped_use = usage(inst, piped, evaluate(inst, piped))
    # Minibatches: ceil(100/30) = 4 on each replica of expert 0, 1 on expert 1: 9. PUT: hidden,
    # residual, routing, 9 in, 3 done markers, 9 out, the output = 25. GET: input, hidden, 9
    # in, then routing, 9 outputs and residual = 22; polls are apart.
    assert (piped_use["s3_put"], piped_use["s3_get"]) == (25, 22)
    assert piped_use["s3_get_poll"] > 0 and piped_use["lambda_requests"] == 6
    # Parallel, gate, Pass, Map, Choice, output Pass; one inner Map per expert, 3 Tasks.
    assert piped_use["transitions"] == 2 + 6 + 2 + 3
    direct_ok = Choice(np.array([3]), np.array([1]), np.array([[0, 0]]), np.array([[2, 1]]))
    direct_use = usage(inst, direct_ok, evaluate(inst, direct_ok))
    assert direct_use["transitions"] == 2 + 1
    assert direct_use["payload_max_bytes"] == direct_event_bytes(100, 1000)
    assert s3_bill["total_usd"] == pytest.approx(
        sum(v for k, v in s3_bill.items() if k != "total_usd")
    )


@pytest.mark.parametrize("workflow", ["express", "standard"])
@pytest.mark.parametrize("method", list(Method), ids=lambda m: m.label)
def test_full_objective_is_the_bill(workflow: str, method: Method) -> None:
    """What the solvers minimise is the itemised bill, but for Express's 100-ms rounding."""
    inst = _instance(counts=np.array([[120.0, 7.0]]), workflow=workflow, objective="full")
    memory, replicas = np.array([[1, 0]]), np.array([[2, 1]])
    choice = Choice(np.array([int(method)]), np.array([30]), memory, replicas)
    ev = evaluate(inst, choice)
    total = bill(inst, choice, ev)["total_usd"]
    rounding = 0.1 * 64 * 1e-8 if workflow == "express" else 0.0
    assert total - rounding - 1e-15 <= ev.cost <= total + 1e-15
    assert ev.cost > ev.experts_usd


def test_lambda_timeout_is_a_constraint_of_every_option() -> None:
    """s3, g = 1: 0.06 + 100 x (2 kB / 1 MB/s + U_j) = 0.46 s (j = 0), 0.36 s (j = 1); g = 2:
    0.26 s, 0.21 s. A direct gate waits layer_s + its slowest expert: at least 0.2 + 0.02 +
    0.1 s of gathering, over a 0.3 s limit whatever the expert does."""
    inst = _instance(max_timeout_s=0.3)
    s3 = expert_options(inst, 0, Method.S3)
    np.testing.assert_array_equal(s3.feasible[0], [[False, True], [False, True]])
    assert not expert_options(inst, 0, Method.DIRECT).feasible[0].any()
    choice = Choice(
        method=np.array([int(Method.S3)]),
        beta=np.array([1]),
        memory=np.array([[1, 0]]),
        replicas=np.array([[1, 1]]),
    )
    assert evaluate(inst, choice).violations == ["layer 0 expert 0: Lambda's 0.3 s timeout limit"]
    relaxed = evaluate(dataclasses.replace(inst, max_timeout_s=0.4), choice)
    assert relaxed.violations == []


def test_an_infeasible_timeout_is_named_with_its_fix() -> None:
    from planner.deploy import why_empty

    error = why_empty(_instance(max_timeout_s=0.1), tuple(Method))
    assert "fits Lambda's 0.1 s timeout" in error.problem and "--tokens" in error.fix
    memory = why_empty(_instance(runtime_mb=5000.0), tuple(Method))
    assert "no memory option holds the largest expert" in memory.problem


def test_more_experts_than_a_map_runs_at_once_leaves_only_direct() -> None:
    from planner.deploy import why_empty

    inst = _instance(map_max_concurrency=1.0)  # 2 experts, a Map of 1
    for method in (Method.S3, Method.PIPELINED):
        assert not expert_options(inst, 0, method, 30).feasible.any()
    assert expert_options(inst, 0, Method.DIRECT).feasible.any()
    error = why_empty(inst, (Method.S3,))
    assert "exceed an inline Map's 1 concurrent iterations" in error.problem
