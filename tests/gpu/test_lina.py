"""Lina's two-phase expert scheduling: FFD packing worked by hand, its invariants on random
inputs, the path-persistence statistic on traces with known answers and on real MiniLM routing,
the phase-2 trigger, and the measurement end to end."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.lina import (
    LinaLayer,
    estimate_counts,
    ffd_placement,
    measure,
    path_persistence,
    path_persistence_by_layer,
    reschedule_rate,
    schedule_batch,
    static_placement,
)
from ground.errors import UsageError
from moe import MoEModel
from predictor import RoutingTrace, profile_windows

from ..predictor.synthetic import make_trace


def _shares(placement: list[list[tuple[int, float]]], experts: int) -> np.ndarray:
    total = np.zeros(experts)
    for hosted in placement:
        for expert, share in hosted:
            total[expert] += share
    return total


# --- FFD placement ----------------------------------------------------------------------------


def test_ffd_worked_example() -> None:
    # Expert 0 takes two whole devices; the remainders 0.7 (e1), 0.5 (e0), 0.5 (e2), 0.2 (e3),
    # 0.1 (e4) go first-fit in decreasing order: 0.7 opens device 2, 0.5 opens device 3, the
    # other 0.5 fills device 3, then 0.2 and 0.1 fill device 2 to exactly 1.0.
    placement = ffd_placement(np.array([2.5, 0.7, 0.5, 0.2, 0.1]), gpus=4)
    assert placement == [
        [(0, pytest.approx(0.4))],
        [(0, pytest.approx(0.4))],
        [(1, 1.0), (3, 1.0), (4, 1.0)],
        [(0, pytest.approx(0.2)), (2, 1.0)],
    ]


def test_ffd_spreads_experts_without_estimate_over_free_devices() -> None:
    placement = ffd_placement(np.array([1.5, 1.5, 0.0, 0.0, 0.0]), gpus=5)
    assert placement == [
        [(0, pytest.approx(2 / 3))],
        [(1, pytest.approx(2 / 3))],
        [(0, pytest.approx(1 / 3)), (1, pytest.approx(1 / 3))],
        [(2, 1.0), (4, 1.0)],
        [(3, 1.0)],
    ]


def test_ffd_without_free_device_uses_the_least_loaded() -> None:
    # No device is free for expert 2; all carry 1.0 and one expert, so the lowest index wins.
    assert ffd_placement(np.array([2.0, 2.0, 0.0]), gpus=4) == [
        [(0, 0.5), (2, 1.0)],
        [(0, 0.5)],
        [(1, 0.5)],
        [(1, 0.5)],
    ]
    # FFD would need a third device for 0.5; it goes to the least-loaded of the two (0.7).
    assert ffd_placement(np.array([0.7, 0.8, 0.5]), gpus=2) == [[(1, 1.0)], [(0, 1.0), (2, 1.0)]]


def test_ffd_folds_remainders_when_slots_run_short() -> None:
    # 8 experts on 2 GPUs fill all 8 slots: expert 0 cannot keep a separate 0.3 remainder.
    placement = ffd_placement(np.array([1.3] + [0.1] * 7), gpus=2)
    assert placement == [
        [(0, 1.0), (5, 1.0), (6, 1.0), (7, 1.0)],
        [(e, 1.0) for e in (1, 2, 3, 4)],
    ]
    # ...nor a second whole replica.
    placement = ffd_placement(np.array([2.0] + [0.0] * 7), gpus=2)
    assert placement == [
        [(0, 1.0), (5, 1.0), (6, 1.0), (7, 1.0)],
        [(e, 1.0) for e in (1, 2, 3, 4)],
    ]


def test_ffd_replicates_on_more_gpus_than_experts() -> None:
    placement = ffd_placement(np.array([4.0, 2.0]), gpus=6)
    assert placement == [[(0, 0.25)]] * 4 + [[(1, 0.5)]] * 2


@pytest.mark.parametrize(("experts", "gpus"), [(16, 16), (16, 4), (12, 4), (8, 16), (5, 2)])
def test_ffd_invariants_on_random_popularity(experts: int, gpus: int) -> None:
    rng = np.random.default_rng(experts * 100 + gpus)
    for _ in range(50):
        popularity = rng.dirichlet(np.full(experts, 0.3))
        popularity[rng.random(experts) < 0.2] = 0.0  # some experts without an estimate
        devices = gpus * popularity / max(popularity.sum(), 1e-12)
        placement = ffd_placement(devices, gpus)
        assert placement == ffd_placement(devices.copy(), gpus)  # deterministic
        assert len(placement) == gpus
        assert all(len(hosted) <= 4 for hosted in placement)
        np.testing.assert_allclose(_shares(placement, experts), 1.0)  # every expert, once
        if experts <= 3 * gpus:  # slots to spare: every expert keeps its whole devices
            replicas = np.bincount([e for h in placement for e, _ in h], minlength=experts)
            assert (replicas >= np.floor(devices + 1e-9)).all()


def test_ffd_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 5 GPUs"):
        ffd_placement(np.full(17, 4 / 17), gpus=4)
    with pytest.raises(ValueError, match="only 4"):
        ffd_placement(np.array([3.0, 2.0]), gpus=4)
    with pytest.raises(ValueError, match="finite"):
        ffd_placement(np.array([1.0, -0.5]), gpus=4)
    with pytest.raises(UsageError):  # the CLI shows it without a traceback
        ffd_placement(np.array([1.0]), gpus=0)


# --- path persistence -------------------------------------------------------------------------


def _routing(top1: np.ndarray, experts: int, second: int | None = None) -> RoutingTrace:
    """A trace of (L, N) top-1 choices; with `second`, a constant second choice (k = 2)."""
    chosen = top1[:, :, None]
    if second is not None:
        chosen = np.concatenate([chosen, np.full_like(chosen, second)], axis=2)
    n = top1.shape[1]
    return make_trace(np.arange(n) % 16, chosen, num_experts=experts)


def test_path_persistence_worked_example() -> None:
    # Group 0 (3 tokens) goes 2, 2, 3 next: 2 stay with its top-1. Group 1 (2 tokens) goes 3, 3.
    trace = _routing(np.array([[0, 0, 0, 1, 1], [2, 2, 3, 3, 3]]), experts=4, second=1)
    assert path_persistence(trace, 1) == pytest.approx(4 / 5)
    assert path_persistence(trace, 2) == pytest.approx(1.0)


def test_path_persistence_persistent_and_independent_routing() -> None:
    rng = np.random.default_rng(0)
    first = rng.integers(0, 8, 4000)
    persistent = np.stack([(first + 3 * layer) % 8 for layer in range(4)])
    assert path_persistence(_routing(persistent, 8), 1) == pytest.approx(1.0)
    independent = _routing(rng.integers(0, 8, (4, 100_000)), 8)
    assert path_persistence(independent, 1) == pytest.approx(1 / 8, abs=0.01)
    assert path_persistence(independent, 2) == pytest.approx(2 / 8, abs=0.01)
    np.testing.assert_allclose(path_persistence_by_layer(independent, 1), 1 / 8, atol=0.01)


def test_path_persistence_needs_two_layers() -> None:
    with pytest.raises(ValueError, match="two MoE layers"):
        path_persistence(_routing(np.zeros((1, 8), dtype=int), 4), 1)


@pytest.fixture(scope="module")
def minilm_trace(minilm: MoEModel, wiki_windows: np.ndarray) -> RoutingTrace:
    return profile_windows(minilm, wiki_windows, tokens=512).trace


def test_path_persistence_on_real_minilm_routing(minilm_trace: RoutingTrace) -> None:
    k1, k2 = path_persistence(minilm_trace, 1), path_persistence(minilm_trace, 2)
    assert 0 < k1 <= k2 <= 1
    assert k1 > 1 / minilm_trace.num_experts  # real routing is not independent across layers


# --- two-phase scheduling ---------------------------------------------------------------------


ACTUAL = np.array([[50.0, 30, 15, 5], [10, 60, 20, 10], [5, 5, 80, 10], [40, 35, 20, 5]] * 2)


def _by_counts(counts: np.ndarray, gpus: int) -> list[list[tuple[int, float]]]:
    return ffd_placement(gpus * counts / counts.sum(), gpus)


def test_matching_estimate_keeps_phase_one() -> None:
    estimate = ACTUAL * 0.5 + np.array([0.0, 0.0, 3.0, 0.0])  # same top-2, other counts
    layers = schedule_batch(estimate, ACTUAL, gpus=4)
    assert [layer.scheduled for layer in layers] == [False] * 3 + [True] * 5
    assert not any(layer.rescheduled for layer in layers)
    assert layers[0].placement == static_placement(4, 4) == [[(e, 1.0)] for e in range(4)]
    for layer in layers[3:]:
        assert layer.placement == _by_counts(estimate[layer.layer], 4)
        np.testing.assert_array_equal(layer.actual, ACTUAL[layer.layer])


def test_swapped_top_two_reschedules_by_the_actual_counts() -> None:
    estimate = ACTUAL.copy()
    estimate[5, [1, 2]] = estimate[5, [2, 1]]  # layer 5: top-2 (1, 2) becomes (2, 1)
    layers = schedule_batch(estimate, ACTUAL, gpus=4)
    assert [layer.rescheduled for layer in layers] == [False] * 5 + [True] + [False] * 2
    assert layers[5].placement == _by_counts(ACTUAL[5], 4)
    assert layers[5].placement != _by_counts(estimate[5], 4)
    # The same two experts in another order are no change when compared as sets.
    as_sets = schedule_batch(estimate, ACTUAL, gpus=4, ordered=False)
    assert not any(layer.rescheduled for layer in as_sets)


def test_scheduling_starts_at_first_layer_and_checks_input() -> None:
    wrong = ACTUAL[:, ::-1].copy()
    layers = schedule_batch(wrong, ACTUAL, gpus=4, first_layer=0)
    assert all(layer.scheduled and layer.rescheduled for layer in layers)
    with pytest.raises(ValueError, match="differ in shape"):
        schedule_batch(ACTUAL[:, :3], ACTUAL, gpus=4)
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        schedule_batch(np.ones((4, 8)), np.ones((4, 8)), gpus=1)


def _layer(scheduled: bool, rescheduled: bool) -> LinaLayer:
    return LinaLayer(0, [], np.zeros(2), np.zeros(2), rescheduled, scheduled)


def test_reschedule_rate_counts_scheduled_layers_only() -> None:
    first = [_layer(False, False)] * 3 + [_layer(True, True), _layer(True, False)]
    second = [_layer(False, False)] * 3 + [_layer(True, True), _layer(True, True)]
    assert reschedule_rate([first, second]) == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="no MoE layer was scheduled"):
        reschedule_rate([[_layer(False, False)] * 3])


# --- estimators and the measurement -----------------------------------------------------------


def _persistent_trace(tokens: int, seed: int) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    first = rng.choice(4, tokens, p=[0.55, 0.25, 0.15, 0.05])
    top1 = np.stack([(first + layer) % 4 for layer in range(6)])
    return _routing(top1, 4)


def test_lina_path_estimate_is_exact_on_persistent_routing() -> None:
    profile, batch = _persistent_trace(2000, 0), _persistent_trace(256, 1)
    counts = estimate_counts(profile, batch, "lina-path")
    np.testing.assert_allclose(counts[1:], batch.popularity()[1:])
    assert estimate_counts(profile, batch, "history").shape == (6, 4)
    with pytest.raises(UsageError, match="no prediction method"):
        estimate_counts(profile, batch, "oracle")
    with pytest.raises(ValueError, match="the batch"):
        estimate_counts(profile, _routing(np.zeros((6, 8), dtype=int), 8), "lina-path")


def test_measure_never_reschedules_an_exact_estimate() -> None:
    result = measure(
        _persistent_trace(2000, 0),
        _persistent_trace(512, 1),
        gpus=4,
        batch_tokens=64,
        batches=5,
        estimator="lina-path",
    )
    assert result["reschedule_rate"] == 0.0
    assert result["path_persistence_k1"] == 1.0
    ratios = result["max_load_ratio"]
    assert isinstance(ratios, dict)
    assert ratios["two_phase"] == ratios["phase1_only"] < ratios["static"]


def test_measure_on_real_minilm_routing(minilm_trace: RoutingTrace) -> None:
    profile = minilm_trace.select_windows(np.array([0, 1]))
    held_out = minilm_trace.select_windows(np.array([2, 3]))
    result = measure(profile, held_out, gpus=4, batch_tokens=128, batches=3, estimator="lina-path")
    assert 0.0 <= result["reschedule_rate_sets"] <= result["reschedule_rate"] <= 1.0
    assert len(result["reschedule_rate_per_layer"]) == minilm_trace.num_layers - 3
    ratios = result["max_load_ratio"]
    assert isinstance(ratios, dict)
    assert min(ratios.values()) >= 1.0  # the busiest GPU carries at least the mean
