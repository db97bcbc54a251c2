"""The serving-cost simulator: the planner's own cost when reality matches the prediction, and
Alg. 2's cases (i)-(iii) when it does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ground.semantics import max_direct_tokens
from planner.exact import solve_exact, solve_frontier
from planner.instance import MB, Method
from planner.serving import Case, serve
from tests.planner.small import small_instance


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("slo", ["none", "medium", "tight"])
def test_simulator_reproduces_the_planned_cost_when_real_equals_predicted(
    seed: int, slo: str
) -> None:
    inst = small_instance(seed)
    frontier = solve_frontier(inst)
    fastest, cheapest = frontier.min_latency(), frontier.best(None).latency
    slo_s = {"none": None, "medium": (fastest + cheapest) / 2, "tight": fastest * 1.01}[slo]
    solution = solve_exact(inst, slo_s)
    assert solution is not None
    run = serve(inst, solution.choice, inst.counts)
    assert run.cost == pytest.approx(solution.cost, rel=1e-12)
    assert run.latency == pytest.approx(solution.latency, rel=1e-12)
    np.testing.assert_array_equal(run.choice.replicas, solution.choice.replicas)
    assert (run.case == Case.OK).all()


def _one_expert_plan(method: Method, memory: float, predicted: float, **changes: object):  # type: ignore[no-untyped-def]
    """One layer, one expert, one memory option, planned for `predicted` tokens, 1 replica."""
    inst = dataclasses.replace(
        small_instance(0, layers=1, experts=1, memories=1, replicas=4),
        counts=np.array([[predicted]]),
        memory_mb=np.array([memory]),
        compute_s=np.array([2e-4]),
        expert_bytes=np.array([[10 * MB]]),
        **changes,
    )
    choice = solve_exact(inst, None, (method,))
    assert choice is not None
    return inst, choice.choice


def test_memory_shortfall_replicates_up_to_the_cap() -> None:
    # 1,024 MB - 10 MB weights - 300 MB runtime leaves 714 MB: 243,712 tokens of 3,072 bytes.
    # The paper's objective plans one replica (the full bill would buy a second for latency).
    inst, choice = _one_expert_plan(
        Method.S3, 1024.0, 100_000.0, max_replicas=4, objective="experts"
    )
    assert choice.replicas[0, 0] == 1
    fit = np.floor((1024 - 10 - 300) * MB / 3072)
    run = serve(inst, choice, np.array([[3.5 * fit]]))
    assert run.case[0, 0] == Case.MEMORY and not run.failed.any()
    assert run.choice.replicas[0, 0] == 4  # ceil(3.5), as the gate splits the real tokens
    assert run.evaluation.feasible  # every replica's tokens now fit
    assert serve(inst, choice, np.array([[2.5 * fit]])).choice.replicas[0, 0] == 3
    over = serve(inst, choice, np.array([[4.5 * fit]]))  # 5 replicas needed, the cap is G = 4
    assert over.failed[0, 0] and over.case[0, 0] == Case.MEMORY


def test_payload_overflow_replicates_direct_experts_only() -> None:
    limit = 262144
    per_shard = max_direct_tokens(limit, 1536)  # rows base64 in a JSON event: 127
    inst, choice = _one_expert_plan(
        Method.DIRECT, 3008.0, 100.0, direct_payload_bytes=limit, max_replicas=8
    )
    run = serve(inst, choice, np.array([[1000.0]]))
    assert run.case[0, 0] == Case.PAYLOAD
    assert run.choice.replicas[0, 0] == int(np.ceil(1000 / per_shard))
    assert run.evaluation.feasible
    s3, s3_choice = _one_expert_plan(Method.S3, 3008.0, 100.0, direct_payload_bytes=limit)
    assert serve(s3, s3_choice, np.array([[1000.0]])).case[0, 0] == Case.MISPREDICTED


def test_pipelined_replicas_cannot_adapt_and_run_longer() -> None:
    inst, choice = _one_expert_plan(Method.PIPELINED, 1024.0, 1000.0, max_replicas=4)
    run = serve(inst, choice, np.array([[5000.0]]))
    assert run.choice.replicas[0, 0] == choice.replicas[0, 0] and not run.failed.any()
    assert run.latency > serve(inst, choice, np.array([[1000.0]])).latency


def test_small_mispredictions_change_nothing_but_the_run_time() -> None:
    inst, choice = _one_expert_plan(Method.S3, 3008.0, 1000.0)
    close = serve(inst, choice, np.array([[1050.0]]), alpha=64)
    off = serve(inst, choice, np.array([[1100.0]]), alpha=64)
    assert close.case[0, 0] == Case.OK and off.case[0, 0] == Case.MISPREDICTED
    assert off.choice.replicas[0, 0] == choice.replicas[0, 0]
    assert off.cost > close.cost > 0


def test_an_expert_planned_idle_still_holds_the_tokens_it_gets() -> None:
    inst = small_instance(3)
    counts = inst.counts.copy()
    counts[0, 0] = 0.0
    tiny = dataclasses.replace(inst, counts=counts, memory_mb=np.r_[128.0, inst.memory_mb[1:]])
    solution = solve_exact(tiny, None)
    assert solution is not None
    assert tiny.memory_mb[solution.choice.memory[0, 0]] > 128  # 128 MB holds no token
    real = counts.copy()
    real[0, 0] = 50.0
    run = serve(tiny, solution.choice, real)
    assert not run.failed.any() and run.evaluation.feasible
