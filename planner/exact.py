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

One SLO needs far less than the whole curve (`solve_exact`): a partial plan over the first layers
is dropped when even the fastest remaining layers overrun the SLO, or when a Lagrangian lower
bound on what the remaining layers must cost puts it above a feasible plan found beforehand
(`_Bound`). Both tests only remove partial plans that cannot complete to a plan at most as
costly as one already known, so the optimum survives and the solve stays exact; the candidate
sums are filtered before the Pareto sort, which is where the time goes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
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

__all__ = [
    "Frontier",
    "LayerFrontier",
    "layer_frontier",
    "solve_bounded",
    "solve_exact",
    "solve_frontier",
]

SLO_RTOL = 1e-9  # the relative tolerance `evaluate` allows on the SLO
TIE_RTOL = 1e-12  # costs this close are equal: summation order differs between methods
BOUND_RTOL, BOUND_ATOL = 1e-9, 1e-12  # `_Bound` keeps what rounding could put on the optimum


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
    bounded: bool = False  # only the points that can be optimal for one SLO (`solve_exact`)

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return tuple(layer.size for layer in self.layers)

    def min_latency(self) -> float:
        """The smallest SLO any plan meets (inf when no plan is feasible at all)."""
        if self.bounded:  # the fastest plan may have been pruned: it is every layer's fastest
            if any(layer.size == 0 for layer in self.layers):
                return math.inf
            return self.inst.fixed_s() + sum(float(layer.latency_s[0]) for layer in self.layers)
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
            note=(
                f"{'bounded ' if self.bounded else ''}curve of {self.cost_usd.size} points; "
                f"layer frontiers {list(self.layer_sizes)}"
            ),
        )


def solve_frontier(inst: Instance, methods: Iterable[Method] = tuple(Method)) -> Frontier:
    """The whole cost-vs-SLO curve of `inst`, every layer restricted to `methods`."""
    return _build(inst, tuple(methods), slo_s=None, bounded=False)


def solve_bounded(
    inst: Instance, slo_s: float | None, methods: Iterable[Method] = tuple(Method)
) -> Frontier:
    """The part of the curve that can hold the optimum at `slo_s` (`_Bound`); its `best(slo_s)`
    is the optimum and `min_latency()` the smallest feasible SLO, as on the whole curve."""
    return _build(inst, tuple(methods), slo_s=slo_s, bounded=True)


def solve_exact(
    inst: Instance, slo_s: float | None, methods: Iterable[Method] = tuple(Method)
) -> Solution | None:
    """The optimum of (12) for one SLO (None when infeasible), from the curve bounded to it."""
    return solve_bounded(inst, slo_s, methods).best(slo_s)


def _build(
    inst: Instance, methods: tuple[Method, ...], *, slo_s: float | None, bounded: bool
) -> Frontier:
    start = time.perf_counter()
    if not methods:
        raise ValueError("solve_frontier needs at least one scatter-gather method")
    layers = tuple(layer_frontier(inst, layer, methods) for layer in range(inst.layers))
    usd, per_s = global_terms(inst)
    latency, cost = np.array([inst.fixed_s()]), np.array([usd + per_s * inst.fixed_s()])
    bound = _Bound.make(layers, float(latency[0]), float(cost[0]), slo_s) if bounded else None
    if bounded and bound is None:  # not even every layer's fastest point meets the SLO
        latency, cost = latency[:0], cost[:0]
    previous, pick, sizes = [], [], []
    for index, layer in enumerate(layers):
        keep = None if bound is None else bound.keeper(index)
        before, added = _merge(latency, cost, layer.latency_s, layer.cost_usd, keep)
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
        bounded=bounded,
    )


@dataclass(frozen=True)
class _Bound:
    """What lets one SLO's solve drop partial plans that cannot beat a known plan, exactly.

    For the layers after layer l, `rest_latency[l]` is the least latency they can add and
    `rest_dual[l]` the least of (cost + lam * latency) they can add. By weak duality, layers that
    get a latency budget B cost at least rest_dual[l] - lam * B for any lam >= 0. A partial plan
    (t, c) over layers <= l is kept only if t + rest_latency[l] meets the SLO and
    c + rest_dual[l] - lam * (SLO - t) does not exceed `upper`, the cost of a feasible plan.
    lam is the multiplier at which the per-layer minimisers of cost + lam * latency first meet
    the SLO (found by bisection), whose plan gives `upper`; without an SLO, lam = 0.
    """

    slo_s: float  # inf without an SLO
    lam: float
    upper: float
    rest_latency: np.ndarray  # (L,)
    rest_dual: np.ndarray  # (L,)

    @classmethod
    def make(
        cls,
        layers: tuple[LayerFrontier, ...],
        base_latency: float,
        base_cost: float,
        slo_s: float | None,
    ) -> _Bound | None:
        """The bound for `slo_s`, or None when no plan meets it."""
        if any(layer.size == 0 for layer in layers):
            return None
        slo = math.inf if slo_s is None else slo_s * (1 + SLO_RTOL)

        def minimisers(lam: float) -> list[int]:  # each layer's point minimising c + lam*t
            return [int(np.argmin(f.cost_usd + lam * f.latency_s)) for f in layers]

        def latency(chosen: list[int]) -> float:
            return _totals(layers, chosen, base_latency, base_cost)[0]

        fastest = [0] * len(layers)
        if latency(fastest) > slo:
            return None
        lam, chosen = 0.0, minimisers(0.0)
        if latency(chosen) > slo:
            low, high = 0.0, 1.0
            while latency(minimisers(high)) > slo and high < 1e15:
                low, high = high, high * 16
            for _ in range(64):
                middle = (low + high) / 2
                low, high = (low, middle) if latency(minimisers(middle)) <= slo else (middle, high)
            lam, chosen = high, minimisers(high)
            if latency(chosen) > slo:  # lam so large that sums round: start from the fastest
                chosen = fastest
        upper = _spend_slack(layers, chosen, base_latency, base_cost, slo)
        dual = np.array([float(np.min(f.cost_usd + lam * f.latency_s)) for f in layers])
        least = np.array([float(f.latency_s[0]) for f in layers])

        def after(values: np.ndarray) -> np.ndarray:  # sum over the layers after each one
            return np.r_[np.cumsum(values[::-1])[::-1][1:], 0.0]

        return cls(slo, lam, upper, after(least), after(dual))

    def keeper(self, layer: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """The test of partial plans over layers <= `layer` (latency, cost) -> keep mask."""
        rest_latency, rest_dual = self.rest_latency[layer], self.rest_dual[layer]
        slack = BOUND_ATOL + abs(self.upper) * BOUND_RTOL

        def keep(latency: np.ndarray, cost: np.ndarray) -> np.ndarray:
            fits = latency + rest_latency <= self.slo_s + BOUND_ATOL
            if self.lam == 0.0:
                return fits & (cost + rest_dual <= self.upper + slack)
            least = cost + rest_dual - self.lam * (self.slo_s - latency)
            return fits & (least <= self.upper + slack)

        return keep


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


def _totals(
    layers: tuple[LayerFrontier, ...], chosen: list[int], base_latency: float, base_cost: float
) -> tuple[float, float]:
    """(latency, cost) of the plan taking point chosen[l] of every layer l."""
    latency = base_latency + sum(
        float(f.latency_s[i]) for f, i in zip(layers, chosen, strict=True)
    )
    cost = base_cost + sum(float(f.cost_usd[i]) for f, i in zip(layers, chosen, strict=True))
    return latency, cost


def _spend_slack(
    layers: tuple[LayerFrontier, ...],
    chosen: list[int],
    base_latency: float,
    base_cost: float,
    slo: float,
) -> float:
    """Cost of a feasible plan improved greedily: while some layer can move to a cheaper point
    within the SLO's slack, move the one that saves most. A tighter `upper` prunes more."""
    chosen = list(chosen)
    while True:
        latency, cost = _totals(layers, chosen, base_latency, base_cost)
        slack = slo - latency
        best_saving, best_move = 0.0, None
        for index, (frontier, point) in enumerate(zip(layers, chosen, strict=True)):
            fits = frontier.latency_s <= frontier.latency_s[point] + slack
            candidate = int(np.flatnonzero(fits)[-1])  # cost descends: the slowest that fits
            saving = float(frontier.cost_usd[point] - frontier.cost_usd[candidate])
            if saving > best_saving:
                best_saving, best_move = saving, (index, candidate)
        if best_move is None:
            return cost
        chosen[best_move[0]] = best_move[1]


def _merge(
    latency: np.ndarray,
    cost: np.ndarray,
    layer_latency_s: np.ndarray,
    layer_cost: np.ndarray,
    keep: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One knapsack step: Minkowski sum of the curve and a layer frontier, Pareto-pruned.

    Returns, for each surviving point, the curve point and the layer point it adds. The sums are
    laid out layer point by layer point, so the sort meets long ascending runs of the curve.
    `keep` filters the sums before the sort (a `_Bound`): the sort is the expensive part.
    """
    total_latency = (layer_latency_s[:, None] + latency[None, :]).ravel()
    total_cost = (layer_cost[:, None] + cost[None, :]).ravel()
    if keep is None:
        chosen = _pareto(total_latency, total_cost)
    else:
        candidates = np.flatnonzero(keep(total_latency, total_cost))
        chosen = candidates[_pareto(total_latency[candidates], total_cost[candidates])]
    added, before = np.divmod(chosen, max(latency.size, 1))
    return before, added
