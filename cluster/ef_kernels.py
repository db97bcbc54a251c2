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

_MAX = float(sys.maxsize)  # the artifact's marginal for a job holding no GPUs (+) or stuck (-)
_NEVER = 1 << 62  # a slot past every profile
_DONE_FIRST, _MSS, _FALLBACK = 0, 1, 2  # the path a plan took (`_plan_w`)


class PlanError(AssertionError):
    """A state ElasticFlow's artifact asserts never happens."""


@njit(cache=True)
def workspace(size: int):  # type: ignore[no-untyped-def]
    """Scratch arrays for plans on profiles of up to `size` - 2 breakpoints: the working
    profile (keys, values, original values, which keys are original), the allocation being
    built, the merged allocation and profile a plan returns, and which path the last plan took
    with MSS's point and previous cap (`_plan_w`: what an estimate read, for its reuse)."""
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
        np.zeros(3, np.int64),
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
def _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus, short):  # type: ignore[no-untyped-def]
    """Fill the working profile: the free profile (with a job's allocation `ak`, `av` given
    back up to `job_end` when it has one: the artifact's `get_marginal`), merged, with the
    deadline's slot inserted; which keys are the profile's own; and, when `zero`, the zero
    allocation at every key before the deadline's slot that MSS starts from. With `short`,
    it stops at the first key after the deadline's slot: all a plan that meets its deadline
    reads (the fallback needs the rest). Returns the count of keys, the profile's first key
    after now (the deadline's slot when none), and whether keys were left out."""
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
        if short and t > d_slot and nxt_set and (i < n or j < na or not end_done):
            alloc[0] = 0
            return m, nxt, True
    if not d_done:
        wk[m], wv[m], orig[m], alloc[m] = d_slot, last, False, -1
        m += 1
    alloc[0] = 0
    return m, nxt, False


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
def _emit(out_k, out_v, na, used, key, gpus, slot_s):  # type: ignore[no-untyped-def]
    """Append a breakpoint to a merged allocation unless it repeats the last value, adding the
    run it closes to the GPU-seconds (the last run's GPUs to this key); (count, GPU-seconds)."""
    if na > 0 and out_v[na - 1] == gpus:
        return na, used
    if na > 0:
        used += out_v[na - 1] * ((key - out_k[na - 1]) * slot_s)
    out_k[na], out_v[na] = key, gpus
    return na + 1, used


@njit(cache=True)
def _plan_w(left, ddl, levels, rate, fit, max_gpus, m, nxt, now_s, slot_s, gpus, assign, ws,
            want_free, short):  # type: ignore[no-untyped-def]  # fmt: skip
    """The compiled planner on a working profile from `_load` (`assign` < 0 for none).
    Leaves the merged allocation in ws[5], ws[6] and, when `want_free`, the merged profile
    left free in ws[7], ws[8]; returns their counts, the planned end (slots), the real end
    (seconds), whether it meets the deadline, and the allocation's GPU-seconds. On a `short`
    profile a plan that needs the fallback returns -1 allocation breakpoints: load it whole
    and plan again."""
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
            ws[9][0] = _DONE_FIRST
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
        if last_cap == 0 and not want_free:
            # Every period before `point` runs at min(0, ...): a zero run, no work. An
            # estimate (no profile wanted) starts its walk at `point`.
            if wk[first] < point:
                na, used = _emit(out_k, out_v, na, used, wk[first], 0, slot_s)
                first = _first_at_least(wk, m, point)
        for i in range(first, m):
            t = wk[i]
            if t > d_slot:
                break
            if lat >= 0:
                av[lat] = g
                _take(wv, lat, g)
                na, used = _emit(out_k, out_v, na, used, wk[lat], g, slot_s)
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
                            na, used = _emit(out_k, out_v, na, used, t, 0, slot_s)
                        break
            lat = i
            g = min(cap if t >= point else last_cap, fit[wv[i]])
        if not ended:
            if lat < 0 or g == 0:
                raise PlanError("a plan completes at zero GPUs")
            av[lat] = g
            _take(wv, lat, g)
            na, used = _emit(out_k, out_v, na, used, wk[lat], g, slot_s)
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
        ws[9][0], ws[9][1], ws[9][2] = _MSS, point, last_cap
        return na, end, real, real <= ddl, nf, used

    # The fallback: the largest cap to the deadline's slot, then what is free, to completion.
    ws[9][0] = _FALLBACK
    if short:
        return -1, 0, 0.0, False, 0, 0.0
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


@njit(cache=True)
def _one(i, types, left, ddl, tab, fk, fv, n, now_s, slot_s, gpus, assign, ws, want_free,
         ak, av, job_end):  # type: ignore[no-untyped-def]  # fmt: skip
    """Job i's plan on the profile (with its allocation `ak`, `av` given back up to `job_end`
    when it has one): `_plan_w`'s results."""
    levels, nlevels, rate, fit, max_gpus = tab
    t = types[i]
    d_slot = _align(ddl[i] - now_s, slot_s)
    zero = levels[t, 0] <= gpus
    short = not want_free  # an estimate reads the profile to its deadline's slot only
    m, nxt, cut = _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus, short)
    result = _plan_w(
        left[i], ddl[i], levels[t, : nlevels[t]], rate[t], fit[t], max_gpus[t],
        m, nxt, now_s, slot_s, gpus, assign, ws, want_free, cut,
    )  # fmt: skip
    if result[0] >= 0:
        return result
    m, nxt, _ = _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus, False)
    return _plan_w(
        left[i], ddl[i], levels[t, : nlevels[t]], rate[t], fit[t], max_gpus[t],
        m, nxt, now_s, slot_s, gpus, assign, ws, want_free, False,
    )  # fmt: skip


@njit(cache=True)
def _estimate(i, types, left, ddl, tab, fk, fv, n, now_s, slot_s, gpus, assign, ws, ak, av,
              job_end):  # type: ignore[no-untyped-def]  # fmt: skip
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
    levels, nlevels, rate, fit, max_gpus = tab
    t = types[i]
    d_slot = _align(ddl[i] - now_s, slot_s)
    zero = levels[t, 0] <= gpus
    m, nxt, cut = _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus, True)
    at = _find(ws[0], m, nxt)
    reusable = at > 0 and ws[3][at]
    w0 = ws[1][0]
    wn = ws[1][at] if reusable else 0
    reach = ws[0][m - 1] if cut else _NEVER - 1  # every slot a change could be at
    result = _plan_w(
        left[i], ddl[i], levels[t, : nlevels[t]], rate[t], fit[t], max_gpus[t],
        m, nxt, now_s, slot_s, gpus, assign, ws, False, cut,
    )  # fmt: skip
    if result[0] < 0:
        m, nxt, _ = _load(ws, fk, fv, n, ak, av, job_end, d_slot, zero, gpus, False)
        result = _plan_w(
            left[i], ddl[i], levels[t, : nlevels[t]], rate[t], fit[t], max_gpus[t],
            m, nxt, now_s, slot_s, gpus, assign, ws, False, False,
        )  # fmt: skip
        return result, False, nxt, _NEVER, reach, w0, wn
    path, point, last_cap = ws[9][0], ws[9][1], ws[9][2]
    lo = nxt
    if path == _FALLBACK:
        reusable = False
    elif path == _DONE_FIRST:
        lo = _NEVER
    elif last_cap == 0 and point > nxt:
        lo = point - 1
    return result, reusable, nxt, lo, reach, w0, wn


@njit(cache=True)
def _change(ok, ov, on, nk, nv, nn, dk, dv):  # type: ignore[no-untyped-def]
    """How a grant changed the free profile (old keys `ok`, values `ov`; new `nk`, `nv`): the
    step function new - old over slots, merged, written to `dk`, `dv`; its count."""
    i = j = 0
    o_val = n_val = 0
    nd = 0
    while i < on or j < nn:
        t = _NEVER
        if i < on:
            t = ok[i]
        if j < nn and nk[j] < t:
            t = nk[j]
        while i < on and ok[i] == t:
            o_val = ov[i]
            i += 1
        while j < nn and nk[j] == t:
            n_val = nv[j]
            j += 1
        d = n_val - o_val
        if nd == 0 or dv[nd - 1] != d:
            dk[nd], dv[nd] = t, d
            nd += 1
    return nd


@njit(cache=True)
def _reads_same(nxt, lo, reach, w0, wn, dk, dv, nd):  # type: ignore[no-untyped-def]
    """Whether an estimate made before a grant (what it read: `_estimate`) reads the same
    after it (the grant's change: `_change`), so that it gives the same plan bit for bit:
    the change is constant before `nxt` and keeps `nxt` a breakpoint (free GPUs there still
    differ from those at now: the profile's merge would drop it), and is 0 from `lo` to
    `reach`. The caller knows the estimate may be reused at all."""
    if nd > 1 and dk[1] < nxt:
        return False
    c0 = dv[0]
    at_nxt = dv[1] if nd > 1 and dk[1] == nxt else c0
    if wn + at_nxt == w0 + c0:
        return False
    if lo > reach:
        return True
    k = _first_at_least(dk, nd, lo + 1) - 1  # the change's step holding `lo`
    return dv[k] == 0 and (k + 1 == nd or dk[k + 1] > reach)


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
def plan_round(types, left, ddl, tab, now_s, slot_s, gpus, reuse=True):  # type: ignore[no-untyped-def]
    """Every job's plan in this order on an empty cluster, then the idle-GPU hand-out
    (`reuse=False` makes every estimate afresh: the reference the reuse is tested against).
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
        # What each job's last estimate read (`_estimate`), to reuse its gain while a grant
        # leaves that unchanged (`_reads_same`): the same inputs give the same plan, so
        # reusing it changes no decision; about two thirds of the estimates of a large round.
        c_ok = np.zeros(count, np.bool_)
        c_nxt = np.zeros(count, np.int64)
        c_lo = np.zeros(count, np.int64)
        c_reach = np.zeros(count, np.int64)
        c_w0 = np.zeros(count, np.int64)
        c_wn = np.zeros(count, np.int64)
        dk = np.zeros(2 * width + 2, np.int64)  # the last grant's change of the profile
        dv = np.zeros(2 * width + 2, np.int64)
        dk[0], dv[0] = 0, 0
        nd = 1

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
                                                 c_wn[i], dk, dv, nd):  # fmt: skip
                c_w0[i] += dv[0]
                c_wn[i] += dv[_first_at_least(dk, nd, c_nxt[i] + 1) - 1]
                return gain[i]
            n = a_len[i]
            res, ok, nx, lo, reach, w0, wn = _estimate(
                i, types, left, ddl, tab, fk, fv, nf, now_s, slot_s, gpus, nxt[i], ws,
                a_keys[i, :n], a_vals[i, :n], end[i],
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
            dv[0] = 0
            for i in order:
                step = nxt[i] - held[i]
                if step > idle or step == 0:
                    continue
                _, na, e, r, ng, u = estimate(i, nf, idle, True)
                keep(i, na, e, r, u)
                nd = _change(fk, fv, nf, ws[7], ws[8], ng, dk, dv)
                nf = _adopt(ws, ng, fk, fv)
                idle -= step
                if fv[0] != idle:
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
    fk = np.zeros(size, np.int64)
    fv = np.zeros(size, np.int64)
    out_k = np.zeros(size, np.int64)
    out_v = np.zeros(size, np.int64)
    held = np.zeros(size, np.int64)  # the plan's GPUs in each period
    fv[0] = gpus
    n = 1
    now_gpus = np.zeros(count, np.int64)
    real = np.zeros(count)
    for j in range(count):
        t = types[j]
        work_left = left[j]
        end = 0
        for i in range(n):
            free = fv[i]
            g = base[j] if free >= base[j] else level[t, free]
            held[i] = g
            stop = np.inf if i + 1 == n else float(fk[i + 1])
            work = (stop - fk[i]) * slot_s * rate[t, g]
            if g and work >= work_left:
                real[j] = fk[i] * slot_s + math.ceil(work_left / rate[t, g] - 1e-9)
                end = math.ceil(real[j] / slot_s - 1e-9)
                break
            work_left -= work
        now_gpus[j] = held[0]
        back = fv[_first_at_least(fk, n, end + 1) - 1]  # free GPUs at the end, before the plan
        for i in range(n):
            if fk[i] < end:
                fv[i] -= held[i]
        n = _put(fk, fv, n, end, back)
        n = _merge_into(fk, fv, n, out_k, out_v)
        fk[:n] = out_k[:n]
        fv[:n] = out_v[:n]
    return now_gpus, real
