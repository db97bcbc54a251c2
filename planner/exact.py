"""The exact solver of problem (12): per-layer Pareto frontiers merged by a knapsack (§7 [beyond]).

Why this is exact. Fix a layer's method and pipeline degree beta: its experts then interact only
through the layer's slowest expert, whose finish is the layer's latency, and the layer's own
terms (`layer_terms`: a constant and a cost per second of latency) grow with that latency. So for
every threshold tau on the finish time, giving each expert its cheapest feasible option within
it dominates every other choice with the same maximum; the thresholds that give distinct points
are the steps of the experts' cost-vs-finish staircases, so enumerating them yields every
cost-vs-latency Pareto point of the layer. Layers interact only through the sum of their
latencies in the SLO (12d), so the global problem is a multiple-choice knapsack over the layer
frontiers, solved exactly by adding the frontiers one layer at a time (Minkowski sum) and
pruning dominated points after each step. The result is the whole cost-vs-SLO
curve, from which any SLO's optimum is read off; optimal means optimal over the instance's
decision space (the given methods, `inst.betas`, memory options and 1..G replicas).

One SLO needs far less than the whole curve (`solve_exact`): each layer's frontier stops at the
latency the other layers' fastest points leave it, and a partial plan over the first layers is
dropped when the lower convex hull of the remaining layers' curves (for its latency budget, the
best Lagrangian bound) puts it above a feasible plan found beforehand (`_Bound`). Both tests only
remove what cannot complete to a plan at most as costly as one already known, so the optimum
survives and the solve stays exact; the candidate sums are filtered before the Pareto sort.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from planner.costmodel import (
    Choice,
    Solution,
    evaluate,
    global_terms,
    layer_terms,
    option_grid,
)
from planner.instance import Instance, Method

__all__ = [
    "Frontier",
    "LayerFrontier",
    "layer_frontier",
    "hull_sum",
    "lower_hull",
    "pareto_points",
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
    parts = [_LayerParts.make(inst, layer, methods) for layer in range(inst.layers)]
    caps = [math.inf] * len(parts)
    if bounded and slo_s is not None:
        # Exact: every other layer adds at least its least latency, so within the SLO this
        # layer cannot take longer than what those leave it. Not when nothing fits: the curve
        # then still reports the smallest feasible SLO.
        fastest = np.array([p.fastest() for p in parts])
        slack = slo_s * (1 + SLO_RTOL) - inst.fixed_s() - float(fastest.sum())
        if slack >= 0:
            caps = list(fastest + slack + BOUND_ATOL)
    layers = tuple(p.frontier(inst, cap) for p, cap in zip(parts, caps, strict=True))
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

    `rest[l]` is the lower convex hull of the cost-vs-latency curve of the layers after layer l,
    as (latency, cost) vertices: given a latency budget B those layers cost at least its value
    at B (the convex relaxation of their knapsack: the hull of a Minkowski sum is the sum of the
    hulls), and no plan at all when B is below its first vertex. A partial plan (t, c) over
    layers <= l is kept only if c + rest[l](SLO - t) does not exceed `upper`, the cost of a
    feasible plan: the plan of the per-layer minimisers of cost + lam * latency at the least
    lam whose plan meets the SLO (found by bisection), improved greedily (`_spend_slack`).
    """

    slo_s: float  # inf without an SLO
    upper: float
    rest: tuple[tuple[np.ndarray, np.ndarray], ...]  # (L,) hull vertices (latency, cost)

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
        chosen = minimisers(0.0)
        if latency(chosen) > slo:
            low, high = 0.0, 1.0
            while latency(minimisers(high)) > slo and high < 1e15:
                low, high = high, high * 16
            for _ in range(64):
                middle = (low + high) / 2
                low, high = (low, middle) if latency(minimisers(middle)) <= slo else (middle, high)
            chosen = minimisers(high)
            if latency(chosen) > slo:  # lam so large that sums round: start from the fastest
                chosen = fastest
        upper = _spend_slack(layers, chosen, base_latency, base_cost, slo)
        hulls = [lower_hull(f.latency_s, f.cost_usd) for f in layers]
        rest = tuple(hull_sum(hulls[index + 1 :]) for index in range(len(layers)))
        return cls(slo, upper, rest)

    def keeper(self, layer: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """The test of partial plans over layers <= `layer` (latency, cost) -> keep mask."""
        hull_latency, hull_cost = self.rest[layer]
        slack = BOUND_ATOL + abs(self.upper) * BOUND_RTOL

        def keep(latency: np.ndarray, cost: np.ndarray) -> np.ndarray:
            budget = self.slo_s + BOUND_ATOL - latency
            least = cost + np.interp(budget, hull_latency, hull_cost, left=np.inf)
            return least <= self.upper + slack

        return keep


def lower_hull(latency: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the lower convex hull of a Pareto curve (latency ascending, cost descending).

    Drops, all at once and until none is left, every point on or above the chord between its
    neighbours: such a point lies above the hull, so each round is safe, and what stays is convex.
    """
    x, y = latency, cost
    while x.size > 2:
        dx0, dy0 = x[1:-1] - x[:-2], y[1:-1] - y[:-2]
        dx1, dy1 = x[2:] - x[:-2], y[2:] - y[:-2]
        above = dx1 * dy0 - dy1 * dx0 >= 0  # the middle point is not below the chord
        if not above.any():
            break
        stay = np.r_[True, ~above, True]
        x, y = x[stay], y[stay]
    return x, y


def hull_sum(hulls: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of the Minkowski sum of hulls: their edges in order of slope."""
    if not hulls:
        return np.zeros(1), np.zeros(1)
    dx = np.concatenate([np.diff(x) for x, _ in hulls])
    dy = np.concatenate([np.diff(y) for _, y in hulls])
    order = np.argsort(dy / dx, kind="stable")
    x0, y0 = sum(float(x[0]) for x, _ in hulls), sum(float(y[0]) for _, y in hulls)
    return np.r_[x0, x0 + np.cumsum(dx[order])], np.r_[y0, y0 + np.cumsum(dy[order])]


def layer_frontier(inst: Instance, layer: int, methods: tuple[Method, ...]) -> LayerFrontier:
    """Pareto frontier of one layer over every (method, beta) pair and every expert option."""
    return _LayerParts.make(inst, layer, methods).frontier(inst)


@dataclass(frozen=True)
class _LayerParts:
    """Every expert option of one layer under every part, a (method, beta) pair: (P, E, K) cost
    and finish over k = j * G + (g - 1), and per part its method, beta and `layer_terms`."""

    cost: np.ndarray
    finish: np.ndarray  # infinite where infeasible, so no threshold ever admits the option
    method: np.ndarray  # (P,)
    beta: np.ndarray  # (P,)
    usd: np.ndarray  # (P,)
    per_s: np.ndarray  # (P,)

    @classmethod
    def make(cls, inst: Instance, layer: int, methods: tuple[Method, ...]) -> _LayerParts:
        costs, finishes, method_of, beta_of, usd, per_s = [], [], [], [], [], []
        # Pipelined with beta >= r costs what plain S3 costs; listing S3 and direct first makes
        # such ties go to the method with fewer S3 requests.
        for method in sorted(methods, key=lambda m: m is Method.PIPELINED):
            betas = np.asarray(inst.betas if method is Method.PIPELINED else (1,), dtype=int)
            # Every beta from the largest token count on gives one replica's tokens as one
            # minibatch (any g): the first such stands for the rest, as a tie would pick it.
            whole = np.flatnonzero(betas >= np.ceil(inst.counts[layer]).max())
            if whole.size:
                betas = betas[: whole[0] + 1]
            cost, finish, feasible = option_grid(inst, layer, method, betas)
            costs.append(cost)
            finishes.append(np.where(feasible, finish, np.inf))
            method_of.append(np.full(betas.size, int(method)))
            beta_of.append(betas)
            terms = layer_terms(inst, layer, method)
            usd.append(np.full(betas.size, terms[0]))
            per_s.append(np.full(betas.size, terms[1]))
        shape = (-1, inst.experts, inst.memory_mb.size * inst.max_replicas)
        return cls(
            np.concatenate(costs).reshape(shape),
            np.concatenate(finishes).reshape(shape),
            np.concatenate(method_of),
            np.concatenate(beta_of),
            np.concatenate(usd),
            np.concatenate(per_s),
        )

    def fastest(self) -> float:
        """The layer's least latency (inf when no part has a feasible option for every expert)."""
        return float(self.finish.min(axis=2).max(axis=1).min())

    def frontier(self, inst: Instance, cap_s: float = math.inf) -> LayerFrontier:
        """The Pareto points with latency at most `cap_s` (what an SLO leaves this layer)."""
        finish = np.where(self.finish <= cap_s, self.finish, np.inf)
        part, option, cost, latency = _cheapest_within(self.cost, finish)
        cost = cost + self.usd[part] + self.per_s[part] * latency
        keep = pareto_points(latency, cost)
        g = inst.max_replicas
        return LayerFrontier(
            latency[keep],
            cost[keep],
            self.method[part[keep]],
            self.beta[part[keep]],
            option[keep] // g,
            option[keep] % g + 1,
        )


def _cheapest_within(cost: np.ndarray, finish: np.ndarray) -> tuple[np.ndarray, ...]:
    """Candidate points of every part (a method and beta): one per finish threshold tau, each
    expert taking its cheapest option finishing within tau.

    `cost` and `finish` are (P, E, K). Per expert, options sorted by finish with a running
    minimum of cost form a staircase whose steps are the options cheaper than every faster one
    (ties go to the earlier option, so to the smaller finish, memory, replicas). The layer's
    latency at tau is its slowest chosen finish, itself a step, so the steps' finishes are the
    only thresholds that give distinct points; at each, an expert's choice is its last step
    within it, read for all (threshold, expert) pairs from a table of steps by threshold rank
    filled forward. Returns part (N,), option (N, E) indices into K, total
    cost (N,) and latency (N,), for the thresholds where every expert has an option, by part
    and then latency.
    """
    parts, experts, k = cost.shape
    order = np.argsort(finish, axis=2, kind="stable")
    finish = np.take_along_axis(finish, order, axis=2).reshape(-1, k)
    cost = np.take_along_axis(cost, order, axis=2).reshape(-1, k)
    steps = np.ones(cost.shape, dtype=bool)
    steps[:, 1:] = cost[:, 1:] < np.minimum.accumulate(cost, axis=1)[:, :-1]
    group, position = np.nonzero(steps & np.isfinite(finish))  # by group = part * E + expert
    step_finish = finish[group, position]
    step_part = group // experts
    # Thresholds: the distinct (part, finish) pairs, numbered in (part, finish) order.
    by_value = np.lexsort((step_finish, step_part))
    new = np.ones(by_value.size, dtype=bool)
    new[1:] = (np.diff(step_part[by_value]) != 0) | (np.diff(step_finish[by_value]) != 0)
    rank = np.empty(by_value.size, dtype=np.int64)
    rank[by_value] = np.cumsum(new) - 1
    tau_part, tau = step_part[by_value][new], step_finish[by_value][new]
    first = np.searchsorted(tau_part, np.arange(parts))  # each part's first threshold
    local = rank - first[step_part]
    # table[group, t]: the group's last step within its part's t-th threshold (-1: none yet).
    # Steps ascend in finish within a group; of two at one finish the later is cheaper.
    last = np.ones(group.size, dtype=bool)
    last[:-1] = (group[1:] != group[:-1]) | (local[1:] != local[:-1])
    width = int(np.diff(np.r_[first, tau.size]).max(initial=0))
    table = np.full((parts * experts, max(width, 1)), -1, dtype=np.int64)
    table[group[last], local[last]] = np.flatnonzero(last)
    table = np.maximum.accumulate(table, axis=1)
    rows = tau_part[:, None] * experts + np.arange(experts)
    found = table[rows, (np.arange(tau.size) - first[tau_part])[:, None]]  # (T, E)
    valid = (found >= 0).all(axis=1)  # every expert has an option within tau
    found = found[valid]
    chosen_group, chosen_position = group[found], position[found]
    option = order.reshape(-1, k)[chosen_group, chosen_position]
    total = cost[chosen_group, chosen_position].sum(axis=1)
    return tau_part[valid], option, total, tau[valid]


def pareto_points(latency: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, by latency ascending (cost strictly descending).

    Latencies equal to the nanosecond form a group, represented by its cheapest point (cost to
    1e-12 of the largest, TIE_RTOL), the first such in index order; a group's point is kept when
    it costs less, up to rounding, than every point of a faster group. Equal points keep the
    first, so the result is deterministic and a tie between methods goes to the one listed
    first. One stable sort by latency: it meets the inputs' ascending runs (`_merge`), where a
    lexicographic sort by (latency, cost) would start over.
    """
    if latency.size == 0:
        return np.zeros(0, dtype=np.int64)
    scale = float(np.abs(cost).max(initial=0.0)) or 1.0
    nanoseconds = np.round(latency, 9)
    order = np.argsort(nanoseconds, kind="stable")
    cost = cost[order]
    opens = np.r_[True, np.diff(nanoseconds[order]) != 0]  # a point opens a new group
    starts, group = np.flatnonzero(opens), np.cumsum(opens) - 1
    rounded = np.round(cost / scale, 12)
    least = np.minimum.reduceat(rounded, starts)
    first = np.flatnonzero(rounded == least[group])
    represent = first[np.r_[True, group[first][1:] != group[first][:-1]]]  # one per group
    faster = np.minimum.accumulate(np.minimum.reduceat(cost, starts))  # through each group
    keep = np.ones(represent.size, dtype=bool)
    keep[1:] = cost[represent[1:]] < faster[:-1] * (1 - TIE_RTOL)
    return order[represent[keep]]


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
        chosen = pareto_points(total_latency, total_cost)
    else:
        candidates = np.flatnonzero(keep(total_latency, total_cost))
        chosen = candidates[pareto_points(total_latency[candidates], total_cost[candidates])]
    added, before = np.divmod(chosen, max(latency.size, 1))
    return before, added
