"""Predicted seconds of an MoE layer on GPUs: compute from FLOPs, all-to-alls from the network.

Aurora's Eq. 1 with synchronous all-to-alls: every GPU runs its non-MoE block and gate (G) on its
own shard, the dispatch all-to-all (N) moves tokens to their experts, each GPU runs the experts it
hosts on what it received (F), the combine all-to-all (C) brings the outputs back and each GPU
aggregates (A); a phase starts when every GPU has finished the one before, so

    t = max_i G_i + N + max_j F_j + C + max_k A_k.

Compute time is FLOPs (2 per parameter per token, as the Lambda compute model counts them) at the
GPU's peak times the catalogue's `mfu`, plus `kernel_s` per phase (per hosted expert in F). An
all-to-all takes what its order gives: Aurora's contention-free rounds reach the bound of Theorem
4.2 (`gpu.aurora.a2a`); the rank order is timed by the fluid network simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpu.aurora import a2a, fluid
from gpu.cluster import Catalogue, GpuType
from gpu.traffic import Placement, gpu_matrix, processed
from ground.manifest import Manifest

__all__ = ["LayerEstimate", "ModelWork", "estimate_layer"]


@dataclass(frozen=True)
class ModelWork:
    """Per-token FLOPs of each MoE layer's parts and the bytes of one token on the wire."""

    nonmoe_flops: np.ndarray  # (L,) the layer's block and gate
    expert_flops: np.ndarray  # (L, E)
    tail_flops: float
    token_bytes: float  # hidden vector at 2 bytes per value (bf16 on GPUs)
    top_k: int

    @classmethod
    def of(cls, manifest: Manifest) -> ModelWork:
        nonmoe = np.zeros(manifest.num_layers)
        experts = np.zeros((manifest.num_layers, manifest.experts))
        tail = 0.0
        for stage in manifest.stages:
            flops = 2.0 * manifest.params(stage)
            if stage.role == "layer":
                nonmoe[stage.layer] = flops
            elif stage.role == "expert":
                experts[stage.layer, stage.expert] = flops
            elif stage.role == "tail":
                tail = flops
        return cls(nonmoe, experts, tail, 2.0 * manifest.hidden_size, manifest.top_k)


@dataclass(frozen=True)
class LayerEstimate:
    a2a_s: float  # dispatch + combine in the chosen order
    lower_bound_s: float  # Theorem 4.2's bound for both
    rounds: int  # rounds of the dispatch (Aurora), or 0 for an order without rounds
    layer_s: float


def estimate_layer(
    counts: np.ndarray,
    placement: Placement,
    layer: int,
    work: ModelWork,
    types: list[GpuType],
    catalogue: Catalogue,
    order: Literal["aurora", "rank", "bound"],
) -> LayerEstimate:
    """Seconds of MoE layer `layer` for the (gpus, E) pairs `counts` under `placement`.

    `order` "bound" times the all-to-alls at Theorem 4.2's bound, which Aurora's rounds reach,
    without building the rounds (building them for every GPU option of OLMoE's 64 experts
    takes 50 s).
    """
    flops = np.array([t.flops(catalogue.mfu) for t in types])
    bandwidth = np.array([t.bandwidth for t in types])
    matrix = gpu_matrix(counts, placement)
    bound = sum(a2a.lower_bound(m, bandwidth, work.token_bytes) for m in (matrix, matrix.T))
    if order == "bound":
        moved, rounds = bound, 0
    elif order == "aurora":
        dispatch = a2a.schedule(matrix, bandwidth, work.token_bytes)
        combine = a2a.schedule(matrix.T, bandwidth, work.token_bytes)
        moved, rounds = dispatch.makespan_s + combine.makespan_s, len(dispatch.rounds)
    else:
        moved = sum(
            fluid.simulate(fluid.rank_order(m), bandwidth, work.token_bytes)
            for m in (matrix, matrix.T)
        )
        rounds = 0
    shard_tokens = counts.sum(axis=1) / work.top_k  # counts are (token, expert) pairs
    gate = catalogue.kernel_s + shard_tokens * work.nonmoe_flops[layer] / flops
    expert_work = _processed_flops(counts, placement, work.expert_flops[layer])
    hosted = np.array([len(h) for h in placement])
    ffn = catalogue.kernel_s * hosted + expert_work / flops
    aggregate = np.full(len(types), catalogue.kernel_s)
    layer_s = gate.max() + moved + ffn.max() + aggregate.max()
    return LayerEstimate(float(moved), float(bound), rounds, float(layer_s))


def _processed_flops(
    counts: np.ndarray, placement: Placement, expert_flops: np.ndarray
) -> np.ndarray:
    """(gpus,) expert FLOPs each GPU runs: its experts' tokens times each expert's FLOPs."""
    return processed(counts * expert_flops[None, :], placement)
