"""Who sends how many tokens to whom in each MoE layer, from a real routing trace.

On a GPU cluster the batch is split data-parallel: each GPU holds whole requests (windows, since
attention needs them) and sends every (token, chosen expert) pair to a GPU hosting that expert.
`shard_counts` gives, per layer, the (GPUs x experts) matrix of such pairs; a placement (per GPU
the experts it hosts and the share of each expert's tokens it takes) turns it into the GPU-to-GPU
matrix of the all-to-all (`gpu_matrix`) and each GPU's expert work (`processed`).
"""

from __future__ import annotations

import numpy as np

from predictor import RoutingTrace

__all__ = ["Placement", "placement_matrix", "gpu_matrix", "processed", "shard_counts"]

Placement = list[list[tuple[int, float]]]  # per GPU rank: (expert, share of its tokens)


def shard_counts(trace: RoutingTrace, gpus: int) -> np.ndarray:
    """(L, gpus, E) (token, expert) pairs each data-parallel shard routes to each expert.

    Windows go to shards in contiguous blocks of (nearly) equal numbers of windows.
    """
    windows, inverse = np.unique(trace.window_ids, return_inverse=True)
    if windows.size < gpus:
        raise ValueError(
            f"the trace holds {windows.size} requests (windows), fewer than {gpus} GPUs: every "
            "GPU needs at least one"
        )
    shard = inverse * gpus // windows.size  # (N,) contiguous blocks of windows
    layers, _, k = trace.experts.shape
    e = trace.num_experts
    flat = (shard[None, :, None] * e + trace.experts.astype(np.int64)).reshape(layers, -1)
    offsets = np.arange(layers)[:, None] * gpus * e
    counts = np.bincount((flat + offsets).ravel(), minlength=layers * gpus * e)
    return counts.reshape(layers, gpus, e).astype(float)


def placement_matrix(placement: Placement, experts: int) -> np.ndarray:
    """(E, gpus) share of each expert's tokens each GPU takes (columns of a placement)."""
    share = np.zeros((experts, len(placement)))
    for rank, hosted in enumerate(placement):
        for expert, part in hosted:
            share[expert, rank] += part
    return share


def gpu_matrix(counts: np.ndarray, placement: Placement) -> np.ndarray:
    """(gpus, gpus) tokens GPU s sends GPU g in the dispatch all-to-all (the diagonal stays
    local); the combine all-to-all is its transpose. Replicas split tokens by their shares."""
    return counts @ placement_matrix(placement, counts.shape[1])


def processed(counts: np.ndarray, placement: Placement) -> np.ndarray:
    """(gpus,) tokens each GPU's experts process, local ones included."""
    return gpu_matrix(counts, placement).sum(axis=0)
