"""ElasticFlow's per-job plan on a free-GPU profile, computed as its artifact computes it.

The artifact's `ef_sim_allocation` (scheduler.py of pkusys/ElasticFlow, commit 04a0109) gives
one job GPUs per period of a free-GPU profile. Its numbers depend on details the paper does
not state, so each is reproduced here and named (the artifact's variable in brackets):

- A profile is a step function of free GPUs over slots from now; it is kept merged
  (`utils.merge_dict`): a breakpoint whose value equals the previous one is dropped, and the
  periods a plan walks are the runs between breakpoints. The deadline's slot (`aligned_ddl`,
  the deadline rounded up to the slot grid) is added as a breakpoint while planning, and the
  period ending there lasts only to the exact deadline.
- **MSS.** For each level of the job's curve in turn (a cap), the periods from the deadline
  back to the start are filled at min(cap, the largest level that fits the free GPUs); the
  first cap whose backward fill reaches the job's remaining iterations wins. The job then runs
  forward from the start at that cap from the period where the backward fill completed
  (`point`) and at the previous cap before it, to the slot its work completes in. Its
  allocation (`allocations`) keeps a zero breakpoint at every later profile breakpoint before
  the deadline: the first one is where the artifact next re-plans (a scale event), and the
  GPU-time of a plan counts the last period to that breakpoint (`get_allocation_time`).
- **Fallback.** When no cap completes by the deadline, the job runs at the largest cap up to
  the deadline's slot, then from that slot on at the largest level that fits the free GPUs
  at the start of each period, to completion; past the profile's last breakpoint it runs at
  min(cluster, its limit) alone. Two of the artifact's profile updates on this path are
  kept as it makes them: where the run ends inside a period, the period's free GPUs become
  the value of the last original breakpoint before the end minus the job's GPUs
  (`last_event_gpu`), and past the last breakpoint the profile becomes the whole cluster
  minus the job, then the whole cluster.
- **Scale-up estimate** (`assign_gpu=True`, used by the idle-GPU hand-out): the job runs at
  the given count to the profile's next original breakpoint (the deadline's slot is not one
  here), and if it does not complete in time there, MSS (or the fallback) continues from that
  breakpoint.
- Times are kept as the artifact keeps them: real ends are whole seconds rounded up on the
  trace's absolute clock (`math.ceil(event_time + iter_left / throughput)` in two of the three
  paths, relative in the third), planned ends are rounded up to the slot grid from now.

The states the artifact asserts never happen (a profile below zero, a job planned with no
iterations left or at zero GPUs) raise `PlanError`: a replay that reaches them has left the
artifact's semantics.

The planner is compiled with numba (`_plan`, over arrays): ElasticFlow estimates a plan for
every job after every GPU it hands out, about 10^7 plans on the largest ITP trace. The
arithmetic is the artifact's, operation for operation (numba does not reorder or fuse
floating-point operations), so the compiled plans equal the interpreted ones bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["Demand", "Plan", "PlanError", "Profile", "Tables", "plan"]


class PlanError(AssertionError):
    """A state ElasticFlow's artifact asserts never happens."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Free GPUs from each breakpoint (slots from now, the first 0) to the next; merged."""

    keys: tuple[int, ...]
    vals: tuple[int, ...]

    @classmethod
    def constant(cls, gpus: int) -> Profile:
        return cls((0,), (gpus,))


@dataclass(frozen=True, slots=True)
class Demand:
    """What the planner reads of a job: iterations left, absolute deadline, its levels (GPU
    counts up to its limit, ascending) and throughput at each, and its limit."""

    iter_left: float
    deadline: float
    levels: tuple[int, ...]
    rate: dict[int, float]
    max_gpus: int


@dataclass(frozen=True, slots=True)
class Plan:
    """One job's plan: its allocation (merged breakpoints, slots from now), its planned end
    (slots from now, on the grid), its real end (absolute seconds), whether that meets the
    deadline, and the free profile it leaves."""

    alloc: tuple[tuple[int, int], ...]
    end: int
    real_end: float
    ok: bool
    free: Profile

    def next_change(self) -> int | None:
        """The first breakpoint of its allocation after now: where the artifact schedules a
        scale event (`add_job_scale_event_new`)."""
        return self.alloc[1][0] if len(self.alloc) > 1 else None


class Tables:
    """A job type's levels, throughput by GPU count (NaN where not profiled) and the largest
    level that fits each count of free GPUs (0..cluster): what the compiled planner reads."""

    def __init__(self, levels: tuple[int, ...], rate: dict[int, float], gpus: int) -> None:
        self.levels = np.array(levels, dtype=np.int64)
        top = max(max(rate), gpus)
        self.rate = np.full(top + 1, np.nan)
        for g, r in rate.items():
            self.rate[g] = r
        self.fit = np.zeros(gpus + 1, dtype=np.int64)
        for g in levels:
            if g <= gpus:
                self.fit[g:] = g


def plan(
    job: Demand,
    free: Profile,
    now_s: float,
    slot_s: float,
    cluster_gpus: int,
    assign: int | None = None,
) -> Plan:
    """The job's plan from now on `free` (see the module doc); with `assign`, the estimate
    with that many GPUs from now (the artifact's scale-up estimate)."""
    tables = Tables(job.levels, job.rate, cluster_gpus)
    keys = np.array(free.keys, dtype=np.int64)
    vals = np.array(free.vals, dtype=np.int64)
    ws = workspace(len(keys) + 2)
    assign_ = -1 if assign is None else assign
    m, nxt = _load(ws, keys, vals, len(keys), keys[:0], vals[:0], -1, _align(job.deadline -
                   now_s, slot_s), tables.levels[0] <= cluster_gpus, cluster_gpus)  # fmt: skip
    na, end, real, ok, nf, _ = _plan_w(
        job.iter_left, job.deadline, tables.levels, tables.rate, tables.fit, job.max_gpus,
        m, nxt, now_s, slot_s, cluster_gpus, assign_, ws, True,
    )  # fmt: skip
    return Plan(
        tuple(zip(ws[5][:na].tolist(), ws[6][:na].tolist(), strict=True)),
        int(end),
        float(real),
        bool(ok),
        Profile(tuple(ws[7][:nf].tolist()), tuple(ws[8][:nf].tolist())),
    )


@njit(cache=True)
def workspace(size: int):  # type: ignore[no-untyped-def]
    """Scratch arrays for plans on profiles of up to `size` - 2 breakpoints: the working
    profile (keys, values, original values, which keys are original), the allocation being
    built, and the merged allocation and profile a plan returns."""
    return (
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        np.empty(size, np.bool_),
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        np.empty(size, np.int64),
    )


@njit(cache=True)
def _align(seconds: float, slot_s: float) -> int:
    """Seconds rounded up to whole slots, negative values too (`utils.align_to_time_slot`,
    with Python's float floor division and remainder)."""
    mod = np.fmod(seconds, slot_s)
    div = (seconds - mod) / slot_s
    if mod != 0.0 and ((slot_s < 0.0) != (mod < 0.0)):
        mod += slot_s
        div -= 1.0
    q = math.floor(div)
    if div - q > 0.5:
        q += 1.0
    return int(q) + (1 if mod > 0.0 else 0)


@njit(cache=True)
def _seconds(a: int, b: int, d_slot: int, ddl: float, now_s: float, slot_s: float) -> float:
    """A period's length; the one ending at the deadline's slot ends at the deadline."""
    if b == d_slot:
        return ddl - (now_s + a * slot_s)
    return (b - a) * slot_s


@njit(cache=True)
def _take(wv: np.ndarray, i: int, gpus: int) -> None:
    wv[i] -= gpus
    if wv[i] < 0:
        raise PlanError("a plan takes GPUs where fewer are free")


@njit(cache=True)
def _find(keys: np.ndarray, m: int, key: int) -> int:
    """The index of `key` among `m` sorted keys, -1 when absent."""
    i = _first_at_least(keys, m, key)
    return i if i < m and keys[i] == key else -1


@njit(cache=True)
def _put(wk: np.ndarray, wv: np.ndarray, m: int, key: int, value: int) -> int:
    """Set a breakpoint's value, inserting it in order if new; the new count of keys."""
    i = _first_at_least(wk, m, key)
    if i < m and wk[i] == key:
        wv[i] = value
        return m
    for j in range(m, i, -1):
        wk[j] = wk[j - 1]
        wv[j] = wv[j - 1]
    wk[i] = key
    wv[i] = value
    return m + 1


@njit(cache=True)
def _merge_into(keys, vals, m, out_k, out_v):  # type: ignore[no-untyped-def]
    """Keys with a set value (>= 0), each dropped whose value equals the previous kept one
    (`utils.merge_dict`), written to `out_k`, `out_v`; their count."""
    n = 0
    for i in range(m):
        if vals[i] < 0 or (n > 0 and out_v[n - 1] == vals[i]):
            continue
        out_k[n] = keys[i]
        out_v[n] = vals[i]
        n += 1
    return n


@njit(cache=True)
def _first_at_least(keys, m, key):  # type: ignore[no-untyped-def]
    """The index of the first of `m` sorted keys >= `key` (m when none)."""
    lo, hi = 0, m
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus):  # type: ignore[no-untyped-def]
    """Fill the working profile: the free profile (with a job's allocation `ak`, `av` given
    back up to `job_end` when it has one: the artifact's `get_marginal`), merged, with the
    deadline's slot inserted; which keys are the profile's own; and, when `zero`, the zero
    allocation at every key before the deadline's slot that MSS starts from. Returns the
    count of keys and the profile's first key after now (the deadline's slot when none)."""
    wk, wv, ov, orig, alloc = ws[0], ws[1], ws[2], ws[3], ws[4]
    na = ak.shape[0]
    i = j = m = 0
    f_val = a_val = 0
    last = -1
    d_done = d_slot < 0
    end_done = na == 0
    nxt = d_slot
    nxt_set = False
    while i < n or j < na or not end_done:
        t = 1 << 62
        if i < n:
            t = fk[i]
        if j < na and ak[j] < t:
            t = ak[j]
        if not end_done and job_end < t:
            t = job_end
        while i < n and fk[i] == t:
            f_val = fv[i]
            i += 1
        while j < na and ak[j] == t:
            a_val = av[j]
            j += 1
        if t == job_end:
            end_done = True
        value = f_val + (a_val if t < job_end else 0)
        if value > gpus:
            raise PlanError("a job's plan given back exceeds the cluster")
        if m > 0 and value == last:
            continue
        if not d_done and t > d_slot:  # the deadline's slot between two breakpoints
            wk[m], wv[m], orig[m], alloc[m] = d_slot, last, False, -1
            m += 1
        if t >= d_slot:
            d_done = True
        if t > 0 and not nxt_set:
            nxt, nxt_set = t, True
        wk[m], wv[m], ov[m], orig[m] = t, value, value, True
        alloc[m] = 0 if zero and t < d_slot else -1
        m += 1
        last = value
    if not d_done:
        wk[m], wv[m], orig[m], alloc[m] = d_slot, last, False, -1
        m += 1
    alloc[0] = 0
    return m, nxt


@njit(cache=True)
def _finish(ws, m, end, back, want_free):  # type: ignore[no-untyped-def]
    """The merged profile left free, with the job's end restored to `back` free GPUs unless
    the end was a breakpoint of the original profile; its count (0 when not wanted)."""
    if not want_free:
        return 0
    wk, wv, orig = ws[0], ws[1], ws[3]
    at = _find(wk, m, end)
    if at < 0 or not orig[at]:
        m = _put(wk, wv, m, end, back)
    return _merge_into(wk, wv, m, ws[7], ws[8])


@njit(cache=True)
def _gpu_seconds(ak, av, na, end, slot_s):  # type: ignore[no-untyped-def]
    """GPU-time of an allocation to `end` (`get_allocation_time`): each breakpoint's GPUs to
    the next breakpoint, the last one's to `end`."""
    total = 0.0
    for i in range(na - 1):
        total += av[i] * ((ak[i + 1] - ak[i]) * slot_s)
    return total + av[na - 1] * ((end - ak[na - 1]) * slot_s)


@njit(cache=True)
def _plan_w(left, ddl, levels, rate, fit, max_gpus, m, nxt, now_s, slot_s, gpus, assign, ws,
            want_free):  # type: ignore[no-untyped-def]  # fmt: skip
    """The compiled planner on a working profile from `_load` (`assign` < 0 for none).
    Leaves the merged allocation in ws[5], ws[6] and, when `want_free`, the merged profile
    left free in ws[7], ws[8]; returns their counts, the planned end (slots), the real end
    (seconds), whether it meets the deadline, and the allocation's GPU-seconds."""
    if not left > 0.0:
        raise PlanError("a job is planned with no iterations left")
    d_slot = _align(ddl - now_s, slot_s)
    wk, wv, ov, orig, av = ws[0], ws[1], ws[2], ws[3], ws[4]
    out_k, out_v = ws[5], ws[6]
    last_free = 0  # the artifact's `last_event_gpu`, carried across paths
    has_last = False
    at_d = _find(wk, m, d_slot)
    if at_d >= 0 and not orig[at_d]:
        last_free = wv[at_d]
        has_last = True
    start = 0

    if assign >= 0:
        av[0] = assign
        real = float(math.ceil(now_s + left / rate[assign]))
        end = _align(real - now_s, slot_s)
        if nxt >= end and ddl >= real:  # done within the first period, in time
            avail = wv[0]
            _take(wv, 0, assign)
            out_k[0], out_v[0] = 0, assign
            nf = _finish(ws, m, end, avail, want_free)
            return 1, end, real, real <= ddl, nf, assign * ((end - 0) * slot_s)
        left -= _seconds(0, nxt, d_slot, ddl, now_s, slot_s) * rate[assign]
        _take(wv, 0, assign)
        start = nxt
        at = _find(wk, m, nxt)
        if at < 0:
            raise PlanError("a scale-up estimate continues from a deadline already passed")
        av[at] = 0

    # MSS: the first cap whose backward fill from the deadline reaches the work. A cap is
    # skipped unwalked only when even its best level over the whole span falls short with a
    # margin far above the sum's rounding, so no outcome changes.
    first = _first_at_least(wk, m, start)
    below_d = _first_at_least(wk, m, d_slot)  # keys before the deadline's slot
    span = ddl - (now_s + start * slot_s)
    last_cap = 0
    point = 0
    found = False
    best = 0.0
    cap = 0
    for li in range(levels.shape[0]):
        cap = levels[li]
        if cap > gpus:
            break
        best = max(best, rate[cap])
        if span * best * (1.0 + 1e-9) < left:
            last_cap = cap
            continue
        period_end = d_slot
        reached = 0.0
        for i in range(below_d - 1, first - 1, -1):
            k = wk[i]
            g = cap if wv[i] >= cap else min(cap, fit[wv[i]])
            if g == 0:
                period_end = k
                continue
            reached += _seconds(k, period_end, d_slot, ddl, now_s, slot_s) * rate[g]
            if reached >= left:
                point = k
                found = True
                break
            period_end = k
        if found:
            break
        last_cap = cap

    if found:  # forward from the start, the previous cap before `point`, the cap after
        # The merged allocation is emitted as it is built, with its GPU-seconds (each run's
        # GPUs to where the next run starts, the last run's to the end: `_gpu_seconds`).
        na = 0
        used = 0.0
        if assign >= 0:
            out_k[0], out_v[0] = 0, assign
            na = 1
        lat = -1
        g = 0
        end = 0
        real = 0.0
        ended = False
        for i in range(first, m):
            t = wk[i]
            if t > d_slot:
                break
            if lat >= 0:
                av[lat] = g
                _take(wv, lat, g)
                if na == 0 or out_v[na - 1] != g:
                    if na > 0:
                        used += out_v[na - 1] * ((wk[lat] - out_k[na - 1]) * slot_s)
                    out_k[na], out_v[na] = wk[lat], g
                    na += 1
                if g != 0:
                    its = _seconds(wk[lat], t, d_slot, ddl, now_s, slot_s) * rate[g]
                    if wk[lat] < point or its < left:
                        if its >= left:
                            raise PlanError("a plan completes before the period MSS chose")
                        left -= its
                    else:
                        run = math.ceil(left / rate[g])
                        end = wk[lat] + _align(float(run), slot_s)
                        real = now_s + wk[lat] * slot_s + run
                        if end > t:
                            raise PlanError("a plan ends past the period it completes in")
                        ended = True
                        if t < d_slot:  # the zero breakpoint after it (`allocations`)
                            used += out_v[na - 1] * ((t - out_k[na - 1]) * slot_s)
                            out_k[na], out_v[na] = t, 0
                            na += 1
                        break
            lat = i
            g = min(cap if t >= point else last_cap, fit[wv[i]])
        if not ended:
            if lat < 0 or g == 0:
                raise PlanError("a plan completes at zero GPUs")
            av[lat] = g
            _take(wv, lat, g)
            if na == 0 or out_v[na - 1] != g:
                if na > 0:
                    used += out_v[na - 1] * ((wk[lat] - out_k[na - 1]) * slot_s)
                out_k[na], out_v[na] = wk[lat], g
                na += 1
            run = math.ceil(left / rate[g])
            end = wk[lat] + _align(float(run), slot_s)
            real = now_s + wk[lat] * slot_s + run
        used += out_v[na - 1] * ((end - out_k[na - 1]) * slot_s)
        back = gpus
        if want_free:
            for i in range(m):
                if orig[i] and start <= wk[i] < end:
                    back = ov[i]
        nf = _finish(ws, m, end, back, want_free)
        return na, end, real, real <= ddl, nf, used

    # The fallback: the largest cap to the deadline's slot, then what is free, to completion.
    lat = -1
    g = 0
    for i in range(first, m):
        t = wk[i]
        if t > d_slot:
            break
        if lat >= 0:
            av[lat] = g
            _take(wv, lat, g)
            if g != 0:
                its = _seconds(wk[lat], t, d_slot, ddl, now_s, slot_s) * rate[g]
                if its >= left:
                    raise PlanError("a fallback plan completes before its deadline")
                left -= its
        lat = i
        g = min(last_cap, fit[wv[i]])
    lat = _find(wk, m, max(d_slot, start))
    if lat < 0:
        raise PlanError("a fallback plan starts at a deadline already passed")
    for i in range(m):
        t = wk[i]
        if t <= d_slot:
            continue
        cap = min(fit[wv[lat]], max_gpus)
        av[lat] = cap
        if cap == 0:
            lat = i
            continue
        its = ((t - wk[lat]) * slot_s) * rate[cap]
        if its >= left:
            real = float(math.ceil(now_s + wk[lat] * slot_s + left / rate[cap]))
            end = _align(real - now_s, slot_s)
            if end > t:
                raise PlanError("a fallback plan ends past its period")
            for j in range(m):
                k = wk[j]
                if k < d_slot:
                    continue
                if k < end and orig[j]:
                    last_free = ov[j]
                    has_last = True
                if wk[lat] <= k < end:
                    _take(wv, j, cap)
            if not has_last:
                raise PlanError("the artifact reads an unset last_event_gpu here")
            if wk[lat] != end:
                wv[lat] = last_free - cap
                if wv[lat] < 0:
                    raise PlanError("a fallback plan takes more GPUs than are free")
            na = _merge_into(wk, av, m, out_k, out_v)
            nf = _finish(ws, m, end, last_free, want_free)
            return na, end, real, real <= ddl, nf, _gpu_seconds(out_k, out_v, na, end, slot_s)
        left -= its
        for j in range(m):
            if orig[j] and wk[j] < wk[lat]:
                last_free = wv[j]
                has_last = True
        for j in range(m):
            if wk[lat] <= wk[j] < t:
                _take(wv, j, cap)
        lat = i
    if not left > 0.0:
        raise PlanError("a fallback plan has no iterations left past the profile")
    cap = min(gpus, max_gpus) if assign < 0 else assign
    if cap >= rate.shape[0] or math.isnan(rate[cap]):
        raise PlanError("no throughput at the GPUs a plan past the profile runs at")
    av[lat] = cap
    real = float(math.ceil(now_s + wk[lat] * slot_s + left / rate[cap]))
    end = _align(real - now_s, slot_s)
    if not now_s + end * slot_s > ddl:
        raise PlanError("a plan past the profile ends by its deadline")
    wv[lat] = gpus - cap
    na = _merge_into(wk, av, m, out_k, out_v)
    nf = _finish(ws, m, end, gpus, want_free)
    return na, end, real, real <= ddl, nf, _gpu_seconds(out_k, out_v, na, end, slot_s)
