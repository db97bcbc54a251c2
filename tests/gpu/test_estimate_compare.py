"""GPU layer times (Eq. 1) by hand, and the serverless-vs-GPU break-even arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.cluster import load_catalogue
from gpu.compare import GpuOption, breakeven_rps, gpu_cost_per_million
from gpu.estimate import ModelWork, estimate_layer


def _work() -> ModelWork:
    return ModelWork(
        nonmoe_flops=np.array([1e9]),
        expert_flops=np.array([[2e9, 4e9]]),
        tail_flops=0.0,
        token_bytes=1000.0,
        top_k=1,
    )


@pytest.mark.parametrize("order", ["aurora", "rank"])
def test_layer_time_by_hand(order: str) -> None:
    """2 GPUs, expert e on GPU e; shard 0 sends 30 tokens to expert 1, shard 1 sends 10 to
    expert 0: each all-to-all's bound is the busiest line, 30 tokens of 1 kB."""
    catalogue = load_catalogue()
    kind = catalogue.get("t4")
    counts = np.array([[50.0, 30.0], [10.0, 70.0]])
    placement = [[(0, 1.0)], [(1, 1.0)]]
    got = estimate_layer(counts, placement, 0, _work(), [kind, kind], catalogue, order)
    one_a2a = 30 * 1000 / kind.bandwidth
    assert got.lower_bound_s == pytest.approx(2 * one_a2a)
    assert got.a2a_s == pytest.approx(2 * one_a2a)  # no contention with one flow per sender
    speed = kind.flops(catalogue.mfu)
    gate = catalogue.kernel_s + 80 * 1e9 / speed  # each shard holds 80 tokens (k = 1)
    ffn = catalogue.kernel_s + 100 * 4e9 / speed  # GPU 1 runs expert 1 on 100 tokens
    assert got.layer_s == pytest.approx(gate + 2 * one_a2a + ffn + catalogue.kernel_s)
    assert got.rounds == (1 if order == "aurora" else 0)  # one swap: 0 -> 1 and 1 -> 0


def test_rank_order_contends_where_aurora_does_not() -> None:
    """Every sender first targets GPU 0 in rank order: slower than Aurora's rounds."""
    catalogue = load_catalogue()
    kind = catalogue.get("t4")
    counts = np.full((4, 4), 100.0)
    placement = [[(e, 1.0)] for e in range(4)]
    work = ModelWork(np.array([0.0]), np.zeros((1, 4)), 0.0, 1000.0, 1)
    aurora = estimate_layer(counts, placement, 0, work, [kind] * 4, catalogue, "aurora")
    rank = estimate_layer(counts, placement, 0, work, [kind] * 4, catalogue, "rank")
    assert aurora.a2a_s == pytest.approx(aurora.lower_bound_s)
    assert rank.a2a_s > aurora.a2a_s * 1.2


def test_breakeven_rate_is_where_the_costs_meet() -> None:
    option = GpuOption("t4", 2, latency_s=0.5, usd_per_hour=1.0)
    tokens, u, lam = 10_000, 0.8, 0.05  # Lambda: $0.05 per million tokens
    rate = breakeven_rps(option, lam, tokens, u)
    assert rate is not None and rate <= u / option.latency_s
    assert gpu_cost_per_million(option, rate, tokens, u) == pytest.approx(lam)
    assert gpu_cost_per_million(option, rate * 0.9, tokens, u) > lam
    assert gpu_cost_per_million(option, rate * 1.1, tokens, u) < lam
    # Past one copy's capacity more copies are needed: cost per token never drops below the
    # full-load cost of a copy.
    assert option.copies(10.0, u) == 7
    full_load = option.usd_per_hour / 3600 * option.latency_s / u / tokens * 1e6
    rates = np.linspace(0.01, 50, 2000)
    costs = [gpu_cost_per_million(option, r, tokens, u) for r in rates]
    assert min(costs) >= full_load * (1 - 1e-9)
    assert breakeven_rps(option, full_load * 0.99, tokens, u) is None  # Lambda always cheaper
