"""The compiled kernels of ElasticFlow's and EDF's planning (numba, over arrays).

The rules are documented where they are used: ElasticFlow's plan in `cluster.ef_planner`,
its rounds in `cluster.elasticflow`, EDF in `cluster.edf`. Every compiled function lives in
this one file because numba's on-disk cache (`cache=True`) invalidates a function when its
own file changes, not when a function it calls in another file does.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from numba import njit

__all__ = ["PlanError", "admits", "edf_round", "plan_round", "workspace"]

# The rows of a workspace (`workspace`). Arrays travel between the compiled functions as one
# 2-D array each, indexed by row, not as tuples of arrays or row views: numba takes a
# reference to every array a call passes or a view makes (an atomic add and its release), and
# with tuples and views that was half of a large trace's planning time.
WK, WV, OV, ORIG, ALLOC, OUT_K, OUT_V, FREE_K, FREE_V, META = range(10)
KEYS, VALS = 0, 1  # the rows of a profile or of a profile's change: keys (slots), values

_MAX = float(sys.maxsize)  # the artifact's marginal for a job holding no GPUs (+) or stuck (-)
_NEVER = 1 << 62  # a slot past every profile
_DONE_FIRST, _MSS, _FALLBACK = 0, 1, 2  # the path a plan took (`_plan_w`)


class PlanError(AssertionError):
    """A state ElasticFlow's artifact asserts never happens."""


@njit(cache=True)
def workspace(size: int):  # type: ignore[no-untyped-def]
    """Scratch rows for plans on profiles of up to `size` - 2 breakpoints: the working
    profile (WK keys, WV values, OV original values, ORIG 1 where a key is the profile's own),
    the allocation being built (ALLOC), the merged allocation (OUT_K, OUT_V) and profile
    (FREE_K, FREE_V) a plan returns, and in META the path the last plan took with MSS's point
    and previous cap (`_plan_w`: what an estimate read, for its reuse)."""
    return np.zeros((META + 1, max(size, 3)), np.int64)


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
def _take(ws: np.ndarray, i: int, gpus: int) -> None:
    ws[WV, i] -= gpus
    if ws[WV, i] < 0:
        raise PlanError("a plan takes GPUs where fewer are free")


@njit(cache=True)
def _find(ws: np.ndarray, m: int, key: int) -> int:
    """The index of `key` among the `m` sorted keys of the working profile, -1 when absent."""
    i = _first_at_least(ws, WK, m, key)
    return i if i < m and ws[WK, i] == key else -1


@njit(cache=True)
def _put(a: np.ndarray, k: int, v: int, m: int, key: int, value: int) -> int:
    """Set a breakpoint's value in rows `k` (keys), `v` (values) of `a`, inserting it in order
    if new; the new count of keys."""
    i = _first_at_least(a, k, m, key)
    if i < m and a[k, i] == key:
        a[v, i] = value
        return m
    for j in range(m, i, -1):
        a[k, j] = a[k, j - 1]
        a[v, j] = a[v, j - 1]
    a[k, i] = key
    a[v, i] = value
    return m + 1


@njit(cache=True)
def _merge_into(a, k, v, m, out, ok, ov):  # type: ignore[no-untyped-def]
    """Keys (row `k` of `a`) with a set value (row `v`, >= 0), each dropped whose value
    equals the previous kept one (`utils.merge_dict`), written to rows `ok`, `ov` of `out`;
    their count."""
    n = 0
    for i in range(m):
        if a[v, i] < 0 or (n > 0 and out[ov, n - 1] == a[v, i]):
            continue
        out[ok, n] = a[k, i]
        out[ov, n] = a[v, i]
        n += 1
    return n


@njit(cache=True)
def _first_at_least(a, k, m, key):  # type: ignore[no-untyped-def]
    """The index of the first of the `m` sorted keys in row `k` of `a` >= `key` (m when
    none)."""
    lo, hi = 0, m
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[k, mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _load(ws, free, n, a_keys, a_vals, row, na, job_end, d_slot, zero, gpus, short):  # type: ignore[no-untyped-def]  # noqa: E501
    """Fill the working profile: the free profile (`n` breakpoints of `free`; with a job's
    allocation, the first `na` breakpoints of row `row` of `a_keys`, `a_vals`, given back up
    to `job_end`: the artifact's `get_marginal`), merged, with the
    deadline's slot inserted; which keys are the profile's own; and, when `zero`, the zero
    allocation at every key before the deadline's slot that MSS starts from. With `short`,
    it stops at the first key after the deadline's slot: all a plan that meets its deadline
    reads (the fallback needs the rest). Returns the count of keys, the profile's first key
    after now (the deadline's slot when none), and whether keys were left out."""
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
            t = free[KEYS, i]
        if j < na and a_keys[row, j] < t:
            t = a_keys[row, j]
        if not end_done and job_end < t:
            t = job_end
        while i < n and free[KEYS, i] == t:
            f_val = free[VALS, i]
            i += 1
        while j < na and a_keys[row, j] == t:
            a_val = a_vals[row, j]
            j += 1
        if t == job_end:
            end_done = True
        value = f_val + (a_val if t < job_end else 0)
        if value > gpus:
            raise PlanError("a job's plan given back exceeds the cluster")
        if m > 0 and value == last:
            continue
        if not d_done and t > d_slot:  # the deadline's slot between two breakpoints
            ws[WK, m], ws[WV, m], ws[ORIG, m], ws[ALLOC, m] = d_slot, last, 0, -1
            m += 1
        if t >= d_slot:
            d_done = True
        if t > 0 and not nxt_set:
            nxt, nxt_set = t, True
        ws[WK, m], ws[WV, m], ws[OV, m], ws[ORIG, m] = t, value, value, 1
        ws[ALLOC, m] = 0 if zero and t < d_slot else -1
        m += 1
        last = value
        if short and t > d_slot and nxt_set and (i < n or j < na or not end_done):
            ws[ALLOC, 0] = 0
            return m, nxt, True
    if not d_done:
        ws[WK, m], ws[WV, m], ws[ORIG, m], ws[ALLOC, m] = d_slot, last, 0, -1
        m += 1
    ws[ALLOC, 0] = 0
    return m, nxt, False


@njit(cache=True)
def _finish(ws, m, end, back, want_free):  # type: ignore[no-untyped-def]
    """The merged profile left free, with the job's end restored to `back` free GPUs unless
    the end was a breakpoint of the original profile; its count (0 when not wanted)."""
    if not want_free:
        return 0
    at = _find(ws, m, end)
    if at < 0 or not ws[ORIG, at]:
        m = _put(ws, WK, WV, m, end, back)
    return _merge_into(ws, WK, WV, m, ws, FREE_K, FREE_V)


@njit(cache=True)
def _gpu_seconds(ws, na, end, slot_s):  # type: ignore[no-untyped-def]
    """GPU-time of the merged allocation to `end` (`get_allocation_time`): each breakpoint's
    GPUs to the next breakpoint, the last one's to `end`."""
    total = 0.0
    for i in range(na - 1):
        total += ws[OUT_V, i] * ((ws[OUT_K, i + 1] - ws[OUT_K, i]) * slot_s)
    return total + ws[OUT_V, na - 1] * ((end - ws[OUT_K, na - 1]) * slot_s)


@njit(cache=True)
def _emit(ws, na, used, key, gpus, slot_s):  # type: ignore[no-untyped-def]
    """Append a breakpoint to the merged allocation unless it repeats the last value, adding
    the run it closes to the GPU-seconds (the last run's GPUs to this key); (count,
    GPU-seconds)."""
    if na > 0 and ws[OUT_V, na - 1] == gpus:
        return na, used
    if na > 0:
        used += ws[OUT_V, na - 1] * ((key - ws[OUT_K, na - 1]) * slot_s)
    ws[OUT_K, na], ws[OUT_V, na] = key, gpus
    return na + 1, used


@njit(cache=True)
def _plan_w(left, ddl, typ, levels, nlevels, rate, fit, max_gpus, m, nxt, now_s, slot_s, gpus,
            assign, ws, want_free, short):  # type: ignore[no-untyped-def]  # fmt: skip
    """The compiled planner on a working profile from `_load`, for a job of type `typ` (a row
    of the tables; `assign` < 0 for none). Leaves the merged allocation in the rows OUT_K,
    OUT_V of `ws` and, when `want_free`, the merged profile left free in FREE_K, FREE_V;
    returns their counts, the planned end (slots), the real end (seconds), whether it meets
    the deadline, and the allocation's GPU-seconds. On a `short` profile a plan that needs
    the fallback returns -1 allocation breakpoints: load it whole and plan again."""
    if not left > 0.0:
        raise PlanError("a job is planned with no iterations left")
    d_slot = _align(ddl - now_s, slot_s)
    last_free = 0  # the artifact's `last_event_gpu`, carried across paths
    has_last = False
    at_d = _find(ws, m, d_slot)
    if at_d >= 0 and not ws[ORIG, at_d]:
        last_free = ws[WV, at_d]
        has_last = True
    start = 0

    if assign >= 0:
        ws[ALLOC, 0] = assign
        real = float(math.ceil(now_s + left / rate[typ, assign]))
        end = _align(real - now_s, slot_s)
        if nxt >= end and ddl >= real:  # done within the first period, in time
            ws[META, 0] = _DONE_FIRST
            avail = ws[WV, 0]
            _take(ws, 0, assign)
            ws[OUT_K, 0], ws[OUT_V, 0] = 0, assign
            nf = _finish(ws, m, end, avail, want_free)
            return 1, end, real, real <= ddl, nf, assign * ((end - 0) * slot_s)
        left -= _seconds(0, nxt, d_slot, ddl, now_s, slot_s) * rate[typ, assign]
        _take(ws, 0, assign)
        start = nxt
        at = _find(ws, m, nxt)
        if at < 0:
            raise PlanError("a scale-up estimate continues from a deadline already passed")
        ws[ALLOC, at] = 0

    # MSS: the first cap whose backward fill from the deadline reaches the work. A cap is
    # skipped unwalked only when even its best level over the whole span falls short with a
    # margin far above the sum's rounding, so no outcome changes.
    first = _first_at_least(ws, WK, m, start)
    below_d = _first_at_least(ws, WK, m, d_slot)  # keys before the deadline's slot
    span = ddl - (now_s + start * slot_s)
    last_cap = 0
    point = 0
    found = False
    best = 0.0
    cap = 0
    for li in range(nlevels[typ]):
        cap = levels[typ, li]
        if cap > gpus:
            break
        best = max(best, rate[typ, cap])
        if span * best * (1.0 + 1e-9) < left:
            last_cap = cap
            continue
        period_end = d_slot
        reached = 0.0
        for i in range(below_d - 1, first - 1, -1):
            k = ws[WK, i]
            g = cap if ws[WV, i] >= cap else min(cap, fit[typ, ws[WV, i]])
            if g == 0:
                period_end = k
                continue
            reached += _seconds(k, period_end, d_slot, ddl, now_s, slot_s) * rate[typ, g]
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
            ws[OUT_K, 0], ws[OUT_V, 0] = 0, assign
            na = 1
        lat = -1
        g = 0
        end = 0
        real = 0.0
        ended = False
        if last_cap == 0 and not want_free:
            # Every period before `point` runs at min(0, ...): a zero run, no work. An
            # estimate (no profile wanted) starts its walk at `point`.
            if ws[WK, first] < point:
                na, used = _emit(ws, na, used, ws[WK, first], 0, slot_s)
                first = _first_at_least(ws, WK, m, point)
        for i in range(first, m):
            t = ws[WK, i]
            if t > d_slot:
                break
            if lat >= 0:
                ws[ALLOC, lat] = g
                _take(ws, lat, g)
                na, used = _emit(ws, na, used, ws[WK, lat], g, slot_s)
                if g != 0:
                    its = _seconds(ws[WK, lat], t, d_slot, ddl, now_s, slot_s) * rate[typ, g]
                    if ws[WK, lat] < point or its < left:
                        if its >= left:
                            raise PlanError("a plan completes before the period MSS chose")
                        left -= its
                    else:
                        run = math.ceil(left / rate[typ, g])
                        end = ws[WK, lat] + _align(float(run), slot_s)
                        real = now_s + ws[WK, lat] * slot_s + run
                        if end > t:
                            raise PlanError("a plan ends past the period it completes in")
                        ended = True
                        if t < d_slot:  # the zero breakpoint after it (`allocations`)
                            na, used = _emit(ws, na, used, t, 0, slot_s)
                        break
            lat = i
            g = min(cap if t >= point else last_cap, fit[typ, ws[WV, i]])
        if not ended:
            if lat < 0 or g == 0:
                raise PlanError("a plan completes at zero GPUs")
            ws[ALLOC, lat] = g
            _take(ws, lat, g)
            na, used = _emit(ws, na, used, ws[WK, lat], g, slot_s)
            run = math.ceil(left / rate[typ, g])
            end = ws[WK, lat] + _align(float(run), slot_s)
            real = now_s + ws[WK, lat] * slot_s + run
        used += ws[OUT_V, na - 1] * ((end - ws[OUT_K, na - 1]) * slot_s)
        back = gpus
        if want_free:
            for i in range(m):
                if ws[ORIG, i] and start <= ws[WK, i] < end:
                    back = ws[OV, i]
        nf = _finish(ws, m, end, back, want_free)
        ws[META, 0], ws[META, 1], ws[META, 2] = _MSS, point, last_cap
        return na, end, real, real <= ddl, nf, used

    # The fallback: the largest cap to the deadline's slot, then what is free, to completion.
    ws[META, 0] = _FALLBACK
    if short:
        return -1, 0, 0.0, False, 0, 0.0
    lat = -1
    g = 0
    for i in range(first, m):
        t = ws[WK, i]
        if t > d_slot:
            break
        if lat >= 0:
            ws[ALLOC, lat] = g
            _take(ws, lat, g)
            if g != 0:
                its = _seconds(ws[WK, lat], t, d_slot, ddl, now_s, slot_s) * rate[typ, g]
                if its >= left:
                    raise PlanError("a fallback plan completes before its deadline")
                left -= its
        lat = i
        g = min(last_cap, fit[typ, ws[WV, i]])
    lat = _find(ws, m, max(d_slot, start))
    if lat < 0:
        raise PlanError("a fallback plan starts at a deadline already passed")
    for i in range(m):
        t = ws[WK, i]
        if t <= d_slot:
            continue
        cap = min(fit[typ, ws[WV, lat]], max_gpus[typ])
        ws[ALLOC, lat] = cap
        if cap == 0:
            lat = i
            continue
        its = ((t - ws[WK, lat]) * slot_s) * rate[typ, cap]
        if its >= left:
            real = float(math.ceil(now_s + ws[WK, lat] * slot_s + left / rate[typ, cap]))
            end = _align(real - now_s, slot_s)
            if end > t:
                raise PlanError("a fallback plan ends past its period")
            for j in range(m):
                k = ws[WK, j]
                if k < d_slot:
                    continue
                if k < end and ws[ORIG, j]:
                    last_free = ws[OV, j]
                    has_last = True
                if ws[WK, lat] <= k < end:
                    _take(ws, j, cap)
            if not has_last:
                raise PlanError("the artifact reads an unset last_event_gpu here")
            if ws[WK, lat] != end:
                ws[WV, lat] = last_free - cap
                if ws[WV, lat] < 0:
                    raise PlanError("a fallback plan takes more GPUs than are free")
            na = _merge_into(ws, WK, ALLOC, m, ws, OUT_K, OUT_V)
            nf = _finish(ws, m, end, last_free, want_free)
            return na, end, real, real <= ddl, nf, _gpu_seconds(ws, na, end, slot_s)
        left -= its
        for j in range(m):
            if ws[ORIG, j] and ws[WK, j] < ws[WK, lat]:
                last_free = ws[WV, j]
                has_last = True
        for j in range(m):
            if ws[WK, lat] <= ws[WK, j] < t:
                _take(ws, j, cap)
        lat = i
    if not left > 0.0:
        raise PlanError("a fallback plan has no iterations left past the profile")
    cap = min(gpus, max_gpus[typ]) if assign < 0 else assign
    if cap >= rate.shape[1] or math.isnan(rate[typ, cap]):
        raise PlanError("no throughput at the GPUs a plan past the profile runs at")
    ws[ALLOC, lat] = cap
    real = float(math.ceil(now_s + ws[WK, lat] * slot_s + left / rate[typ, cap]))
    end = _align(real - now_s, slot_s)
    if not now_s + end * slot_s > ddl:
        raise PlanError("a plan past the profile ends by its deadline")
    ws[WV, lat] = gpus - cap
    na = _merge_into(ws, WK, ALLOC, m, ws, OUT_K, OUT_V)
    nf = _finish(ws, m, end, gpus, want_free)
    return na, end, real, real <= ddl, nf, _gpu_seconds(ws, na, end, slot_s)


@njit(cache=True)
def _one(i, types, left, ddl, levels, nlevels, rate, fit, max_gpus, free, n, now_s, slot_s,
         gpus, assign, ws, want_free, a_keys, a_vals, na, job_end):  # type: ignore[no-untyped-def]  # fmt: skip  # noqa: E501
    """Job i's plan on the profile (with its allocation, the first `na` breakpoints of row i of
    `a_keys`, `a_vals`, given back up to `job_end` when it has one): `_plan_w`'s results."""
    t = types[i]
    d_slot = _align(ddl[i] - now_s, slot_s)
    zero = levels[t, 0] <= gpus
    short = not want_free  # an estimate reads the profile to its deadline's slot only
    m, nxt, cut = _load(ws, free, n, a_keys, a_vals, i, na, job_end, d_slot, zero, gpus, short)
    result = _plan_w(
        left[i], ddl[i], t, levels, nlevels, rate, fit, max_gpus,
        m, nxt, now_s, slot_s, gpus, assign, ws, want_free, cut,
    )  # fmt: skip
    if result[0] >= 0:
        return result
    m, nxt, _ = _load(ws, free, n, a_keys, a_vals, i, na, job_end, d_slot, zero, gpus, False)
    return _plan_w(
        left[i], ddl[i], t, levels, nlevels, rate, fit, max_gpus,
        m, nxt, now_s, slot_s, gpus, assign, ws, want_free, False,
    )  # fmt: skip


@njit(cache=True)
def _estimate(i, types, left, ddl, levels, nlevels, rate, fit, max_gpus, free, n, now_s,
              slot_s, gpus, assign, ws, a_keys, a_vals, na, job_end):  # type: ignore[no-untyped-def]  # fmt: skip  # noqa: E501
    """`_one` for a scale-up estimate (no profile wanted), with what it read of the working
    profile, so that a later estimate on a changed profile can tell whether it would read the
    same (`_reads_same`). Returns the plan, then: whether it may be reused at all (not when
    the fallback ran, which reads the first period's free GPUs, or when no breakpoint follows
    now); the first breakpoint after now (`nxt`; of the first period the plan reads only
    where it ends); from which slot on it read every key and value (`lo`), to which (`reach`,
    the last key loaded; _NEVER - 1 for the whole profile); and the free GPUs at now and at
    `nxt`. What it read from `lo` on: from `nxt` in general (MSS's walks of the caps that
    fail start there); from the slot before MSS's point when the job's first level won at
    once (then nothing reads the periods between `nxt` and the point but where they start);
    nothing past `nxt` when the plan completes in the first period."""
    t = types[i]
    d_slot = _align(ddl[i] - now_s, slot_s)
    zero = levels[t, 0] <= gpus
    m, nxt, cut = _load(ws, free, n, a_keys, a_vals, i, na, job_end, d_slot, zero, gpus, True)
    at = _find(ws, m, nxt)
    reusable = at > 0 and ws[ORIG, at] != 0
    w0 = ws[WV, 0]
    wn = ws[WV, at] if reusable else 0
    reach = ws[WK, m - 1] if cut else _NEVER - 1  # every slot a change could be at
    result = _plan_w(
        left[i], ddl[i], t, levels, nlevels, rate, fit, max_gpus,
        m, nxt, now_s, slot_s, gpus, assign, ws, False, cut,
    )  # fmt: skip
    if result[0] < 0:
        m, nxt, _ = _load(ws, free, n, a_keys, a_vals, i, na, job_end, d_slot, zero, gpus, False)
        result = _plan_w(
            left[i], ddl[i], t, levels, nlevels, rate, fit, max_gpus,
            m, nxt, now_s, slot_s, gpus, assign, ws, False, False,
        )  # fmt: skip
        return result, False, nxt, _NEVER, reach, w0, wn
    path, point, last_cap = ws[META, 0], ws[META, 1], ws[META, 2]
    lo = nxt
    if path == _FALLBACK:
        reusable = False
    elif path == _DONE_FIRST:
        lo = _NEVER
    elif last_cap == 0 and point > nxt:
        lo = point - 1
    return result, reusable, nxt, lo, reach, w0, wn


@njit(cache=True)
def _change(free, on, ws, nn, delta):  # type: ignore[no-untyped-def]
    """How a grant changed the free profile (old: `on` breakpoints of `free`; new: `nn` of the
    rows FREE_K, FREE_V of `ws`): the step function new - old over slots, merged, written to
    `delta`; its count."""
    i = j = 0
    o_val = n_val = 0
    nd = 0
    while i < on or j < nn:
        t = _NEVER
        if i < on:
            t = free[KEYS, i]
        if j < nn and ws[FREE_K, j] < t:
            t = ws[FREE_K, j]
        while i < on and free[KEYS, i] == t:
            o_val = free[VALS, i]
            i += 1
        while j < nn and ws[FREE_K, j] == t:
            n_val = ws[FREE_V, j]
            j += 1
        d = n_val - o_val
        if nd == 0 or delta[VALS, nd - 1] != d:
            delta[KEYS, nd], delta[VALS, nd] = t, d
            nd += 1
    return nd


@njit(cache=True)
def _reads_same(nxt, lo, reach, w0, wn, delta, nd):  # type: ignore[no-untyped-def]
    """Whether an estimate made before a grant (what it read: `_estimate`) reads the same
    after it (the grant's change: `_change`), so that it gives the same plan bit for bit:
    the change is constant before `nxt` and keeps `nxt` a breakpoint (free GPUs there still
    differ from those at now: the profile's merge would drop it), and is 0 from `lo` to
    `reach`. The caller knows the estimate may be reused at all."""
    if nd > 1 and delta[KEYS, 1] < nxt:
        return False
    c0 = delta[VALS, 0]
    at_nxt = delta[VALS, 1] if nd > 1 and delta[KEYS, 1] == nxt else c0
    if wn + at_nxt == w0 + c0:
        return False
    if lo > reach:
        return True
    k = _first_at_least(delta, KEYS, nd, lo + 1) - 1  # the change's step holding `lo`
    return delta[VALS, k] == 0 and (k + 1 == nd or delta[KEYS, k + 1] > reach)


@njit(cache=True)
def _profiles(count):  # type: ignore[no-untyped-def]
    """The free profile (keys, values) and a workspace for a round of `count` jobs. A
    profile has a few breakpoints a job (its end, its deadline's slot) and is checked to stay
    within 4 a job; a profile with a job given back has at most the profile's and the job's
    breakpoints, and the workspace holds that."""
    size = 4 * count + 16
    return np.zeros((2, size), np.int64), workspace(2 * size + 4)


@njit(cache=True)
def _adopt(ws, nf, free):  # type: ignore[no-untyped-def]
    """Make the profile a plan left (rows FREE_K, FREE_V of `ws`) the round's free profile."""
    if nf > free.shape[1] - 4:
        raise PlanError("a profile has more breakpoints than the round allows for")
    for j in range(nf):
        free[KEYS, j] = ws[FREE_K, j]
        free[VALS, j] = ws[FREE_V, j]
    return nf


@njit(cache=True)
def admits(types, left, ddl, tab, now_s, slot_s, gpus):  # type: ignore[no-untyped-def]
    """Whether every job, planned in this order on an empty cluster, meets its deadline
    (the artifact's admission test, `estimate_all_jobs`)."""
    levels, nlevels, rate, fit, max_gpus = tab
    free, ws = _profiles(types.shape[0])
    free[VALS, 0] = gpus
    nf = 1
    none = np.zeros((1, 1), np.int64)
    for i in range(types.shape[0]):
        _, _, _, ok, nf2, _ = _one(i, types, left, ddl, levels, nlevels, rate, fit, max_gpus,
                                   free, nf, now_s, slot_s, gpus, -1, ws, True, none, none, 0,
                                   -1)  # fmt: skip
        if not ok:
            return False
        nf = _adopt(ws, nf2, free)
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
def plan_round(types, left, ddl, tab, now_s, slot_s, gpus, reuse=True):  # type: ignore[no-untyped-def]
    """Every job's plan in this order on an empty cluster, then the idle-GPU hand-out
    (`reuse=False` makes every estimate afresh: the reference the reuse is tested against).
    Returns the job order the hand-out leaves (indices), and per job its GPUs now, planned
    end (slots), real end (seconds) and next allocation change (slots; -1 for none)."""
    levels, nlevels, rate, fit, max_gpus = tab
    count = types.shape[0]
    free, ws = _profiles(count)
    width = free.shape[1]
    a_keys = np.zeros((count, width), np.int64)
    a_vals = np.zeros((count, width), np.int64)
    a_len = np.zeros(count, np.int64)
    end = np.zeros(count, np.int64)
    real = np.zeros(count)
    held = np.zeros(count, np.int64)
    used = np.zeros(count)  # GPU-seconds of each job's plan

    def keep(i, na, e, r, u):  # type: ignore[no-untyped-def]
        if na > width:
            raise PlanError("a plan has more breakpoints than the round allows for")
        a_len[i] = na
        for j in range(na):
            a_keys[i, j] = ws[OUT_K, j]
            a_vals[i, j] = ws[OUT_V, j]
        end[i], real[i], held[i], used[i] = e, r, ws[OUT_V, 0], u

    free[VALS, 0] = gpus
    nf = 1
    for i in range(count):
        na, e, r, _, nf2, u = _one(i, types, left, ddl, levels, nlevels, rate, fit, max_gpus,
                                   free, nf, now_s, slot_s, gpus, -1, ws, True, a_keys,
                                   a_vals, 0, -1)  # fmt: skip
        keep(i, na, e, r, u)
        nf = _adopt(ws, nf2, free)
    order = np.arange(count)
    idle = gpus - held.sum()
    if free[VALS, 0] != idle:
        raise PlanError("the profile's free GPUs now differ from the idle GPUs")
    if idle > 0:
        nxt = np.zeros(count, np.int64)
        for i in range(count):
            nxt[i] = _next_level(levels[types[i]], nlevels[types[i]], held[i])
        gain = np.zeros(count)
        # What each job's last estimate read (`_estimate`), to reuse its gain while a grant
        # leaves that unchanged (`_reads_same`): the same inputs give the same plan, so
        # reusing it changes no decision; about two thirds of the estimates of a large round.
        c_ok = np.zeros(count, np.bool_)
        c_nxt = np.zeros(count, np.int64)
        c_lo = np.zeros(count, np.int64)
        c_reach = np.zeros(count, np.int64)
        c_w0 = np.zeros(count, np.int64)
        c_wn = np.zeros(count, np.int64)
        delta = np.zeros((2, 2 * width + 2), np.int64)  # the last grant's change of the profile
        nd = 1

        def estimate(i, nf, idle, want_free):  # type: ignore[no-untyped-def]
            """The job's plan one level up (the artifact's `get_marginal`) and its gain in
            GPU-seconds per GPU; -inf when it cannot grow or does not fit, +inf when it
            holds no GPUs (the artifact's `sys.maxsize`)."""
            step = nxt[i] - held[i]
            if step > idle or step == 0:
                return -_MAX, 0, 0, 0.0, 0, 0.0
            na, e, r, _, ng, u = _one(i, types, left, ddl, levels, nlevels, rate, fit,
                                      max_gpus, free, nf, now_s, slot_s, gpus, nxt[i], ws,
                                      want_free, a_keys, a_vals, a_len[i], end[i])  # fmt: skip
            if held[i] == 0:
                return _MAX, na, e, r, ng, u
            return (u - used[i]) / step, na, e, r, ng, u

        def gain_of(i, nf, idle, nd):  # type: ignore[no-untyped-def]
            """`estimate`'s gain, its plan made only when needed: a job holding no GPUs
            gains +inf whatever its plan, and an estimate that would read what the last
            one read gives what that gave."""
            step = nxt[i] - held[i]
            if step > idle or step == 0:
                c_ok[i] = False
                return -_MAX
            if held[i] == 0:
                c_ok[i] = False
                return _MAX
            if reuse and c_ok[i] and _reads_same(c_nxt[i], c_lo[i], c_reach[i], c_w0[i],
                                                 c_wn[i], delta, nd):  # fmt: skip
                c_w0[i] += delta[VALS, 0]
                c_wn[i] += delta[VALS, _first_at_least(delta, KEYS, nd, c_nxt[i] + 1) - 1]
                return gain[i]
            res, ok, nx, lo, reach, w0, wn = _estimate(
                i, types, left, ddl, levels, nlevels, rate, fit, max_gpus, free, nf, now_s,
                slot_s, gpus, nxt[i], ws, a_keys, a_vals, a_len[i], end[i],
            )  # fmt: skip
            c_ok[i], c_nxt[i], c_lo[i], c_reach[i] = ok, nx, lo, reach
            c_w0[i], c_wn[i] = w0, wn
            return (res[5] - used[i]) / step

        for i in order:
            gain[i] = gain_of(i, nf, idle, nd)
        order = order[np.argsort(-gain[order], kind="mergesort")]
        granted = True
        while idle > 0 and granted:
            granted = False
            nd = 1  # no grant: no change
            delta[VALS, 0] = 0
            for i in order:
                step = nxt[i] - held[i]
                if step > idle or step == 0:
                    continue
                _, na, e, r, ng, u = estimate(i, nf, idle, True)
                keep(i, na, e, r, u)
                nd = _change(free, nf, ws, ng, delta)
                nf = _adopt(ws, ng, free)
                idle -= step
                if free[VALS, 0] != idle:
                    raise PlanError("a granted plan leaves other than the idle GPUs free")
                nxt[i] = _next_level(levels[types[i]], nlevels[types[i]], held[i])
                c_ok[i] = False
                granted = True
                break
            for i in order:
                if nxt[i] > held[i]:
                    gain[i] = gain_of(i, nf, idle, nd)
            order = order[np.argsort(-gain[order], kind="mergesort")]
    change = np.full(count, -1, np.int64)
    for i in range(count):
        if a_len[i] > 1:
            change[i] = a_keys[i, 1]
    return order, held, end, real, change


@njit(cache=True)
def edf_round(types, base, left, level, rate, slot_s, gpus):  # type: ignore[no-untyped-def]
    """Each job's GPUs now and real end (seconds from now), planned in this order on a fresh
    profile: per period, `base` GPUs where that many are free, else the largest level that is;
    the plan's GPUs leave the profile up to its end rounded up to a slot."""
    count = types.shape[0]
    size = 2 * count + 4
    prof = np.zeros((4, size), np.int64)  # the profile (KEYS, VALS) and its merge (rows 2, 3)
    held = np.zeros(size, np.int64)  # the plan's GPUs in each period
    prof[VALS, 0] = gpus
    n = 1
    now_gpus = np.zeros(count, np.int64)
    real = np.zeros(count)
    for j in range(count):
        t = types[j]
        work_left = left[j]
        end = 0
        for i in range(n):
            free = prof[VALS, i]
            g = base[j] if free >= base[j] else level[t, free]
            held[i] = g
            stop = np.inf if i + 1 == n else float(prof[KEYS, i + 1])
            work = (stop - prof[KEYS, i]) * slot_s * rate[t, g]
            if g and work >= work_left:
                real[j] = prof[KEYS, i] * slot_s + math.ceil(work_left / rate[t, g] - 1e-9)
                end = math.ceil(real[j] / slot_s - 1e-9)
                break
            work_left -= work
        now_gpus[j] = held[0]
        # free GPUs at the end, before the plan
        back = prof[VALS, _first_at_least(prof, KEYS, n, end + 1) - 1]
        for i in range(n):
            if prof[KEYS, i] < end:
                prof[VALS, i] -= held[i]
        n = _put(prof, KEYS, VALS, n, end, back)
        n = _merge_into(prof, KEYS, VALS, n, prof, 2, 3)
        prof[KEYS, :n] = prof[2, :n]
        prof[VALS, :n] = prof[3, :n]
    return now_gpus, real
