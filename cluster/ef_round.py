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

from cluster.ef_planner import PlanError, Tables, _align, _load, _plan_w, workspace

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
def _one(i, types, left, ddl, tab, fk, fv, n, now_s, slot_s, gpus, assign, ws, want_free,
         ak, av, job_end):  # type: ignore[no-untyped-def]  # fmt: skip
    """Job i's plan on the profile (with its allocation `ak`, `av` given back up to `job_end`
    when it has one): `_plan_w`'s results."""
    levels, nlevels, rate, fit, max_gpus = tab
    t = types[i]
    d_slot = _align(ddl[i] - now_s, slot_s)
    zero = levels[t, 0] <= gpus
    m, nxt = _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus)
    return _plan_w(
        left[i], ddl[i], levels[t, : nlevels[t]], rate[t], fit[t], max_gpus[t],
        m, nxt, now_s, slot_s, gpus, assign, ws, want_free,
    )  # fmt: skip


@njit(cache=True)
def _profiles(count):  # type: ignore[no-untyped-def]
    """The free profile (keys, values) and a workspace for a round of `count` jobs. A
    profile has a few breakpoints a job (its end, its deadline's slot) and is checked to stay
    within 4 a job; a profile with a job given back has at most the profile's and the job's
    breakpoints, and the workspace holds that."""
    size = 4 * count + 16
    fk = np.zeros(size, np.int64)
    fv = np.zeros(size, np.int64)
    return fk, fv, workspace(2 * size + 4)


@njit(cache=True)
def _adopt(ws, nf, fk, fv):  # type: ignore[no-untyped-def]
    """Make the profile a plan left (ws[7], ws[8]) the round's free profile."""
    if nf > fk.shape[0] - 4:
        raise PlanError("a profile has more breakpoints than the round allows for")
    fk[:nf] = ws[7][:nf]
    fv[:nf] = ws[8][:nf]
    return nf


@njit(cache=True)
def admits(types, left, ddl, tab, now_s, slot_s, gpus):  # type: ignore[no-untyped-def]
    """Whether every job, planned in this order on an empty cluster, meets its deadline
    (the artifact's admission test, `estimate_all_jobs`)."""
    fk, fv, ws = _profiles(types.shape[0])
    fv[0] = gpus
    nf = 1
    none = fk[:0]
    for i in range(types.shape[0]):
        _, _, _, ok, nf2, _ = _one(i, types, left, ddl, tab, fk, fv, nf, now_s, slot_s, gpus,
                                   -1, ws, True, none, none, -1)  # fmt: skip
        if not ok:
            return False
        nf = _adopt(ws, nf2, fk, fv)
    return True


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
    fk, fv, ws = _profiles(count)
    width = fk.shape[0]
    a_keys = np.zeros((count, width), np.int64)
    a_vals = np.zeros((count, width), np.int64)
    a_len = np.zeros(count, np.int64)
    end = np.zeros(count, np.int64)
    real = np.zeros(count)
    held = np.zeros(count, np.int64)
    used = np.zeros(count)  # GPU-seconds of each job's plan
    none = fk[:0]

    def keep(i, na, e, r, u):  # type: ignore[no-untyped-def]
        if na > width:
            raise PlanError("a plan has more breakpoints than the round allows for")
        a_len[i] = na
        a_keys[i, :na] = ws[5][:na]
        a_vals[i, :na] = ws[6][:na]
        end[i], real[i], held[i], used[i] = e, r, ws[6][0], u

    fv[0] = gpus
    nf = 1
    for i in range(count):
        na, e, r, _, nf2, u = _one(i, types, left, ddl, tab, fk, fv, nf, now_s, slot_s, gpus,
                                   -1, ws, True, none, none, -1)  # fmt: skip
        keep(i, na, e, r, u)
        nf = _adopt(ws, nf2, fk, fv)
    order = np.arange(count)
    idle = gpus - held.sum()
    if fv[0] != idle:
        raise PlanError("the profile's free GPUs now differ from the idle GPUs")
    if idle > 0:
        nxt = np.zeros(count, np.int64)
        for i in range(count):
            nxt[i] = _next_level(levels[types[i]], nlevels[types[i]], held[i])
        gain = np.zeros(count)

        def estimate(i, nf, idle, want_free):  # type: ignore[no-untyped-def]
            """The job's plan one level up (the artifact's `get_marginal`) and its gain in
            GPU-seconds per GPU; -inf when it cannot grow or does not fit, +inf when it
            holds no GPUs (the artifact's `sys.maxsize`)."""
            step = nxt[i] - held[i]
            if step > idle or step == 0:
                return -_MAX, 0, 0, 0.0, 0, 0.0
            n = a_len[i]
            na, e, r, _, ng, u = _one(i, types, left, ddl, tab, fk, fv, nf, now_s, slot_s,
                                      gpus, nxt[i], ws, want_free, a_keys[i, :n],
                                      a_vals[i, :n], end[i])  # fmt: skip
            if held[i] == 0:
                return _MAX, na, e, r, ng, u
            return (u - used[i]) / step, na, e, r, ng, u

        for i in order:
            gain[i] = estimate(i, nf, idle, False)[0]
        order = order[np.argsort(-gain[order], kind="mergesort")]
        granted = True
        while idle > 0 and granted:
            granted = False
            for i in order:
                step = nxt[i] - held[i]
                if step > idle or step == 0:
                    continue
                _, na, e, r, ng, u = estimate(i, nf, idle, True)
                keep(i, na, e, r, u)
                nf = _adopt(ws, ng, fk, fv)
                idle -= step
                if fv[0] != idle:
                    raise PlanError("a granted plan leaves other than the idle GPUs free")
                nxt[i] = _next_level(levels[types[i]], nlevels[types[i]], held[i])
                granted = True
                break
            for i in order:
                if nxt[i] > held[i]:
                    gain[i] = estimate(i, nf, idle, False)[0]
            order = order[np.argsort(-gain[order], kind="mergesort")]
    change = np.full(count, -1, np.int64)
    for i in range(count):
        if a_len[i] > 1:
            change[i] = a_keys[i, 1]
    return order, held, end, real, change
