"""Eq. 1 and the Table 2 recurrence, checked against hand calculations."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.aurora.timeline import (
    LayerCost,
    colocated_cycle_s,
    exclusive_layer_s,
    gpu_level,
    table2_recurrence,
    utilisation,
)

# Eq. 1 example: 3 expert slots on 3 GPUs; GPU 0 is twice as fast with twice the bandwidth.
D = np.array([[4.0, 2.0, 0.0], [1.0, 3.0, 5.0], [0.0, 6.0, 2.0]])
GPU_OF_EXPERT = np.array([1, 2, 0])  # slot 0 -> GPU 1, slot 1 -> GPU 2, slot 2 -> GPU 0
SPEED = np.array([2.0, 1.0, 1.0])
BANDWIDTH = np.array([200.0, 100.0, 100.0])  # bytes/s
COST = LayerCost(gate_s=0.4, agg_s=0.2, ffn_s_per_token=0.1, token_bytes=10.0)


def test_gpu_level_moves_rows_and_columns() -> None:
    # M[g(i), g(j)] = D[i, j].
    expected = np.array([[2.0, 0.0, 6.0], [0.0, 4.0, 2.0], [5.0, 1.0, 3.0]])
    assert np.array_equal(gpu_level(D, GPU_OF_EXPERT), expected)


def test_eq1_by_hand() -> None:
    # GPU matrix [[2,0,6],[0,4,2],[5,1,3]]. Off-diagonal sends 6, 2, 6 and receives 5, 1, 8
    # tokens of 10 B: sends 60/200, 20/100, 60/100 s; receives 50/200, 10/100, 80/100 s.
    # N = C = 0.8 (GPU 2 receiving). Processed (with the diagonal) 7, 5, 11 tokens:
    # F = 0.7/2, 0.5, 1.1 -> 1.1. Gate 0.4 and aggregation 0.2 on the slowest (speed 1) GPU.
    t = exclusive_layer_s(D, GPU_OF_EXPERT, COST, SPEED, BANDWIDTH)
    assert t == pytest.approx(0.4 + 0.8 + 1.1 + 0.8 + 0.2)


def test_eq1_uses_a_given_all_to_all_time() -> None:
    t = exclusive_layer_s(D, GPU_OF_EXPERT, COST, SPEED, BANDWIDTH, a2a_s=1.0)
    assert t == pytest.approx(0.4 + 1.0 + 1.1 + 1.0 + 0.2)


def test_eq1_placement_changes_the_time() -> None:
    # Slot 1 (11 tokens processed, 8 received) on the fast GPU 0 instead: receives 80/200 = 0.4,
    # slot 2 (sends 6) on GPU 2 -> 0.6; F = max(11/2, 7, 5) * 0.1 = 0.7.
    t = exclusive_layer_s(D, np.array([1, 0, 2]), COST, SPEED, BANDWIDTH)
    assert t == pytest.approx(0.4 + 0.6 + 0.7 + 0.6 + 0.2)


def test_table2_recurrence_by_hand() -> None:
    # E_Fa = max(Gb 2, Na 3) + Fa 1 = 4; E_Nb = max(NaNb 4, Gb 2 + Nb 2) = 4;
    # E_Fb = max(4, 4) + 2 = 6; E_Ca = max(4, 4) + 3 = 7; E_Cb = max(6, 7) + 2 = 9;
    # E_Aa = max(6, 7) + 1 = 8; E_Ab = max(8, 9) + 1 = 10; t = E_Ab + Ga 1 = 11.
    t = table2_recurrence(
        gate_a=1, gate_b=2, n_a=3, n_b=2, n_ab=4, ffn_a=1, ffn_b=2, c_a=3, c_b=2, agg_a=1, agg_b=1
    )
    assert t == pytest.approx(11.0)


def test_table2_model_b_sends_only_after_its_gate() -> None:
    # Gb = 5 > |N^a + N^b| = 4: N^b ends at Gb + Nb = 7 (the printed table would say 5).
    # E_Fa = 6, E_Fb = 8, E_Ca = 8, E_Cb = 10, E_Aa = 9, E_Ab = 11, t = 11.
    t = table2_recurrence(
        gate_a=0, gate_b=5, n_a=1, n_b=2, n_ab=4, ffn_a=1, ffn_b=1, c_a=1, c_b=2, agg_a=1, agg_b=1
    )
    assert t == pytest.approx(11.0)


def test_table2_without_communication_is_serial_compute() -> None:
    compute = {
        "gate_a": 0.1,
        "gate_b": 0.2,
        "ffn_a": 0.3,
        "ffn_b": 0.4,
        "agg_a": 0.5,
        "agg_b": 0.6,
    }
    t = table2_recurrence(n_a=0, n_b=0, n_ab=0, c_a=0, c_b=0, **compute)
    assert t == pytest.approx(sum(compute.values()))


def test_table2_is_elementwise() -> None:
    rng = np.random.default_rng(0)
    args = rng.random((11, 6))
    together = table2_recurrence(*args)
    one_by_one = [table2_recurrence(*args[:, k]) for k in range(6)]
    assert np.allclose(together, one_by_one)


# Colocation example: 2 identical GPUs at 10 B/s, 1-byte tokens (0.1 s per token on the wire).
A = np.array([[3.0, 4.0], [2.0, 1.0]])
B = np.array([[0.0, 1.0], [5.0, 2.0]])
HOMOG = (np.ones(2), np.full(2, 10.0))
COLOC_COST = LayerCost(gate_s=0.5, agg_s=0.25, ffn_s_per_token=0.1, token_bytes=1.0)


def test_colocated_cycle_by_hand() -> None:
    # a0 + b1 on GPU 1, a1 + b0 on GPU 0. GPU matrices: a -> [[1,2],[4,3]], b -> [[0,1],[5,2]].
    # |N^a| = 4 tokens = 0.4 s, |N^b| = 5 = 0.5 s, sum [[1,3],[9,5]]: |N^a + N^b| = 9 = 0.9 s.
    # F^a = 5 tokens = 0.5, F^b = max(5, 3) = 0.5; C = N per model; G = 0.5, A = 0.25.
    # E_Fa = 1.0, E_Nb = max(0.9, 0.5 + 0.5) = 1.0, E_Fb = 1.5, E_Ca = 1.4, E_Cb = 2.0,
    # E_Aa = 1.75, E_Ab = 2.25, t = 2.75.
    t = colocated_cycle_s(A, B, np.array([1, 0]), np.array([1, 0]), COLOC_COST, *HOMOG)
    assert t == pytest.approx(2.75)


def test_colocated_pairing_matters() -> None:
    # a0 + b0 together: sum [[3,5],[7,3]] -> |N^a + N^b| = 0.7 < 0.9, but b alone still takes
    # Gb + Nb = 1.0, so the cycle does not change; F^b = max(5, 3) still 0.5.
    t = colocated_cycle_s(A, B, np.array([0, 1]), np.array([0, 1]), COLOC_COST, *HOMOG)
    assert t == pytest.approx(2.75)
    slow_network = (np.ones(2), np.full(2, 2.0))  # 0.5 s per token: communication dominates
    paired_apart = colocated_cycle_s(
        A, B, np.array([1, 0]), np.array([1, 0]), COLOC_COST, *slow_network
    )
    paired_together = colocated_cycle_s(
        A, B, np.array([0, 1]), np.array([0, 1]), COLOC_COST, *slow_network
    )
    # Apart: Na 2, Nb 2.5, NaNb 4.5, F 0.5 each: E_Fa 2.5, E_Nb 4.5, E_Fb 5, E_Ca 6.5,
    # E_Cb 9, E_Aa 6.75, E_Ab 9.25, t 9.75. Together: NaNb 3.5 -> E_Nb 3.5 (Gb + Nb = 3),
    # E_Fb 4, E_Ca 5.5, E_Cb 8, E_Aa 5.75, E_Ab 8.25, t 8.75.
    assert paired_apart == pytest.approx(9.75)
    assert paired_together == pytest.approx(8.75)


def test_utilisation_by_hand() -> None:
    # Colocated: each GPU runs 2 x (0.5 + 0.25) of gate + aggregation; GPU 0 processes 5 + 5
    # tokens (1.0 s), GPU 1 5 + 3 (0.8 s): busy 2.5 and 2.3, mean 2.4 over the 2.75 s cycle.
    models = [(A, np.array([1, 0])), (B, np.array([0, 1]))]
    assert utilisation(models, COLOC_COST, np.ones(2), 2.75) == pytest.approx(2.4 / 2.75)
    # Exclusive Eq. 1 example: busy 0.6/2 + 0.7/2, 0.6 + 0.5, 0.6 + 1.1 = 0.65, 1.1, 1.7.
    t = exclusive_layer_s(D, GPU_OF_EXPERT, COST, SPEED, BANDWIDTH)
    assert utilisation([(D, GPU_OF_EXPERT)], COST, SPEED, t) == pytest.approx(1.15 / 3.3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_of_expert": np.array([0, 0, 1])}, "permutation"),
        ({"gpu_of_expert": np.array([0.0, 1.0, 2.0])}, "integer"),
        ({"tokens": -D}, "non-negative"),
        ({"tokens": D[:2]}, "square"),
        ({"bandwidth": np.array([1.0, 0.0, 1.0])}, "bandwidth"),
        ({"gpu_speed": np.ones(2)}, "gpu_speed"),
        ({"a2a_s": -1.0}, "a2a_s"),
    ],
)
def test_eq1_rejects_bad_input(kwargs: dict, message: str) -> None:
    args = {
        "tokens": D,
        "gpu_of_expert": GPU_OF_EXPERT,
        "cost": COST,
        "gpu_speed": SPEED,
        "bandwidth": BANDWIDTH,
    }
    with pytest.raises(ValueError, match=message):
        exclusive_layer_s(**(args | kwargs))


def test_bad_costs_and_colocations_are_rejected() -> None:
    with pytest.raises(ValueError, match="gate_s"):
        LayerCost(gate_s=-1.0, agg_s=0.0, ffn_s_per_token=0.0, token_bytes=1.0)
    with pytest.raises(ValueError, match="token_bytes"):
        LayerCost(gate_s=0.0, agg_s=0.0, ffn_s_per_token=0.0, token_bytes=0.0)
    with pytest.raises(ValueError, match="same number of experts"):
        colocated_cycle_s(A, D, np.arange(2), np.arange(2), COLOC_COST, *HOMOG)
    with pytest.raises(ValueError, match="pairing"):
        colocated_cycle_s(A, B, np.array([1, 1]), np.arange(2), COLOC_COST, *HOMOG)
    with pytest.raises(ValueError, match="inference_s"):
        utilisation([(A, np.arange(2))], COLOC_COST, np.ones(2), 0.0)
    with pytest.raises(ValueError, match="one per GPU"):
        utilisation([(A, np.arange(2)), (D, np.arange(3))], COLOC_COST, np.ones(2), 1.0)
