"""Per-layer MoE inference time under Aurora's model (spec §2.1, §2.3, §2.4 and §3.1's metric).

Units everywhere: token counts for traffic, seconds for times, bytes/s for NIC bandwidth, and a
dimensionless relative compute speed per GPU (1 = the GPU the `LayerCost` was measured on).

The placement unit is an expert-parallel rank (token shard i + expert i): `tokens[i, j]` is what
shard i sends expert j, and putting expert i on GPU g moves row i and column i, so the GPU-level
matrix is P D P^T (`gpu_level`). Both all-to-alls of a layer carry the same tokens in opposite
directions (D_C = D_N^T), and the own-NIC lower bound is symmetric under transposition, so the
second all-to-all takes as long as the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpu.aurora.a2a import lower_bound

__all__ = [
    "LayerCost",
    "colocated_cycle_s",
    "exclusive_layer_s",
    "gpu_level",
    "table2_recurrence",
    "utilisation",
]


@dataclass(frozen=True)
class LayerCost:
    """Compute cost of one MoE layer on a GPU of relative speed 1; divide by a GPU's speed.

    `gate_s` and `agg_s` are per GPU per layer (every GPU gates and aggregates its own shard);
    `ffn_s_per_token` is the expert's time per token it processes; `token_bytes` is one token's
    activation size on the wire.
    """

    gate_s: float
    agg_s: float
    ffn_s_per_token: float
    token_bytes: float

    def __post_init__(self) -> None:
        for name in ("gate_s", "agg_s", "ffn_s_per_token"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"LayerCost.{name} must be finite and >= 0, got {value}")
        if not (np.isfinite(self.token_bytes) and self.token_bytes > 0):
            raise ValueError(
                f"LayerCost.token_bytes must be finite and > 0, got {self.token_bytes}"
            )


def _tokens(tokens: np.ndarray, name: str = "tokens") -> np.ndarray:
    t = np.asarray(tokens, dtype=float)
    if t.ndim != 2 or t.shape[0] != t.shape[1] or t.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty square (n, n) matrix, got shape {t.shape}")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"{name} must hold finite, non-negative token counts")
    return t


def _permutation(perm: np.ndarray, n: int, name: str) -> np.ndarray:
    p = np.asarray(perm)
    if p.shape != (n,) or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(
            f"{name} must be an integer array of shape ({n},), got {p.dtype} {p.shape}"
        )
    if not np.array_equal(np.sort(p), np.arange(n)):
        raise ValueError(f"{name} must be a permutation of 0..{n - 1}, got {p.tolist()}")
    return p.astype(np.intp)


def _per_gpu(values: np.ndarray, n: int, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if v.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one entry per GPU), got {v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {v.tolist()}")
    return v


def gpu_level(tokens: np.ndarray, gpu_of_expert: np.ndarray) -> np.ndarray:
    """P D P^T: tokens GPU g sends GPU h when expert slot i runs on GPU gpu_of_expert[i]."""
    d = _tokens(tokens)
    return _place(d, _permutation(gpu_of_expert, d.shape[0], "gpu_of_expert"))


def _place(tokens: np.ndarray, gpu_of_expert: np.ndarray) -> np.ndarray:
    """`gpu_level` on already validated input."""
    m = np.empty_like(tokens)
    m[gpu_of_expert[:, None], gpu_of_expert] = tokens
    return m


def exclusive_layer_s(
    tokens: np.ndarray,
    gpu_of_expert: np.ndarray,
    cost: LayerCost,
    gpu_speed: np.ndarray,
    bandwidth: np.ndarray,
    a2a_s: float | None = None,
) -> float:
    """Eq. 1: max_i(G_i + N_i) + max_j(F_j + C_j) + max_k A_k seconds, one model per GPU.

    The all-to-all is synchronous, so N and C are one cluster-wide time: the contention-free
    optimum (Theorems 4.2/5.2: `lower_bound` of the GPU-level matrix, each GPU at its own NIC
    rate) unless `a2a_s` gives the time of a concrete order (e.g. simulated). G_i = gate_s/speed_i,
    A_k = agg_s/speed_k, and F_j = tokens processed on GPU j (column sum including the local
    diagonal) * ffn_s_per_token / speed_j.
    """
    m = gpu_level(tokens, gpu_of_expert)
    speed = _per_gpu(gpu_speed, m.shape[0], "gpu_speed")
    bw = _per_gpu(bandwidth, m.shape[0], "bandwidth")
    comm = lower_bound(m, bw, cost.token_bytes) if a2a_s is None else float(a2a_s)
    if not (np.isfinite(comm) and comm >= 0):
        raise ValueError(f"a2a_s must be finite and >= 0, got {a2a_s}")
    slowest = speed.min()
    ffn = float(np.max(m.sum(axis=0) * cost.ffn_s_per_token / speed))
    return cost.gate_s / slowest + comm + ffn + comm + cost.agg_s / slowest


def table2_recurrence(
    gate_a: np.ndarray | float,
    gate_b: np.ndarray | float,
    n_a: np.ndarray | float,
    n_b: np.ndarray | float,
    n_ab: np.ndarray | float,
    ffn_a: np.ndarray | float,
    ffn_b: np.ndarray | float,
    c_a: np.ndarray | float,
    c_b: np.ndarray | float,
    agg_a: np.ndarray | float,
    agg_b: np.ndarray | float,
) -> np.ndarray | float:
    """Table 2 / Eq. 4: one steady-state cycle (a layer of each of two colocated models), seconds.

    Compute runs G^b -> F^a -> F^b -> A^a -> A^b -> G^a on each GPU and the network carries
    N^a -> N^b -> C^a -> C^b; `n_ab` is the aggregated first all-to-all |N^a + N^b|. This is the
    spec's executable form (§2.4 [recon]) with one addition: N^b cannot end before G^b + |N^b|,
    because model b has nothing to send before its gate has run (the printed table lets it end at
    max(|N^a + N^b|, |G^b|)). Element-wise on arrays, so one call can time many placements or
    (pair, GPU) combinations.
    """
    end_fa = np.maximum(gate_b, n_a) + ffn_a
    end_nb = np.maximum(n_ab, np.add(gate_b, n_b))
    end_fb = np.maximum(end_fa, end_nb) + ffn_b
    end_ca = np.maximum(end_fa, end_nb) + c_a
    end_cb = np.maximum(end_fb, end_ca) + c_b
    end_aa = np.maximum(end_fb, end_ca) + agg_a
    end_ab = np.maximum(end_aa, end_cb) + agg_b
    return end_ab + gate_a


def colocated_cycle_s(
    tokens_a: np.ndarray,
    tokens_b: np.ndarray,
    pairing: np.ndarray,
    gpu_of_pair: np.ndarray,
    cost: LayerCost,
    gpu_speed: np.ndarray,
    bandwidth: np.ndarray,
) -> float:
    """Seconds per cycle of two models colocated on n GPUs (Table 2 with |X| = max over GPUs).

    Expert k of model a and expert `pairing[k]` of model b share GPU `gpu_of_pair[k]`. Both models
    use `cost` (the paper colocates two ViT-B variants). Communication terms are contention-free
    optima at each GPU's own NIC: |N^a|, |N^b| from each model's GPU-level matrix, |N^a + N^b| from
    their sum, and C = N for each model (reversed all-to-all). Compute terms are the slowest GPU's.
    """
    a = _tokens(tokens_a, "tokens_a")
    b = _tokens(tokens_b, "tokens_b")
    n = a.shape[0]
    if b.shape != a.shape:
        raise ValueError(f"both models need the same number of experts, got {n} and {b.shape[0]}")
    pair = _permutation(pairing, n, "pairing")
    gpu_a = _permutation(gpu_of_pair, n, "gpu_of_pair")
    speed = _per_gpu(gpu_speed, n, "gpu_speed")
    bw = _per_gpu(bandwidth, n, "bandwidth")
    gpu_b = np.empty(n, dtype=np.intp)
    gpu_b[pair] = gpu_a
    ma, mb = _place(a, gpu_a), _place(b, gpu_b)
    n_a = lower_bound(ma, bw, cost.token_bytes)
    n_b = lower_bound(mb, bw, cost.token_bytes)
    n_ab = lower_bound(ma + mb, bw, cost.token_bytes)
    ffn_a = float(np.max(ma.sum(axis=0) * cost.ffn_s_per_token / speed))
    ffn_b = float(np.max(mb.sum(axis=0) * cost.ffn_s_per_token / speed))
    gate, agg = cost.gate_s / speed.min(), cost.agg_s / speed.min()
    return float(table2_recurrence(gate, gate, n_a, n_b, n_ab, ffn_a, ffn_b, n_a, n_b, agg, agg))


def utilisation(
    models: Sequence[tuple[np.ndarray, np.ndarray]],
    cost: LayerCost,
    gpu_speed: np.ndarray,
    inference_s: float,
) -> float:
    """GPU utilisation (§8 metric): (G + F + A) compute seconds / inference time, mean over GPUs.

    `models` holds one `(tokens, gpu_of_expert)` per model on the cluster: one for exclusive
    placement, two for colocation (model b's `gpu_of_expert[pairing] = gpu_of_pair`). Each model
    must place its n experts on the n GPUs, one per GPU, so every GPU runs each model's gate and
    aggregation once. `inference_s` is the matching layer (exclusive) or cycle (colocated) time.
    The paper does not say how it averages; the unweighted mean over GPUs is used, which equals
    total busy time over n * inference time.
    """
    if not models:
        raise ValueError("models must hold at least one (tokens, gpu_of_expert) pair")
    if not (np.isfinite(inference_s) and inference_s > 0):
        raise ValueError(f"inference_s must be finite and > 0, got {inference_s}")
    n = np.asarray(models[0][0]).shape[0]
    speed = _per_gpu(gpu_speed, n, "gpu_speed")
    processed = np.zeros(n)
    for tokens, gpu_of_expert in models:
        m = gpu_level(tokens, gpu_of_expert)
        if m.shape[0] != n:
            raise ValueError(f"every model needs {n} experts (one per GPU), got {m.shape[0]}")
        processed += m.sum(axis=0)
    busy = (len(models) * (cost.gate_s + cost.agg_s) + processed * cost.ffn_s_per_token) / speed
    return float(busy.mean() / inference_s)
