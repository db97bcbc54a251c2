"""The exact solver of driver and monolithic deployments (the model: `planner.driver`).

The exact solver. Fix the driver's memory. A layer's local set S and its remote experts' options
interact with the other layers only through the layer's latency t_e (the SLO sums them; the
driver's GB-s and the Express duration cost rho per second of it) and through the memory its
local experts take. So per layer and local-set size k the Pareto curve of (t_e, cost) is exact:
for each threshold tau on the remote finish every remote expert takes its cheapest option
within tau, and t_e = max(u_expert D_S, tau), enumerated over every local set S of the family
and every tau where some expert's cheapest cost drops. Layers then merge as a knapsack over
(latency, local experts), each state pruned by the states with fewer local experts. The local
sets are every subset when a layer has at most `ALL_SUBSETS_MAX` experts (then the result is
optimal over the whole decision space, and a brute force agrees); past that, a layer's local
set is its a most and b least popular experts, for every a + b <= E (the popular ones save the
most remote cost per unit of memory, the rare ones the most per unit of local compute time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from ground.errors import InfeasibleError
from planner.driver import (
    DriverChoice,
    DriverEvaluation,
    DriverInstance,
    DriverSolution,
    evaluate_driver,
    remote_options,
)
from planner.exact import SLO_RTOL, hull_sum, lower_hull, pareto_points
from planner.instance import MB

__all__ = ["ALL_SUBSETS_MAX", "local_families", "solve_driver", "solve_monolithic"]

ALL_SUBSETS_MAX = 10  # layers with at most this many experts: every local set is searched
MERGE_CHUNK = 3_000_000  # candidates a merge extends at a time (up to ~100 bytes each)
# Candidates one layer's exact merge may extend in all: past it (OLMoE's driver at 4,096-token
# batches reaches 783 million at its second layer, 3.4 billion at its third), the cheapest
# Lagrangian plan within the budget stands (`_Knapsack.cheapest`), and the solution says so.
MERGE_CANDIDATES_MAX = 60_000_000


class _MergeTooLarge(Exception):
    """The exact merge would extend more than `MERGE_CANDIDATES_MAX` candidates at a layer."""


def local_families(counts: np.ndarray) -> np.ndarray:
    """(F, E) bool: the local sets the solver searches in a layer with these counts.

    Every subset up to `ALL_SUBSETS_MAX` experts; past that, the a most and b least popular
    experts for every a + b <= E (ties in popularity broken by index).
    """
    experts = counts.size
    if experts <= ALL_SUBSETS_MAX:
        return np.array(list(product([False, True], repeat=experts)), dtype=bool)[:, ::-1]
    order = np.lexsort((np.arange(experts), -counts))  # most popular first
    masks = []
    for a in range(experts + 1):
        for b in range(experts - a + (a == 0)):  # a + b = E is every expert: once, at a = 0
            mask = np.zeros(experts, dtype=bool)
            mask[order[:a]] = True
            if b:
                mask[order[experts - b :]] = True
            masks.append(mask)
    return np.array(masks, dtype=bool)


@dataclass(frozen=True, eq=False)
class _LayerTable:
    """One layer's remote costs by local set and threshold, independent of the driver's
    memory: `remote[s, t]` the cheapest remote experts of set s finishing by `taus[t]`."""

    masks: np.ndarray  # (F, E) local sets
    local_tokens: np.ndarray  # (F,)
    sizes: np.ndarray  # (F,) local experts
    taus: np.ndarray  # (T,)
    remote: np.ndarray  # (F, T) $, inf where some remote expert has no option by tau
    overflow: np.ndarray  # (F, T) whether some remote expert's option goes through S3
    option: np.ndarray  # (E, T) flat (j, g) index of each expert's cheapest option by tau

    @classmethod
    def make(cls, dinst: DriverInstance, layer: int, overflow_allowed: bool) -> _LayerTable:
        opts = remote_options(dinst, layer)
        E = dinst.experts
        cost = opts.cost.reshape(E, -1)
        finish = opts.finish.reshape(E, -1)
        ok = opts.feasible.reshape(E, -1)
        over = opts.overflow.reshape(E, -1) > 0
        if not overflow_allowed:
            ok = ok & ~over
        cost = np.where(ok, cost, np.inf)
        order = np.argsort(np.where(ok, finish, np.inf), axis=1, kind="stable")
        f_sorted = np.take_along_axis(np.where(ok, finish, np.inf), order, axis=1)
        c_sorted = np.take_along_axis(cost, order, axis=1)
        best = np.minimum.accumulate(c_sorted, axis=1)
        # Where each expert's cheapest-within cost drops: the thresholds worth trying.
        drops = np.isfinite(best) & np.r_["1", np.ones((E, 1), bool), best[:, 1:] < best[:, :-1]]
        taus = np.unique(np.r_[0.0, f_sorted[drops]])
        pos = np.stack([np.searchsorted(f_sorted[i], taus, side="right") - 1 for i in range(E)])
        has = pos >= 0
        clipped = np.maximum(pos, 0)
        c_tau = np.where(has, np.take_along_axis(best, clipped, axis=1), np.inf)  # (E, T)
        # the option attaining each expert's cheapest cost within tau
        arg_sorted = _cumargmin(c_sorted)
        option = np.take_along_axis(order, np.take_along_axis(arg_sorted, clipped, axis=1), 1)
        option_over = np.take_along_axis(over, option, axis=1) & has
        masks = local_families(np.ceil(dinst.base.counts[layer]))
        remote = ~masks
        # float matmuls: numpy multiplies integer matrices without BLAS, hundreds of times slower
        far = remote.astype(float)
        infinite = far @ (~np.isfinite(c_tau)).astype(float) > 0.5
        total = far @ np.where(np.isfinite(c_tau), c_tau, 0.0)
        total[infinite] = np.inf
        overflow_any = far @ option_over.astype(float) > 0.5
        counts = np.ceil(dinst.base.counts[layer])
        return cls(
            masks=masks,
            local_tokens=masks.astype(float) @ counts,
            sizes=masks.sum(axis=1),
            taus=taus,
            remote=total,
            overflow=overflow_any,
            option=option,
        )


def _cumargmin(values: np.ndarray) -> np.ndarray:
    """(E, K) per position, where each row's running minimum up to it is attained (the latest
    of equal minima; the threshold at the earliest one, also tried, picks that one)."""
    best = np.minimum.accumulate(values, axis=1)
    index = np.where(values == best, np.arange(values.shape[1])[None, :], 0)
    return np.maximum.accumulate(index, axis=1)


Curve = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # latency, cost, set, tau


def _layer_curves(table: _LayerTable, u_expert: float, rho: float, cap: float) -> dict[int, Curve]:
    """Per local-set size k, the layer's Pareto (latency, cost, set, tau) at one memory.

    A set's thresholds below its local compute time all give that latency, so only the
    largest of them (the cheapest) can be on the curve; the rest are dropped before the
    grouped Pareto sort (by size, then latency, then cost, keeping what beats every faster
    point of its size).
    """
    local_s = u_expert * table.local_tokens
    latency = np.maximum(local_s[:, None], table.taus[None, :])
    cost = table.remote + rho * latency
    below = np.searchsorted(table.taus, local_s, side="right") - 1  # last tau <= local time
    ok = np.isfinite(cost) & (latency <= cap)
    ok &= np.arange(table.taus.size)[None, :] >= np.maximum(below, 0)[:, None]
    s, t = np.nonzero(ok)
    if s.size == 0:
        return {}
    k = table.sizes[s]
    lat, c = latency[s, t], cost[s, t]
    order = np.lexsort((c, np.round(lat, 9), k))
    k, lat, c, s, t = k[order], lat[order], c[order], s[order], t[order]
    spread = float(c.max() - c.min()) + 1.0
    rank = np.cumsum(np.r_[True, k[1:] != k[:-1]]) - 1
    shifted = c - rank * spread  # a later size never sees an earlier size's costs as lower
    before = np.r_[np.inf, np.minimum.accumulate(shifted)[:-1]] + rank * spread
    first = np.r_[True, k[1:] != k[:-1]]
    keep = first | (c < before * (1 - 1e-12))
    curves = {}
    k, lat, c, s, t = k[keep], lat[keep], c[keep], s[keep], t[keep]
    bounds = np.flatnonzero(np.r_[True, k[1:] != k[:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        curves[int(k[a])] = (lat[a:b], c[a:b], s[a:b], t[a:b])
    return curves


@dataclass(frozen=True)
class _Knapsack:
    """The merge of the layers' curves over states of local experts.

    Where the driver's memory binds, a state is the number of local experts so far (at most
    `limit`, which leaves at least one expert remote). Where it does not, the count does not
    matter, only whether some expert is remote yet: state 1 (every expert so far local) and 0.
    Either way a state with a smaller number dominates an equal or worse point of a larger one.
    """

    curves: list[dict[int, Curve]]
    experts: int
    limit: int
    collapsed: bool

    @property
    def start(self) -> int:
        return 1 if self.collapsed else 0

    def targets(self, state: int | np.ndarray, k: np.ndarray) -> np.ndarray:
        """The state after adding a layer with k local experts (-1: over the memory)."""
        if self.collapsed:
            return np.where((np.asarray(state) == 1) & (k == self.experts), 1, 0)
        after = np.asarray(state) + k
        return np.where(after <= self.limit, after, -1)

    def final(self, state: int) -> bool:
        return state == 0 if self.collapsed else True

    def size(self) -> int:
        return 2 if self.collapsed else self.limit + 1

    def scalar(self, cost_weight: float, latency_weight: float) -> list[tuple[int, int]] | None:
        """The plan minimising the weighted sum of cost and latency (each layer's points
        weighed alike): per layer its (k, point), or None when no final state is reached."""
        n = self.size()
        value = np.full(n, np.inf)
        value[self.start] = 0.0
        back: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        states = np.arange(n)
        for curves in self.curves:
            new = np.full(n, np.inf)
            prev = np.full(n, -1)
            pick_k = np.full(n, -1)
            pick_i = np.full(n, -1)
            for k, (lat, cost, _, _) in curves.items():
                weighted = cost_weight * cost + latency_weight * lat
                i = int(np.argmin(weighted))
                target = self.targets(states, np.full(n, k))
                ok = (target >= 0) & np.isfinite(value)
                if not ok.any():
                    continue
                cand = value[ok] + weighted[i]
                tgt = target[ok]
                # the best candidate per target (several states may reach one target)
                order = np.lexsort((cand, tgt))
                first = np.r_[True, tgt[order][1:] != tgt[order][:-1]]
                tgt_best, cand_best = tgt[order][first], cand[order][first]
                src_best = states[ok][order][first]
                better = cand_best < new[tgt_best]
                new[tgt_best[better]] = cand_best[better]
                prev[tgt_best[better]] = src_best[better]
                pick_k[tgt_best[better]] = k
                pick_i[tgt_best[better]] = i
            value = new
            back.append((prev, pick_k, pick_i))
        finals = [w for w in range(n) if self.final(w) and np.isfinite(value[w])]
        if not finals:
            return None
        w = min(finals, key=lambda s: value[s])
        picks = []
        for prev, pick_k, pick_i in reversed(back):
            picks.append((int(pick_k[w]), int(pick_i[w])))
            w = int(prev[w])
        return picks[::-1]

    def totals(self, picks: list[tuple[int, int]]) -> tuple[float, float]:
        lat = sum(float(c[k][0][i]) for c, (k, i) in zip(self.curves, picks, strict=True))
        cost = sum(float(c[k][1][i]) for c, (k, i) in zip(self.curves, picks, strict=True))
        return lat, cost

    def cheapest(self, budget: float) -> tuple[float, list[tuple[int, int]], bool] | None:
        """(cost, per layer (k, point), exact) of the cheapest plan whose latency is within
        `budget`.

        The plan of least cost alone is the answer when it fits; else a Lagrangian plan that
        fits gives an upper bound, the layers' convex hulls a lower bound on the rest, and the
        merge over (state, latency, cost) keeps only partial plans the bounds allow. Where that
        merge would extend more than `MERGE_CANDIDATES_MAX` candidates at a layer, the
        Lagrangian plan is the answer, not known to be the cheapest (`exact` False; None if
        there is none)."""
        free = self.scalar(1.0, 0.0)
        if free is None:
            return None
        lat, cost = self.totals(free)
        if lat <= budget:
            return cost, free, True
        upper = math.inf
        lagrangian = None
        if (fastest := self.scalar(0.0, 1.0)) is not None and self.totals(fastest)[0] <= budget:
            low, high = 0.0, 1.0
            while (p := self.scalar(1.0, high)) is not None and self.totals(p)[0] > budget:
                low, high = high, high * 16
                if high > 1e18:
                    break
            for _ in range(60):
                middle = (low + high) / 2
                p = self.scalar(1.0, middle)
                if p is not None and self.totals(p)[0] <= budget:
                    high = middle
                else:
                    low = middle
            p = self.scalar(1.0, high)
            if p is not None and self.totals(p)[0] <= budget:
                upper = self.totals(p)[1]
                lagrangian = (upper, p, False)
        try:
            merged = self._merged(budget, upper)
        except _MergeTooLarge:
            return lagrangian
        return None if merged is None else (*merged, True)

    def _merged(self, budget: float, upper: float) -> tuple[float, list[tuple[int, int]]] | None:
        hulls = []
        for curves in self.curves:
            lat = np.concatenate([c[0] for c in curves.values()])
            cost = np.concatenate([c[1] for c in curves.values()])
            keep = pareto_points(lat, cost)
            keep = keep[np.argsort(lat[keep], kind="stable")]
            hulls.append(lower_hull(lat[keep], cost[keep]))
        rest = [hull_sum(hulls[i + 1 :]) for i in range(len(hulls))]
        slack = 1e-12 + abs(upper) * 1e-9 if math.isfinite(upper) else math.inf
        states: dict[int, tuple[np.ndarray, np.ndarray]] = {self.start: (np.zeros(1), np.zeros(1))}
        history: list[dict[int, tuple[np.ndarray, ...]]] = []
        for layer, curves in enumerate(self.curves):
            keep = _bound(budget, upper + slack, *rest[layer])
            states, back = self._merge(states, curves, keep)
            history.append(back)
            if not states:
                return None
        finals = [
            (float(c.min()), w, int(np.argmin(c))) for w, (_, c) in states.items() if self.final(w)
        ]
        if not finals:
            return None
        cost, w, i = min(finals)
        picks = []
        for back in reversed(history):
            prev_w, prev_i, ks, points = back[w]
            picks.append((int(ks[i]), int(points[i])))
            w, i = int(prev_w[i]), int(prev_i[i])
        return cost, picks[::-1]

    def _merge(
        self,
        states: dict[int, tuple[np.ndarray, np.ndarray]],
        curves: dict[int, Curve],
        keep: Any,
        chunk: int = MERGE_CHUNK,
    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[int, tuple[np.ndarray, ...]]]:
        """One layer: every state extended by every point of every local-set size, grouped by
        the new state, pruned by the bounds, Pareto, and the states that dominate.

        The new states go in ascending chunks of about `chunk` candidates (a state's points
        times the layer's points that reach the chunk, before the bounds), so that memory
        stays bounded when the states hold many points. The result equals that of a single
        chunk, bit for bit: a new state's candidates come in the same order either way
        (states in order, then row-major over the state's points and the layer's points in
        ascending order), so Pareto breaks ties and scales its rounding alike, and the curve
        of the new states so far carries from chunk to chunk."""
        ks = np.array(sorted(curves), dtype=int)
        sizes = [curves[k][0].size for k in ks]
        lat_k = np.concatenate([curves[k][0] for k in ks])
        cost_k = np.concatenate([curves[k][1] for k in ks])
        point_k = np.concatenate([np.arange(n) for n in sizes])
        k_of = np.repeat(ks, sizes)
        targets = {w: self.targets(w, k_of) for w in states}
        load = np.zeros(self.size(), dtype=np.int64)  # candidates by new state
        for w, (lat_w, _) in states.items():
            reached = targets[w][targets[w] >= 0]
            load += lat_w.size * np.bincount(reached, minlength=load.size)
        if int(load.sum()) > MERGE_CANDIDATES_MAX:
            raise _MergeTooLarge
        edges = _chunk_edges(load, chunk)
        # per state: its columns by target, and where each chunk's targets start among them
        spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for w, target in targets.items():
            by_target = np.argsort(target, kind="stable")
            spans[w] = (by_target, np.searchsorted(target[by_target], edges))
        new_states: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        back: dict[int, tuple[np.ndarray, ...]] = {}
        stair_lat, stair_cost = np.zeros(0), np.zeros(0)  # the curve of the states so far
        for c in range(edges.size - 1):
            parts = []
            for w, (lat_w, cost_w) in states.items():
                by_target, starts = spans[w]
                cols = by_target[starts[c] : starts[c + 1]]  # by target, then ascending
                if cols.size == 0:
                    continue
                lat = (lat_w[:, None] + lat_k[None, cols]).ravel()
                cost = (cost_w[:, None] + cost_k[None, cols]).ravel()
                ok = np.flatnonzero(keep(lat, cost))
                rows, which = np.divmod(ok, cols.size)
                col = cols[which]
                if ok.size:
                    parts.append(
                        (targets[w][col], lat[ok], cost[ok], np.full(ok.size, w), rows, col)
                    )
            if not parts:
                continue
            columns = (np.concatenate(p) for p in zip(*parts, strict=True))
            target, lat, cost, prev_w, prev_i, col = columns
            order = np.argsort(target, kind="stable")  # each new state's rows, in their order
            news, firsts = np.unique(target[order], return_index=True)
            for w, rows in zip(news.tolist(), np.split(order, firsts[1:]), strict=True):
                chosen = rows[pareto_points(lat[rows], cost[rows])]
                if stair_lat.size:
                    at = np.searchsorted(stair_lat, lat[chosen] * (1 + 1e-12), side="right") - 1
                    best = np.where(at >= 0, stair_cost[np.maximum(at, 0)], np.inf)
                    chosen = chosen[cost[chosen] < best * (1 - 1e-12)]
                if chosen.size == 0:
                    continue
                chosen = chosen[np.argsort(lat[chosen], kind="stable")]
                new_states[w] = (lat[chosen], cost[chosen])
                back[w] = (prev_w[chosen], prev_i[chosen], k_of[col[chosen]], point_k[col[chosen]])
                both_lat = np.r_[stair_lat, lat[chosen]]
                both_cost = np.r_[stair_cost, cost[chosen]]
                stair = pareto_points(both_lat, both_cost)
                stair = stair[np.argsort(both_lat[stair], kind="stable")]
                stair_lat, stair_cost = both_lat[stair], both_cost[stair]
        return new_states, back


def _chunk_edges(load: np.ndarray, budget: int) -> np.ndarray:
    """Edges e of the ascending chunks [e[i], e[i + 1]) of the states 0 .. load.size - 1: each
    chunk's load within `budget`, or a single state with load."""
    edges = [0]
    total = 0
    for w, n in enumerate(load.tolist()):
        if total and total + n > budget:
            edges.append(w)
            total = 0
        total += n
    edges.append(load.size)
    return np.array(edges)


def _bound(
    budget: float, upper: float, hull_lat: np.ndarray, hull_cost: np.ndarray
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The test of partial plans (latency, cost): within the budget, and not above `upper`
    once the rest of the layers' least cost for the latency left (their hull) is added."""

    def keep(lat: np.ndarray, cost: np.ndarray) -> np.ndarray:
        least = cost + np.interp(budget - lat, hull_lat, hull_cost, left=np.inf)
        return (lat <= budget) & (least <= upper)

    return keep


def _within_s(dinst: DriverInstance, d: int, overflow: bool) -> float:
    """The seconds a driver of memory option `d` has for its layers' expert steps: Lambda's
    timeout less its fixed terms (negative: none)."""
    return dinst.base.max_timeout_s - dinst.fixed_s(d, overflow)


def _all_curves(
    dinst: DriverInstance, overflow: bool, options: list[int]
) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict[int, list[dict[int, Curve]]]]:
    """Every layer's curves at each driver memory option of `options`, and per layer what a
    chosen point is read back from (its local sets and each expert's option by threshold).

    One layer's table (thousands of local sets by thousands of thresholds for OLMoE) is built
    at a time and dropped once its curves at every option are drawn: kept for every layer at
    once, the tables took about 24 GB at 4,096 tokens."""
    curves: dict[int, list[dict[int, Curve]]] = {d: [] for d in options}
    picked: list[tuple[np.ndarray, np.ndarray]] = []
    for layer in range(dinst.layers):
        table = _LayerTable.make(dinst, layer, overflow)
        for d in options:
            within = _within_s(dinst, d, overflow)
            curves[d].append(_layer_curves(table, float(dinst.u_expert[d]), dinst.rho(d), within))
        picked.append((table.masks, table.option))
    return picked, curves


def _solve_at(
    dinst: DriverInstance,
    d: int,
    picked: list[tuple[np.ndarray, np.ndarray]],
    curves: list[dict[int, Curve]],
    overflow: bool,
    slo_s: float | None,
    limit_units: int,
) -> tuple[float, tuple[float, DriverChoice, bool] | None]:
    """At driver memory option `d`, with the fixed terms of `overflow` priced, over the layers'
    `curves` at `d` (`_all_curves`): the least latency of any plan (inf if none) and (cost,
    choice, exact) of the cheapest within the SLO (None when there is none; exact False where
    the merge was too large and the Lagrangian plan stands, `_Knapsack.cheapest`)."""
    fixed_s = dinst.fixed_s(d, overflow)
    rho = dinst.rho(d)
    within = _within_s(dinst, d, overflow)  # the driver's whole run within the timeout
    if any(not c for c in curves):
        return math.inf, None
    everything = dinst.layers * dinst.experts
    knapsack = _Knapsack(curves, dinst.experts, limit_units, limit_units >= everything - 1)
    fastest = knapsack.scalar(0.0, 1.0)
    if fastest is None:
        return math.inf, None
    least = fixed_s + knapsack.totals(fastest)[0]
    budget = within if slo_s is None else min(within, slo_s * (1 + SLO_RTOL) - fixed_s)
    found = knapsack.cheapest(budget) if budget >= 0 else None
    if found is None:
        return least, None
    cost, picks, exact = found
    local = np.zeros((dinst.layers, dinst.experts), bool)
    memory = np.zeros((dinst.layers, dinst.experts), int)
    replicas = np.ones((dinst.layers, dinst.experts), int)
    groups = dinst.base.max_replicas
    for layer, (k, i) in enumerate(picks):
        _, _, sets, taus = curves[layer][k]
        masks, option = picked[layer]
        local[layer] = masks[int(sets[i])]
        memory[layer], replicas[layer] = np.divmod(option[:, int(taus[i])], groups)
        replicas[layer] += 1
    total = cost + dinst.fixed_usd(overflow) + rho * fixed_s
    return least, (total, DriverChoice(d, local, memory, replicas), exact)


def solve_driver(dinst: DriverInstance, slo_s: float | None) -> DriverSolution:
    """The cheapest driver plan (at least one remote expert) meeting `slo_s`.

    Each driver memory option is solved twice: with no shard through S3 (no cleanup to pay)
    and with overflow allowed (the cleanup's listing and delete always priced); the cheaper
    is exact, since a plan without overflow is priced exactly by the first.

    Raises:
        InfeasibleError: No driver plan meets it; the message names why.
    """
    started = time.perf_counter()
    best: tuple[float, DriverChoice, bool] | None = None
    fastest = math.inf
    inexact = 0  # memory options whose exact merge was too large (the Lagrangian plan stood)
    units = [dinst.budget_units(d) for d in range(dinst.memory_mb.size)]
    held = max(units)
    for overflow in (False, True):
        options = [
            d
            for d, u in enumerate(units)
            if u >= 0 and _within_s(dinst, d, overflow) >= 0  # holds its stages, in time
        ]
        picked, curves = _all_curves(dinst, overflow, options)
        for d in options:
            limit = min(units[d], dinst.layers * dinst.experts - 1)
            least, found = _solve_at(dinst, d, picked, curves[d], overflow, slo_s, limit)
            fastest = min(fastest, least)
            inexact += found is not None and not found[2]
            if found is not None and (best is None or found[0] < best[0] * (1 - 1e-12)):
                best = found
    if best is None:
        raise _no_driver(dinst, slo_s, fastest, held)
    evaluation = evaluate_driver(dinst, best[1], slo_s)
    exhaustive = dinst.experts <= ALL_SUBSETS_MAX
    note = (
        "every local set searched"
        if exhaustive
        else "local sets: each layer's most and least popular experts"
    )
    if inexact:
        note += (
            f"; at {inexact} driver memory option(s) the layers' exact merge passed "
            f"{MERGE_CANDIDATES_MAX:,} candidates and the Lagrangian plan within the SLO stood"
        )
    return DriverSolution(
        deployment="driver",
        choice=best[1],
        evaluation=evaluation,
        seconds=time.perf_counter() - started,
        optimal=True if exhaustive and not inexact else None,
        min_latency=fastest,
        note=note,
    )


def _no_driver(
    dinst: DriverInstance, slo_s: float | None, fastest: float, held: int
) -> InfeasibleError:
    """Why no driver plan: the non-MoE stack alone does not fit, nothing fits the limits, or
    latency (with the smallest SLO a driver meets)."""
    if held < 0:
        need = dinst.runtime_mb + dinst.nonmoe_mb + dinst.activations_mb
        return InfeasibleError(
            f"no driver holds the non-MoE stack: {_size(need)} (runtime, stages, a batch's "
            f"activations) > {dinst.max_memory_mb:,.0f} MB, Lambda's largest function.",
            "plan for fewer --tokens, or use the workflow (--deployment workflow).",
        )
    if not math.isfinite(fastest) or slo_s is None:
        return InfeasibleError(
            "no driver plan fits Lambda's limits (memory, payload, timeout) at any memory.",
            "plan for fewer --tokens, or use the workflow (--deployment workflow).",
        )
    return InfeasibleError(
        f"no driver plan meets the SLO of {slo_s:.3f} s: the fastest takes {fastest:.3f} s.",
        f"pass --slo {math.ceil(fastest * 1000) / 1000:.3f} or more.",
        smallest_slo_s=fastest,
    )


def solve_monolithic(dinst: DriverInstance, slo_s: float | None) -> DriverSolution:
    """The cheapest one-function plan meeting `slo_s`: every expert local, the memory chosen.

    Raises:
        InfeasibleError: The model does not fit the largest function, or no memory meets the
            SLO (the message names the weights, or the fastest latency).
    """
    started = time.perf_counter()
    everything = np.ones((dinst.layers, dinst.experts), bool)
    ones = np.ones((dinst.layers, dinst.experts), int)
    weights_mb = dinst.nonmoe_mb + float(dinst.experts_mb.sum())
    need = dinst.runtime_mb + weights_mb + dinst.activations_local_mb
    if need > dinst.max_memory_mb:
        if weights_mb > dinst.max_memory_mb:
            raise InfeasibleError(
                f"weights {_size(weights_mb)} > {dinst.max_memory_mb:,.0f} MB, Lambda's largest "
                f"function (with the runtime and a batch's activations it needs {_size(need)}).",
                "use a driver or the workflow (--deployment auto).",
            )
        # the weights fit; the runtime and this batch's activations tip it over
        raise InfeasibleError(
            f"weights {_size(weights_mb)}, the runtime and a batch's activations need "
            f"{_size(need)} > {dinst.max_memory_mb:,.0f} MB, Lambda's largest function.",
            "plan for fewer --tokens, or use a driver or the workflow (--deployment auto).",
        )
    best: DriverEvaluation | None = None
    chosen = 0
    fastest = math.inf
    for d in range(dinst.memory_mb.size):
        choice = DriverChoice(d, everything, 0 * ones, ones)
        ev = evaluate_driver(dinst, choice, slo_s)
        if ev.memory_need_mb > dinst.memory_mb[d] or ev.latency > dinst.base.max_timeout_s:
            continue
        fastest = min(fastest, ev.latency)
        if not ev.violations and (best is None or ev.cost < best.cost * (1 - 1e-12)):
            best, chosen = ev, d
    if best is None:
        if not math.isfinite(fastest):
            raise InfeasibleError(
                f"one function cannot serve {dinst.tokens:,} tokens within Lambda's "
                f"{dinst.base.max_timeout_s:g} s timeout at any memory.",
                "plan for fewer --tokens, or use a driver or the workflow.",
            )
        raise InfeasibleError(
            f"no one-function plan meets the SLO of {slo_s:.3f} s: the fastest takes "
            f"{fastest:.3f} s.",
            f"pass --slo {math.ceil(fastest * 1000) / 1000:.3f} or more.",
            smallest_slo_s=fastest,
        )
    return DriverSolution(
        deployment="monolithic",
        choice=DriverChoice(chosen, everything, 0 * ones, ones),
        evaluation=best,
        seconds=time.perf_counter() - started,
        optimal=True,
        min_latency=fastest,
        note=f"{dinst.memory_mb.size} memory sizes",
    )


def _size(mb: float) -> str:
    """Weights as a model card states them: decimal GB (Mixtral's 46.7 B bf16 weights are
    93.4 GB), MB (MiB, Lambda's unit) below a GB."""
    return f"{mb * MB / 1e9:,.1f} GB" if mb * MB >= 1e9 else f"{mb:,.0f} MB"
