"""Aurora's expert placement: which GPU runs which expert, and which experts share a GPU.

Scenario 2 (exclusive, heterogeneous GPUs): Theorem 5.1's sorted assignment. Scenario 3 (two
models colocated on identical GPUs): Theorem 6.2's sorted pairing when every expert sends what it
receives (Case I), else a bottleneck matching (Case II); by Theorem 6.1 minimising the aggregated
all-to-all is enough. Scenario 4 (colocated, heterogeneous) is a bottleneck 3-D matching (NP-hard),
so Aurora decouples it into two bipartite bottleneck matchings (§7.2); `brute_force_colocation`
is the exact oracle for small n and `heuristic_over_optimum` measures the gap (paper: 1.07x).

Units as in `timeline`: token counts, seconds, bytes/s, relative compute speed.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from gpu.aurora.matching import bottleneck_matching, sorted_pairing
from gpu.aurora.timeline import (
    LayerCost,
    _per_gpu,
    _tokens,
    colocated_cycle_s,
    table2_recurrence,
)

__all__ = [
    "BENCH_COST",
    "brute_force_colocation",
    "colocate_heterogeneous",
    "colocate_homogeneous",
    "exclusive_heterogeneous",
    "heuristic_over_optimum",
]

#: Largest n `brute_force_colocation` accepts: it times (n!)^2 placements (25 million at n = 7).
MAX_BRUTE_FORCE_N = 7

#: The cost `heuristic_over_optimum` uses [assume]: ViT-B activations in bf16 (768 x 2 bytes) and
#: compute sized so that FFN and all-to-all times are comparable (the regime where placement
#: matters); the paper gives no G/F/A times.
BENCH_COST = LayerCost(gate_s=5e-6, agg_s=3e-6, ffn_s_per_token=1e-7, token_bytes=1536.0)

_PAPER_GBPS = (100.0, 80.0, 50.0, 40.0)  # §8.1's four GPU types, best first


def exclusive_heterogeneous(expert_tokens: np.ndarray, gpu_speed: np.ndarray) -> np.ndarray:
    """Theorem 5.1: the busiest expert on the fastest GPU, and so on down both orders.

    `expert_tokens[i]` is the tokens expert i processes; returns `gpu_of_expert` (n,). Exchange
    argument: if a busier expert sat on a slower GPU, swapping the two cannot raise the slower of
    their finish times. Exact for one load per expert; with separate send, receive and FFN loads
    Eq. 1 is a sum of maxima and the rule can miss the optimum by a few percent (spec §2.3).
    Ties keep index order, so the result is deterministic.
    """
    tokens = np.asarray(expert_tokens, dtype=float)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"expert_tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    if not np.all(np.isfinite(tokens)) or np.any(tokens < 0):
        raise ValueError("expert_tokens must be finite and >= 0")
    speed = _per_gpu(gpu_speed, tokens.size, "gpu_speed")
    gpu_of_expert = np.empty(tokens.size, dtype=np.intp)
    gpu_of_expert[np.argsort(-tokens, kind="stable")] = np.argsort(-speed, kind="stable")
    return gpu_of_expert


def _loads(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(send, receive) tokens of each expert slot: row and column sums without the diagonal."""
    off = tokens - np.diag(np.diag(tokens))
    return off.sum(axis=1), off.sum(axis=0)


def _model_pair(tokens_a: np.ndarray, tokens_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = _tokens(tokens_a, "tokens_a")
    b = _tokens(tokens_b, "tokens_b")
    if a.shape != b.shape:
        raise ValueError(
            f"colocation needs the same number of experts in both models, got {a.shape[0]} and "
            f"{b.shape[0]}"
        )
    return a, b


def colocate_homogeneous(tokens_a: np.ndarray, tokens_b: np.ndarray) -> np.ndarray:
    """Scenario 3: `pairing` (n,); expert i of model a shares a GPU with expert pairing[i] of b.

    The pairing minimises the aggregated all-to-all (largest send or receive load of any GPU),
    which by Theorem 6.1 minimises the Table 2 cycle on identical GPUs. Case I (every expert of
    both models sends exactly what it receives): Theorem 6.2's sorted rule in O(n log n). Case II:
    bottleneck matching on W_ij = max(send_a_i + send_b_j, recv_a_i + recv_b_j). Both models are
    assumed to use the same bytes per token, so token counts compare directly.
    """
    a, b = _model_pair(tokens_a, tokens_b)
    send_a, recv_a = _loads(a)
    send_b, recv_b = _loads(b)
    if np.array_equal(send_a, recv_a) and np.array_equal(send_b, recv_b):
        return sorted_pairing(send_a, send_b)
    weights = np.maximum(send_a[:, None] + send_b[None, :], recv_a[:, None] + recv_b[None, :])
    pairing, _ = bottleneck_matching(weights)
    return pairing


def _pair_gpu_times(
    a: np.ndarray,
    b: np.ndarray,
    pairing: np.ndarray,
    cost: LayerCost,
    speed: np.ndarray,
    bandwidth: np.ndarray,
) -> np.ndarray:
    """(pairs, GPUs): the Table 2 cycle of pair k if it ran on GPU g alone (stage-2 weights).

    Uses GPU g's own compute speed and NIC for every term: gate/aggregation/FFN at its speed, the
    pair's send/receive loads (each model's and their sum) over its bandwidth.
    """
    send_a, recv_a = _loads(a)
    send_b, recv_b = (load[pairing] for load in _loads(b))
    per_token_s = cost.token_bytes / bandwidth  # (g,)
    per_ffn_s = cost.ffn_s_per_token / speed
    n_a = np.maximum(send_a, recv_a)[:, None] * per_token_s
    n_b = np.maximum(send_b, recv_b)[:, None] * per_token_s
    n_ab = np.maximum(send_a + send_b, recv_a + recv_b)[:, None] * per_token_s
    ffn_a = a.sum(axis=0)[:, None] * per_ffn_s
    ffn_b = b.sum(axis=0)[pairing][:, None] * per_ffn_s
    gate, agg = cost.gate_s / speed, cost.agg_s / speed
    return np.asarray(
        table2_recurrence(gate, gate, n_a, n_b, n_ab, ffn_a, ffn_b, n_a, n_b, agg, agg)
    )


def colocate_heterogeneous(
    tokens_a: np.ndarray,
    tokens_b: np.ndarray,
    cost: LayerCost,
    gpu_speed: np.ndarray,
    bandwidth: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Scenario 4 heuristic (§7.2): returns `(pairing, gpu_of_pair)`.

    Stage 1 pairs experts as on identical GPUs (`colocate_homogeneous`, GPUs ignored). Stage 2
    fixes those pairs and assigns GPUs by a bottleneck matching on each pair's Table 2 cycle on
    each GPU alone, so the slowest GPU-pair combination is as fast as possible. Decoupling loses
    optimality (the best pairing can depend on the GPUs); `heuristic_over_optimum` measures it.
    Expert k of a and expert pairing[k] of b run on GPU gpu_of_pair[k]. Both models use `cost`.
    """
    a, b = _model_pair(tokens_a, tokens_b)
    speed = _per_gpu(gpu_speed, a.shape[0], "gpu_speed")
    bw = _per_gpu(bandwidth, a.shape[0], "bandwidth")
    pairing = colocate_homogeneous(a, b)
    gpu_of_pair, _ = bottleneck_matching(_pair_gpu_times(a, b, pairing, cost, speed, bw))
    return pairing, gpu_of_pair


def brute_force_colocation(
    tokens_a: np.ndarray,
    tokens_b: np.ndarray,
    cost: LayerCost,
    gpu_speed: np.ndarray,
    bandwidth: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact scenario 4 optimum of `colocated_cycle_s`: `(pairing, gpu_of_pair, seconds)`.

    Enumerates all n! pairings x n! GPU assignments (n <= MAX_BRUTE_FORCE_N), vectorised over
    the assignments; the first optimum in lexicographic (pairing, assignment) order wins. Every
    term is a max over GPUs of a per-GPU quantity, so it reproduces `colocated_cycle_s` exactly;
    the tests check that against a plain loop.
    """
    a, b = _model_pair(tokens_a, tokens_b)
    n = a.shape[0]
    if n > MAX_BRUTE_FORCE_N:
        raise ValueError(f"brute force is (n!)^2; n = {n} exceeds {MAX_BRUTE_FORCE_N}")
    speed = _per_gpu(gpu_speed, n, "gpu_speed")
    bw = _per_gpu(bandwidth, n, "bandwidth")
    perms = np.array(list(permutations(range(n))), dtype=np.intp)  # (n!, n), row = gpu_of_pair
    token_s = cost.token_bytes / bw[perms]  # seconds per token on the GPU of each slot
    ffn_s = cost.ffn_s_per_token / speed[perms]
    send_a, recv_a = _loads(a)
    send_b, recv_b = _loads(b)
    comm_b = np.maximum(send_b, recv_b)
    n_a = np.max(np.maximum(send_a, recv_a) * token_s, axis=1)
    ffn_a = np.max(a.sum(axis=0) * ffn_s, axis=1)
    processed_b = b.sum(axis=0)
    gate, agg = cost.gate_s / speed.min(), cost.agg_s / speed.min()
    best = (np.inf, 0, 0)
    for p, pairing in enumerate(perms):
        n_b = np.max(comm_b[pairing] * token_s, axis=1)
        pair_load = np.maximum(send_a + send_b[pairing], recv_a + recv_b[pairing])
        n_ab = np.max(pair_load * token_s, axis=1)
        ffn_b = np.max(processed_b[pairing] * ffn_s, axis=1)
        times = table2_recurrence(gate, gate, n_a, n_b, n_ab, ffn_a, ffn_b, n_a, n_b, agg, agg)
        g = int(np.argmin(times))
        if times[g] < best[0]:
            best = (float(times[g]), p, g)
    seconds, p, g = best
    return perms[p].copy(), perms[g].copy(), seconds


def _paper_cluster(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(gpu_speed, bandwidth bytes/s) for n GPUs of §8.1's types, as evenly spread as n allows.

    Compute speed is proportional to bandwidth [assume; footnote 2 only orders them]."""
    gbps = np.array([_PAPER_GBPS[g * len(_PAPER_GBPS) // n] for g in range(n)])
    return gbps / _PAPER_GBPS[0], gbps * 1e9 / 8


def _dirichlet_tokens(rng: np.random.Generator, n: int, shard_tokens: int = 100) -> np.ndarray:
    """Top-1 routing of `shard_tokens` per shard under Dirichlet(0.7) expert popularity."""
    popularity = rng.dirichlet(np.full(n, 0.7))
    return rng.multinomial(shard_tokens, popularity, size=n).astype(float)


def heuristic_over_optimum(samples: int = 30, n: int = 5, seed: int = 0) -> tuple[float, float]:
    """(mean, max) over random instances of the §7.2 heuristic's cycle / the brute-force optimum.

    Instances: two models with independent Dirichlet(0.7) popularity, 100 top-1 tokens per shard,
    n GPUs of the paper's 100/80/50/40 Gbps types with compute proportional to bandwidth, and
    `BENCH_COST`. The paper reports 1.07 on average (Fig. 13) on its own, unpublished, inputs.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not 2 <= n <= MAX_BRUTE_FORCE_N:
        raise ValueError(f"n must be in 2..{MAX_BRUTE_FORCE_N} (brute force), got {n}")
    rng = np.random.default_rng(seed)
    speed, bandwidth = _paper_cluster(n)
    ratios = np.empty(samples)
    for s in range(samples):
        a, b = _dirichlet_tokens(rng, n), _dirichlet_tokens(rng, n)
        pairing, gpu_of_pair = colocate_heterogeneous(a, b, BENCH_COST, speed, bandwidth)
        heuristic = colocated_cycle_s(a, b, pairing, gpu_of_pair, BENCH_COST, speed, bandwidth)
        optimum = brute_force_colocation(a, b, BENCH_COST, speed, bandwidth)[2]
        ratios[s] = heuristic / optimum
    return float(ratios.mean()), float(ratios.max())
