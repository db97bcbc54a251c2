"""`gpu.run`: a GPU plan run for real on torch.distributed (gloo on this CPU host).

The routing and the planned steps are checked alone first; then whole runs of MiniLM (4 experts,
top-2) on 2 and 4 ranks, with a replicated expert, a rank hosting several experts, a rank
without windows, and both all-to-all orders. A run is SUCCEEDED only if its output matches the
monolithic forward and, on every layer, the planned and the baseline all-to-alls delivered
bit-identical expert outputs (a rank raises otherwise). Failures must come back as FAILED with
the cause, never as a hang.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu.plan import GpuLayerPlan, GpuPlan, Hosted
from gpu.run import (
    TOLERANCE,
    GpuRunError,
    _aurora_steps,
    _destinations,
    _Job,
    _launch,
    _rank_order_steps,
    _slots,
    run_plan,
)
from moe import MoEModel

LAYERS = 6  # MiniLM's


def _plan(
    placement: list[list[tuple[int, float]]],
    orders: list[str],
    *,
    experts: int = 4,
    layers: int = LAYERS,
) -> GpuPlan:
    """A plan by hand: the same placement on every layer, layer l in order orders[l % len]."""
    hosted = [[Hosted(expert=e, share=s) for e, s in rank] for rank in placement]
    return GpuPlan(
        scheduler="lina",
        model={"name": "minilm", "experts": experts, "top_k": 2},
        gpu_types=["test"] * len(placement),
        tokens=512,
        layers=[
            GpuLayerPlan(
                layer=layer,
                placement=hosted,
                order=orders[layer % len(orders)],
                a2a_rounds=0,
                a2a_s=0.0,
                lower_bound_s=0.0,
                layer_s=0.0,
            )
            for layer in range(layers)
        ],
        total_s=0.0,
        cost_per_million_tokens_usd=0.0,
    )


# --------------------------------------------------------------------------- without processes


def test_replicas_split_each_experts_assignments_by_share_in_token_order() -> None:
    plan = _plan([[(0, 0.25), (2, 1.0)], [(0, 0.75), (1, 1.0), (3, 1.0)]], ["rank"])
    flat = torch.tensor([0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 0])  # expert 0 eight times
    dest = _destinations(flat, _slots(plan.layers[0], 4, flat.device), 4)
    # Expert 0: its first round(0.25 * 8) = 2 assignments to rank 0, the other 6 to rank 1.
    assert dest[flat == 0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert dest[flat != 0].tolist() == [1, 0, 1]


def test_rank_order_sends_every_chunk_to_rank_d_in_step_d() -> None:
    pairs = np.array([[5, 0, 2], [3, 0, 4], [6, 7, 8]])
    steps = _rank_order_steps(pairs)
    assert [[(t.src, t.dst, t.lo, t.hi) for t in step] for step in steps] == [
        [(1, 0, 0, 3), (2, 0, 0, 6)],
        [(2, 1, 0, 7)],
        [(0, 2, 0, 2), (1, 2, 0, 4)],
    ]


def test_aurora_steps_are_contention_free_and_move_every_row_once() -> None:
    pairs = np.random.default_rng(0).integers(0, 40, size=(6, 6))
    moved = np.zeros_like(pairs)
    for step in _aurora_steps(pairs):
        senders, receivers = [t.src for t in step], [t.dst for t in step]
        assert len(set(senders)) == len(senders) and len(set(receivers)) == len(receivers)
        for t in step:
            assert t.src != t.dst and t.lo == moved[t.src, t.dst] and t.hi > t.lo
            moved[t.src, t.dst] = t.hi
    np.fill_diagonal(pairs, 0)
    assert (moved == pairs).all()


# --------------------------------------------------------------------------- real runs


def _assert_succeeded(result: dict, gpus: int, tokens: int) -> None:
    assert result["status"] == "SUCCEEDED", result["error"]
    assert result["error"] is None
    assert (result["backend"], result["gpus"], result["tokens"]) == ("gloo", gpus, tokens)
    assert result["max_abs_diff_vs_monolithic"] <= TOLERANCE
    assert len(result["layer_seconds"]) == LAYERS
    assert all(s > 0 for s in result["layer_seconds"])
    assert result["a2a_seconds"]["planned"] > 0 and result["a2a_seconds"]["baseline"] > 0


def test_two_ranks_with_a_replicated_expert_and_both_orders(minilm: MoEModel) -> None:
    """Expert 1 split 50/50 over both ranks, rank 1 hosting three experts."""
    plan = _plan([[(0, 1.0), (1, 0.5)], [(1, 0.5), (2, 1.0), (3, 1.0)]], ["aurora", "rank"])
    _assert_succeeded(run_plan(plan, tokens=512, timeout_s=120), gpus=2, tokens=512)


def test_four_ranks_aurora_with_an_idle_rank(minilm: MoEModel) -> None:
    """3 windows on 4 ranks: rank 3 has no tokens but hosts expert 3 and 70% of expert 0."""
    plan = _plan([[(0, 0.3)], [(1, 1.0)], [(2, 1.0)], [(0, 0.7), (3, 1.0)]], ["aurora"])
    _assert_succeeded(run_plan(plan, tokens=384, timeout_s=120), gpus=4, tokens=384)


# --------------------------------------------------------------------------- failures


def test_a_plan_for_another_model_fails_with_a_clear_error(minilm: MoEModel) -> None:
    result = run_plan(_plan([[(0, 1.0), (1, 1.0)], [(2, 1.0), (3, 1.0)]], ["rank"], layers=2))
    assert result["status"] == "FAILED"
    assert "the plan places MoE layers [0, 1]; minilm has layers 0..5" in result["error"]


def test_a_plan_with_unsupported_experts_fails_before_any_rank_starts() -> None:
    result = run_plan(_plan([[(0, 1.0), (1, 1.0)], [(2, 1.0)]], ["rank"], experts=3))
    assert result["status"] == "FAILED"
    assert "--experts 3 is not supported" in result["error"]


def _fail_on_rank_one(rank: int, job: _Job) -> None:
    """Rank 1 fails; rank 0 stands for a peer blocked in a collective that never completes."""
    if rank == 1:
        raise ValueError("boom")
    time.sleep(600)


def _sleep(rank: int, job: _Job) -> None:
    time.sleep(600)


def _job(root: Path) -> _Job:
    plan = _plan([[(0, 1.0), (1, 1.0)], [(2, 1.0), (3, 1.0)]], ["rank"])
    return _Job(plan, root, np.zeros((0, 128), dtype=np.int64), "gloo", root, 600.0)


def test_a_failing_rank_fails_the_run_with_its_error_and_stops_the_others(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    with pytest.raises(GpuRunError, match="rank 1: ValueError: boom"):
        _launch(_fail_on_rank_one, _job(tmp_path), 2, timeout_s=600)
    assert time.monotonic() - started < 300  # when rank 1 failed, not at the 600 s timeout


def test_a_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(GpuRunError, match="did not finish within 2 s"):
        _launch(_sleep, _job(tmp_path), 2, timeout_s=2)
    assert time.monotonic() - started < 300  # the ranks sleep 600 s: they were killed
