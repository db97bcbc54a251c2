"""One ElasticFlow round's plans, compiled: the admission test, every job's plan, and the
idle-GPU hand-out (`estimate_all_jobs`, `ef_sim_allocation`, `allocate_free_gpus` and
`get_marginal` in the artifact's scheduler.py; the rules are in `cluster.elasticflow`).

Jobs come as parallel arrays in the round's order (type, iterations left, deadline, GPUs);
their types' tables are stacked (`JobTypes`). The hand-out re-estimates every job after each
level it grants, as the artifact does, so it runs in compiled code: the job order it leaves
(a stable sort by estimated gain after every grant) decides the placement, so no estimate
can be skipped.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

from cluster.ef_planner import PlanError, Tables, _plan

__all__ = ["JobTypes", "admits", "plan_round"]

_MAX = float(sys.maxsize)  # the artifact's marginal for a job holding no GPUs (+) or stuck (-)


class JobTypes:
    """The tables of every (model, batch) seen so far, stacked for the compiled kernels."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.index: dict[tuple[str, int], int] = {}
        self._tables: list[tuple[Tables, int]] = []
        self.levels = self.nlevels = self.rate = self.fit = self.max_gpus = np.empty(0)

    def of(self, key: tuple[str, int], levels: tuple[int, ...], rate: dict[int, float],
           max_gpus: int) -> int:  # fmt: skip
        """The type's index, stacking its tables the first time it is seen."""
        if key not in self.index:
            self.index[key] = len(self._tables)
            self._tables.append((Tables(levels, rate, self.gpus), max_gpus))
            self._stack()
        return self.index[key]

    def _stack(self) -> None:
        width = max(len(t.levels) for t, _ in self._tables)
        top = max(len(t.rate) for t, _ in self._tables)
        count = len(self._tables)
        self.levels = np.zeros((count, width), np.int64)
        self.nlevels = np.zeros(count, np.int64)
        self.rate = np.full((count, top), np.nan)
        self.fit = np.zeros((count, self.gpus + 1), np.int64)
        self.max_gpus = np.zeros(count, np.int64)
        for i, (t, max_gpus) in enumerate(self._tables):
            self.levels[i, : len(t.levels)] = t.levels
            self.nlevels[i] = len(t.levels)
            self.rate[i, : len(t.rate)] = t.rate
            self.fit[i] = t.fit
            self.max_gpus[i] = max_gpus


@njit(cache=True)
def _one(i, types, left, ddl, tab, fk, fv, now_s, slot_s, gpus, assign):  # type: ignore[no-untyped-def]
    levels, nlevels, rate, fit, max_gpus = tab
    t = types[i]
    return _plan(
        left[i], ddl[i], levels[t, : nlevels[t]], rate[t], fit[t], max_gpus[t],
        fk, fv, fk.shape[0], now_s, slot_s, gpus, assign,
    )  # fmt: skip


@njit(cache=True)
def admits(types, left, ddl, tab, now_s, slot_s, gpus):  # type: ignore[no-untyped-def]
    """Whether every job, planned in this order on an empty cluster, meets its deadline
    (the artifact's admission test, `estimate_all_jobs`)."""
    fk = np.zeros(1, np.int64)
    fv = np.full(1, gpus, np.int64)
    for i in range(types.shape[0]):
        _, _, _, _, ok, fk, fv = _one(i, types, left, ddl, tab, fk, fv, now_s, slot_s, gpus, -1)
        if not ok:
            return False
    return True


@njit(cache=True)
def _with_job(fk, fv, ak, av, end):  # type: ignore[no-untyped-def]
    """The profile with a job's allocation given back up to its planned end, merged (the
    artifact's `get_marginal`)."""
    n, na = fk.shape[0], ak.shape[0]
    keys = np.empty(n + na + 1, np.int64)
    vals = np.empty(n + na + 1, np.int64)
    i = j = m = 0
    f_val = a_val = 0
    done_end = False
    while i < n or j < na or not done_end:
        t = 1 << 62
        if i < n:
            t = fk[i]
        if j < na and ak[j] < t:
            t = ak[j]
        if not done_end and end < t:
            t = end
        while i < n and fk[i] == t:
            f_val = fv[i]
            i += 1
        while j < na and ak[j] == t:
            a_val = av[j]
            j += 1
        if t == end:
            done_end = True
        value = f_val + (a_val if t < end else 0)
        if m > 0 and vals[m - 1] == value:
            continue
        keys[m] = t
        vals[m] = value
        m += 1
    return keys[:m], vals[:m]


@njit(cache=True)
def _gpu_seconds(ak, av, end, slot_s):  # type: ignore[no-untyped-def]
    """GPU-time of an allocation to `end` (`get_allocation_time`): each breakpoint's GPUs to
    the next breakpoint, the last one's to `end`."""
    total = 0.0
    for i in range(ak.shape[0] - 1):
        total += av[i] * ((ak[i + 1] - ak[i]) * slot_s)
    last = ak.shape[0] - 1
    return total + av[last] * ((end - ak[last]) * slot_s)


@njit(cache=True)
def _next_level(levels, nlevels, held):  # type: ignore[no-untyped-def]
    """The level above `held` (the first level when none), or `held` at the top
    (`utils.get_next_level`)."""
    if held == 0:
        return levels[0]
    for i in range(nlevels - 1):
        if levels[i] == held:
            return levels[i + 1]
    return held


@njit(cache=True)
def plan_round(types, left, ddl, tab, now_s, slot_s, gpus):  # type: ignore[no-untyped-def]
    """Every job's plan in this order on an empty cluster, then the idle-GPU hand-out.
    Returns the job order the hand-out leaves (indices), and per job its GPUs now, planned
    end (slots), real end (seconds) and next allocation change (slots; -1 for none)."""
    levels, nlevels = tab[0], tab[1]
    count = types.shape[0]
    width = 2 * count + 8  # a plan's breakpoints: the profile's (<= 2 a job) and its own
    a_keys = np.zeros((count, width), np.int64)
    a_vals = np.zeros((count, width), np.int64)
    a_len = np.zeros(count, np.int64)
    end = np.zeros(count, np.int64)
    real = np.zeros(count)
    held = np.zeros(count, np.int64)

    def keep(i, ak, av, e, r):  # type: ignore[no-untyped-def]
        if ak.shape[0] > width:
            raise PlanError("a plan has more breakpoints than the round allows for")
        a_len[i] = ak.shape[0]
        a_keys[i, : ak.shape[0]] = ak
        a_vals[i, : ak.shape[0]] = av
        end[i], real[i], held[i] = e, r, av[0]

    fk = np.zeros(1, np.int64)
    fv = np.full(1, gpus, np.int64)
    for i in range(count):
        ak, av, e, r, _, fk, fv = _one(i, types, left, ddl, tab, fk, fv, now_s, slot_s, gpus, -1)
        keep(i, ak, av, e, r)
    order = np.arange(count)
    idle = gpus - held.sum()
    if fv[0] != idle:
        raise PlanError("the profile's free GPUs now differ from the idle GPUs")
    if idle > 0:
        nxt = np.zeros(count, np.int64)
        for i in range(count):
            nxt[i] = _next_level(levels[types[i]], nlevels[types[i]], held[i])
        gain = np.zeros(count)

        def estimate(i, fk, fv, idle):  # type: ignore[no-untyped-def]
            """The job's plan one level up (the artifact's `get_marginal`)."""
            step = nxt[i] - held[i]
            if step > idle or step == 0:
                gain[i] = -_MAX
                return
            n = a_len[i]
            tk, tv = _with_job(fk, fv, a_keys[i, :n], a_vals[i, :n], end[i])
            if tv.max() > gpus:
                raise PlanError("a job's plan given back exceeds the cluster")
            gk, gv, ge, _, _, _, _ = _one(i, types, left, ddl, tab, tk, tv, now_s, slot_s,
                                          gpus, nxt[i])  # fmt: skip
            if held[i] == 0:
                gain[i] = _MAX
                return
            grown = _gpu_seconds(gk, gv, ge, slot_s)
            gain[i] = (grown - _gpu_seconds(a_keys[i, :n], a_vals[i, :n], end[i], slot_s)) / step

        for i in order:
            estimate(i, fk, fv, idle)
        order = order[np.argsort(-gain[order], kind="mergesort")]
        granted = True
        while idle > 0 and granted:
            granted = False
            for i in order:
                step = nxt[i] - held[i]
                if step > idle or step == 0:
                    continue
                n = a_len[i]
                tk, tv = _with_job(fk, fv, a_keys[i, :n], a_vals[i, :n], end[i])
                ak, av, e, r, _, fk, fv = _one(i, types, left, ddl, tab, tk, tv, now_s,
                                               slot_s, gpus, nxt[i])  # fmt: skip
                keep(i, ak, av, e, r)
                idle -= step
                if fv[0] != idle:
                    raise PlanError("a granted plan leaves other than the idle GPUs free")
                nxt[i] = _next_level(levels[types[i]], nlevels[types[i]], held[i])
                granted = True
                break
            for i in order:
                if nxt[i] > held[i]:
                    estimate(i, fk, fv, idle)
            order = order[np.argsort(-gain[order], kind="mergesort")]
    change = np.full(count, -1, np.int64)
    for i in range(count):
        if a_len[i] > 1:
            change[i] = a_keys[i, 1]
    return order, held, end, real, change
