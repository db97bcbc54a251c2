"""The exact solver of problem (12): per-layer Pareto frontiers merged by a knapsack (§7 [beyond]).

Why this is exact. Fix a layer's method and pipeline degree beta: its experts then interact only
through the layer's slowest expert, whose finish is the layer's latency, and the layer's own
terms (`layer_terms`: a constant and a cost per second of latency) grow with that latency. So for
every threshold tau on the finish time, giving each expert its cheapest feasible option within
it dominates every other choice with the same maximum; enumerating the distinct finish values as
thresholds therefore yields every cost-vs-latency Pareto point of the layer. Layers interact only
through the sum of their latencies in the SLO (12d), so the global problem is a multiple-choice
knapsack over the layer frontiers, solved exactly by adding the frontiers one layer at a time
(Minkowski sum) and pruning dominated points after each step. The result is the whole cost-vs-SLO
curve, from which any SLO's optimum is read off; optimal means optimal over the instance's
decision space (the given methods, `inst.betas`, memory options and 1..G replicas).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from planner.costmodel import (
    Choice,
    Options,
    Solution,
    evaluate,
    expert_options,
    global_terms,
    layer_terms,
)
from planner.instance import Instance, Method

__all__ = ["Frontier", "LayerFrontier", "layer_frontier", "solve_exact", "solve_frontier"]

SLO_RTOL = 1e-9  # the relative tolerance `evaluate` allows on the SLO
TIE_RTOL = 1e-12  # costs this close are equal: summation order differs between methods


@dataclass(frozen=True, eq=False)
class LayerFrontier:
    """The Pareto-optimal (latency, cost) points of one layer and the decision behind each.

    Sorted by latency ascending; cost is then strictly descending.
    """

    latency_s: np.ndarray  # (P,) t^lat_e
    cost_usd: np.ndarray  # (P,) the layer's cost: its experts' plus `layer_terms`
    method: np.ndarray  # (P,) Method values
    beta: np.ndarray  # (P,) beta for pipelined points, 1 otherwise
    memory: np.ndarray  # (P, E) index into memory_mb
    replicas: np.ndarray  # (P, E) 1..G

    @property
    def size(self) -> int:
        return int(self.cost_usd.size)


@dataclass(frozen=True, eq=False)
class Frontier:
    """The merged cost-vs-SLO curve of a whole instance, with back-pointers to each layer's point.

    `latency_s` includes `inst.fixed_s()` and ascends; `cost_usd` strictly descends, so the
    cheapest plan within an SLO is the last curve point whose latency is within it.
    `previous[l][p]` is the point of the curve over layers < l that point p (over layers <= l)
    extends, and `pick[l][p]` the point of layer l's frontier it adds.
    """

    inst: Instance
    latency_s: np.ndarray
    cost_usd: np.ndarray
    layers: tuple[LayerFrontier, ...]
    previous: tuple[np.ndarray, ...]
    pick: tuple[np.ndarray, ...]
    merged_sizes: tuple[int, ...]  # curve size after merging layers 0..l, for l = 0..L-1
    seconds: float  # wall time to build the curve

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return tuple(layer.size for layer in self.layers)

    def min_latency(self) -> float:
        """The smallest SLO any plan meets (inf when no plan is feasible at all)."""
        return float(self.latency_s[0]) if self.latency_s.size else math.inf

    def points(self) -> list[tuple[float, float]]:
        """(latency_s, cost_usd) of every curve point: the cheapest cost for SLOs from there on."""
        return [(float(t), float(c)) for t, c in zip(self.latency_s, self.cost_usd, strict=True)]

    def choice(self, point: int) -> Choice:
        """Follow the back-pointers of curve point `point` to the decision of every layer."""
        picks = []
        for previous, pick in zip(reversed(self.previous), reversed(self.pick), strict=True):
            picks.append(int(pick[point]))
            point = int(previous[point])
        picks.reverse()
        chosen = list(zip(self.layers, picks, strict=True))

        def column(name: str) -> np.ndarray:
            return np.array([getattr(layer, name)[p] for layer, p in chosen], dtype=int)

        experts = self.inst.experts
        return Choice(
            method=column("method"),
            beta=column("beta"),
            memory=column("memory").reshape(-1, experts),
            replicas=column("replicas").reshape(-1, experts),
        )

    def best(self, slo_s: float | None) -> Solution | None:
        """The cheapest plan meeting `slo_s` (None: the cheapest plan at any latency).

        None when no plan meets it. `seconds` counts building the curve and this look-up.
        """
        start = time.perf_counter()
        if slo_s is None:
            point = self.cost_usd.size - 1
        else:
            point = int(np.searchsorted(self.latency_s, slo_s * (1 + SLO_RTOL), side="right")) - 1
        if point < 0:
            return None
        choice = self.choice(point)
        evaluation = evaluate(self.inst, choice, slo_s)
        return Solution(
            solver="exact",
            choice=choice,
            evaluation=evaluation,
            seconds=self.seconds + time.perf_counter() - start,
            optimal=True,
            note=f"curve of {self.cost_usd.size} points; layer frontiers {list(self.layer_sizes)}",
        )


def solve_frontier(inst: Instance, methods: Iterable[Method] = tuple(Method)) -> Frontier:
    """The whole cost-vs-SLO curve of `inst`, every layer restricted to `methods`."""
    start = time.perf_counter()
    methods = tuple(methods)
    if not methods:
        raise ValueError("solve_frontier needs at least one scatter-gather method")
    layers = tuple(layer_frontier(inst, layer, methods) for layer in range(inst.layers))
    usd, per_s = global_terms(inst)
    latency, cost = np.array([inst.fixed_s()]), np.array([usd + per_s * inst.fixed_s()])
    previous, pick, sizes = [], [], []
    for layer in layers:
        before, added = _merge(latency, cost, layer.latency_s, layer.cost_usd)
        latency = latency[before] + layer.latency_s[added]
        cost = cost[before] + layer.cost_usd[added]
        previous.append(before)
        pick.append(added)
        sizes.append(int(cost.size))
    return Frontier(
        inst=inst,
        latency_s=latency,
        cost_usd=cost,
        layers=layers,
        previous=tuple(previous),
        pick=tuple(pick),
        merged_sizes=tuple(sizes),
        seconds=time.perf_counter() - start,
    )


def solve_exact(
    inst: Instance, slo_s: float | None, methods: Iterable[Method] = tuple(Method)
) -> Solution | None:
    """The optimum of (12) for one SLO (None when infeasible), by building the whole curve."""
    return solve_frontier(inst, methods).best(slo_s)


def layer_frontier(inst: Instance, layer: int, methods: tuple[Method, ...]) -> LayerFrontier:
    """Pareto frontier of one layer over every (method, beta) pair and every expert option."""
    parts = []
    # Pipelined with beta >= r costs what plain S3 costs; listing S3 and direct first makes such
    # ties go to the method with fewer S3 requests.
    for method in sorted(methods, key=lambda m: m is Method.PIPELINED):
        usd, per_s = layer_terms(inst, layer, method)
        for beta in inst.betas if method is Method.PIPELINED else (1,):
            latency, cost, option = _points(inst, expert_options(inst, layer, method, beta))
            parts.append((latency, cost + usd + per_s * latency, option, int(method), beta))
    latency = np.concatenate([p[0] for p in parts])
    cost = np.concatenate([p[1] for p in parts])
    option = np.concatenate([p[2] for p in parts]).reshape(-1, inst.experts)
    method = np.concatenate([np.full(p[1].size, p[3]) for p in parts])
    beta = np.concatenate([np.full(p[1].size, p[4]) for p in parts])
    keep = _pareto(latency, cost)
    g = inst.max_replicas
    return LayerFrontier(
        latency[keep],
        cost[keep],
        method[keep],
        beta[keep],
        option[keep] // g,
        option[keep] % g + 1,
    )


def _flat(opts: Options) -> tuple[np.ndarray, np.ndarray]:
    """(E, K) cost and finish over the options k = j * G + (g - 1).

    Infeasible options get an infinite finish, so no threshold ever admits them.
    """
    experts = opts.cost.shape[0]
    finish = np.where(opts.feasible, opts.finish, np.inf).reshape(experts, -1)
    return opts.cost.reshape(experts, -1), finish


def _points(inst: Instance, opts: Options) -> tuple[np.ndarray, ...]:
    """Candidate points of one (method, beta): one per finish threshold (latency, cost, options).

    The layer's latency is its slowest expert's finish, so each threshold admits every expert's
    cheapest option finishing within it.
    """
    cost, finish = _flat(opts)
    option, total, finish_max = _cheapest_within(cost, finish)
    keep = _pareto(finish_max, total)
    return finish_max[keep], total[keep], option[keep]


def _cheapest_within(cost: np.ndarray, finish: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each threshold tau among the finite finish values, each expert's cheapest option within.

    Vectorised: per expert, options sorted by finish with a running minimum of cost (ties go to
    the earlier option, so to the smaller finish, memory, replicas); the number of options of each
    expert within each tau is a cumulative histogram of the options' ranks among the thresholds.
    Returns option (T, E) indices into K, total cost (T,) and the chosen options' largest finish
    (T,), for the thresholds where every expert has an option.
    """
    experts, k = cost.shape
    order = np.argsort(finish, axis=1, kind="stable")
    finish = np.take_along_axis(finish, order, axis=1)
    cost = np.take_along_axis(cost, order, axis=1)
    improves = np.ones(cost.shape, dtype=bool)
    improves[:, 1:] = cost[:, 1:] < np.minimum.accumulate(cost, axis=1)[:, :-1]
    cheapest = np.maximum.accumulate(np.where(improves, np.arange(k), 0), axis=1)
    values, rank = np.unique(finish, return_inverse=True)  # infinite finish ranks last
    bins = (rank.reshape(experts, k) + values.size * np.arange(experts)[:, None]).ravel()
    counts = np.bincount(bins, minlength=experts * values.size).reshape(experts, values.size)
    within = np.cumsum(counts, axis=1)[:, : np.isfinite(values).sum()]  # (E, T) finish <= tau
    within = within[:, (within > 0).all(axis=0)]
    rows = np.arange(experts)[:, None]
    position = cheapest[rows, within - 1]
    option = order[rows, position].T
    total = cost[rows, position].sum(axis=0)
    return option, total, finish[rows, position].max(axis=0, initial=0.0)


def _pareto(latency: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, by latency ascending (cost strictly descending).

    A point is dropped when an earlier one (in latency to the nanosecond, then cost, then index
    order) costs no more, up to rounding (TIE_RTOL): equal points keep the first, so the result is
    deterministic and a tie between methods goes to the one listed first.
    """
    scale = float(np.abs(cost).max(initial=0.0)) or 1.0
    order = np.lexsort((np.round(cost / scale, 12), np.round(latency, 9)))  # ns, 1e-12 of max
    cost = cost[order]
    keep = np.ones(cost.size, dtype=bool)
    keep[1:] = cost[1:] < np.minimum.accumulate(cost)[:-1] * (1 - TIE_RTOL)
    return order[keep]


def _merge(
    latency: np.ndarray, cost: np.ndarray, layer_latency_s: np.ndarray, layer_cost: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One knapsack step: Minkowski sum of the curve and a layer frontier, Pareto-pruned.

    Returns, for each surviving point, the curve point and the layer point it adds. The sums are
    laid out layer point by layer point, so the sort meets long ascending runs of the curve.
    """
    total_latency = (layer_latency_s[:, None] + latency[None, :]).ravel()
    total_cost = (layer_cost[:, None] + cost[None, :]).ravel()
    added, before = np.divmod(_pareto(total_latency, total_cost), latency.size)
    return before, added
