"""Expert packing: several experts of one layer hosted by one function.

One function per expert stops at real models: OLMoE's 16 x 64 experts are 1,024 functions and
roles (CloudFormation takes 500 resources per stack), and with more than 40 experts a layer's
inline Map cannot start them all. A packed function holds its experts' weights resident and
serves, per invocation, a shard of all their rows (`ground.semantics`), so to the cost model it
is one "expert" whose tokens and weights are its members' sums: `pack` turns an instance into
the instance of its functions, and every solver plans that unchanged.

What is exact and what is heuristic: for a given grouping, the solvers are as exact as for an
unpacked plan. The grouping is a heuristic: groups of one size per plan, experts dealt to the
group with the fewest tokens, heaviest first (LPT), so a layer's functions carry near-equal
loads and none needs more replicas than the others. `brute_force_groups` enumerates every
grouping of a small layer to measure the heuristic's gap: over 48 small random layers (6 or 8
experts in groups of 2, 3 or 4) its plan costs 1.010x the best grouping's on average, 1.075x at
worst (tests/planner/test_packing.py). `plan --pack auto` plans every group
size that divides the experts, one (unpacked) included, and keeps the cheapest: never worse than
one expert per function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from planner.instance import Instance, default_betas

__all__ = [
    "balanced_groups",
    "brute_force_groups",
    "function_counts",
    "group_sizes",
    "pack",
    "unpacked",
]


def group_sizes(experts: int) -> list[int]:
    """Experts per function to try: every divisor of the layer's experts, 1 (unpacked) first."""
    return [k for k in range(1, experts + 1) if experts % k == 0]


def balanced_groups(counts: np.ndarray, size: int) -> np.ndarray:
    """(L, E / size, size) expert ids, ascending in each group: per layer, experts by predicted
    tokens, heaviest first, each to the group with the fewest tokens that still has room (LPT).

    Ties go to the lower group and, among experts, the lower id, so the grouping is
    deterministic. `counts` is (L, E); `size` must divide E.
    """
    counts = np.asarray(counts, dtype=float)
    layers, experts = counts.shape
    if size < 1 or experts % size:
        raise ValueError(f"{size} experts per function do not divide {experts} experts")
    functions = experts // size
    groups = np.empty((layers, functions, size), dtype=np.int64)
    for layer in range(layers):
        load = np.zeros(functions)
        filled = np.zeros(functions, dtype=int)
        for expert in np.argsort(-counts[layer], kind="stable"):
            open_ = np.flatnonzero(filled < size)
            slot = open_[np.argmin(load[open_])]
            groups[layer, slot, filled[slot]] = expert
            filled[slot] += 1
            load[slot] += counts[layer, expert]
        groups[layer].sort(axis=1)
    return groups


def pack(inst: Instance, groups: np.ndarray) -> Instance:
    """The instance of the functions `groups` (L, F, k) makes of `inst`'s experts.

    A function's tokens and weights are its members' sums; the memory, compute per token and
    prices are the expert's (every row is one token through one expert). Pipeline degrees
    follow the larger shards when `inst` used the default candidates.
    """
    groups = np.asarray(groups, dtype=np.int64)
    if groups.ndim != 3 or groups.shape[0] != inst.layers:
        raise ValueError(f"groups of shape {groups.shape} do not fit {inst.layers} layers")
    counts = function_counts(groups, inst.counts)
    betas = () if inst.betas == default_betas(inst.counts) else inst.betas
    return dataclasses.replace(
        inst,
        counts=counts,
        expert_bytes=function_counts(groups, inst.expert_bytes),
        betas=betas,
        hosted=int(groups.shape[2]),
        groups=groups,
        source=inst,
    )


def function_counts(groups: np.ndarray, per_expert: np.ndarray) -> np.ndarray:
    """(L, F) sums over each function's experts of a per-expert (L, E) array."""
    rows = np.arange(groups.shape[0])[:, None, None]
    return np.asarray(per_expert, dtype=float)[rows, groups].sum(axis=2)


def unpacked(inst: Instance) -> Instance:
    """The per-expert instance a packed one was made from (`inst` itself if not packed)."""
    return inst if inst.source is None else inst.source


def _partitions(items: list[int], size: int) -> Iterator[list[list[int]]]:
    """Every split of `items` into groups of `size`, each group and the list in one order."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in _choose(rest, size - 1):
        remaining = [x for x in rest if x not in others]
        for tail in _partitions(remaining, size):
            yield [[first, *others], *tail]


def _choose(items: list[int], k: int) -> Iterator[list[int]]:
    if k == 0:
        yield []
        return
    for i in range(len(items) - k + 1):
        for tail in _choose(items[i + 1 :], k - 1):
            yield [items[i], *tail]


def brute_force_groups(experts: int, size: int) -> Iterator[np.ndarray]:
    """Every grouping of one layer's `experts` into functions of `size`: (F, size) arrays.

    (E-1)!! groupings for pairs: 10,395 for 12 experts; meant for small layers.
    """
    for partition in _partitions(list(range(experts)), size):
        yield np.array(partition, dtype=np.int64)
