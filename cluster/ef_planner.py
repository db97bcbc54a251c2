"""ElasticFlow's per-job plan on a free-GPU profile, computed as its artifact computes it.

The artifact's `ef_sim_allocation` (scheduler.py of pkusys/ElasticFlow, commit 04a0109) gives
one job GPUs per period of a free-GPU profile. Its numbers depend on details the paper does
not state, so each is reproduced here and named (the artifact's variable in brackets):

- A profile is a step function of free GPUs over slots from now (`Profile`); it is kept
  merged (`utils.merge_dict`): a breakpoint whose value equals the previous one is dropped,
  and the periods a plan walks are the runs between breakpoints. The deadline's slot
  (`aligned_ddl`, the deadline rounded up to the slot grid) is added as a breakpoint while
  planning, and the period ending there lasts only to the exact deadline.
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
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

__all__ = ["Demand", "Plan", "PlanError", "Profile", "gpu_seconds", "plan"]


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

    @classmethod
    def merged(cls, keys: list[int], vals: list[int]) -> Profile:
        """Drop every breakpoint whose value equals the one kept before it (the first stays)."""
        out_k: list[int] = []
        out_v: list[int] = []
        for k, v in zip(keys, vals, strict=True):
            if out_v and out_v[-1] == v:
                continue
            out_k.append(k)
            out_v.append(v)
        return cls(tuple(out_k), tuple(out_v))

    def at(self, slot: int) -> int:
        return self.vals[bisect_right(self.keys, slot) - 1]

    def with_job(self, alloc: tuple[tuple[int, int], ...], end: int) -> Profile:
        """This profile with a job's allocation added back up to its planned end (what the
        artifact's `get_marginal` frees before estimating a larger allocation)."""
        points = sorted({*self.keys, end, *(k for k, _ in alloc)})
        a_keys = [k for k, _ in alloc]
        vals = []
        for t in points:
            held = alloc[bisect_right(a_keys, t) - 1][1] if t < end and t >= a_keys[0] else 0
            vals.append(self.at(t) + held)
        return Profile.merged(points, vals)


@dataclass(frozen=True, slots=True)
class Demand:
    """What the planner reads of a job: iterations left, absolute deadline, its levels (GPU
    counts up to its limit, ascending) and throughput at each."""

    iter_left: float
    deadline: float
    levels: tuple[int, ...]
    rate: dict[int, float]
    max_gpus: int

    def fits(self, free: int) -> int:
        """The largest level <= `free` GPUs, 0 when none (the artifact's `get_last_level`)."""
        if free == -1:
            raise PlanError("a profile reached -1 free GPUs")
        i = bisect_right(self.levels, free)
        return self.levels[i - 1] if i else 0


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

    @property
    def gpus_now(self) -> int:
        return self.alloc[0][1]

    def next_change(self) -> int | None:
        """The first breakpoint of its allocation after now: where the artifact schedules a
        scale event (`add_job_scale_event_new`)."""
        return self.alloc[1][0] if len(self.alloc) > 1 else None


def gpu_seconds(alloc: tuple[tuple[int, int], ...], end: int, slot_s: float) -> float:
    """GPU-time of an allocation to `end` (the artifact's `get_allocation_time`): each
    breakpoint's GPUs to the next breakpoint, the last one's to `end`."""
    total = 0.0
    for (k, g), (k2, _) in zip(alloc, alloc[1:], strict=False):
        total += g * ((k2 - k) * slot_s)
    last_k, last_g = alloc[-1]
    return total + last_g * ((end - last_k) * slot_s)


def _align(seconds: float, slot_s: float) -> int:
    """Seconds rounded up to whole slots, negative values too (`utils.align_to_time_slot`)."""
    q, r = divmod(seconds, slot_s)
    return int(q) + (r > 0)


class _Work:
    """The profile being planned on (`new_future_free_gpus`): sorted keys and their values."""

    __slots__ = ("keys", "val")

    def __init__(self, free: Profile) -> None:
        self.keys = list(free.keys)
        self.val = dict(zip(free.keys, free.vals, strict=True))

    def put(self, key: int, value: int) -> None:
        if key not in self.val:
            insort(self.keys, key)
        self.val[key] = value

    def take(self, key: int, gpus: int) -> None:
        self.val[key] -= gpus
        if self.val[key] < 0:
            raise PlanError(f"a plan takes {gpus} GPUs where fewer are free")

    def profile(self) -> Profile:
        return Profile.merged(self.keys, [self.val[k] for k in self.keys])


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
    left = job.iter_left
    if not left > 0:
        raise PlanError("a job is planned with no iterations left")
    ddl = job.deadline
    d_slot = _align(ddl - now_s, slot_s)
    orig = dict(zip(free.keys, free.vals, strict=True))
    work = _Work(free)
    last_free: int | None = None  # the artifact's `last_event_gpu`, carried across paths
    if d_slot not in orig and d_slot >= 0:
        last_free = work.val[work.keys[bisect_left(work.keys, d_slot) - 1]]
        work.put(d_slot, last_free)
    alloc: dict[int, int] = {0: 0}
    start = 0

    def seconds(a: int, b: int) -> float:
        """A period's length; the one ending at the deadline's slot ends at the deadline."""
        if b == d_slot:
            return ddl - (now_s + a * slot_s)
        return (b - a) * slot_s

    def done(alloc_end: int, real: float, ok: bool) -> Plan:
        merged = Profile.merged(sorted(alloc), [alloc[k] for k in sorted(alloc)])
        return Plan(
            tuple(zip(merged.keys, merged.vals, strict=True)), alloc_end, real, ok, work.profile()
        )

    if assign is not None:
        nxt = next((k for k in free.keys if k > 0), d_slot)
        alloc[0] = assign
        real = math.ceil(now_s + left / job.rate[assign])
        end = _align(real - now_s, slot_s)
        if nxt >= end and ddl >= real:  # done within the first period, in time
            avail = work.val[0]
            work.take(0, assign)
            if end not in orig:
                work.put(end, avail)
            return done(end, real, real <= ddl)
        left -= seconds(0, nxt) * job.rate[assign]
        work.take(0, assign)
        start = nxt
        alloc[start] = 0

    last_cap = 0
    for cap in job.levels:
        if cap > cluster_gpus:
            break
        for k in work.keys:
            if k < d_slot and k not in alloc:
                alloc[k] = 0
        period_end, reached = d_slot, 0.0
        for k in reversed(work.keys):
            if k >= d_slot:
                continue
            if k < start:
                break
            gpus = cap if work.val[k] >= cap else min(cap, job.fits(work.val[k]))
            if gpus == 0:
                period_end = k
                continue
            reached += seconds(k, period_end) * job.rate[gpus]
            if reached >= left:
                return _forward(
                    job,
                    work,
                    alloc,
                    orig,
                    (start, d_slot, k),
                    (cap, last_cap),
                    (left, now_s, slot_s, cluster_gpus),
                    seconds,
                    done,
                )
            period_end = k
        last_cap = cap

    # The fallback: the largest cap to the deadline's slot, then what is free, to completion.
    lat: int | None = None
    gpus = 0
    for t in list(work.keys):
        if t > d_slot:
            break
        if t < start:
            continue
        if lat is not None:
            alloc[lat] = gpus
            work.take(lat, gpus)
            if gpus:
                its = seconds(lat, t) * job.rate[gpus]
                if its >= left:
                    raise PlanError("a fallback plan completes before its deadline")
                left -= its
        lat = t
        gpus = min(last_cap, job.fits(work.val[t]))
    lat = max(d_slot, start)
    for t in list(work.keys):
        if t <= d_slot:
            continue
        cap = min(job.fits(work.val[lat]), job.max_gpus)
        alloc[lat] = cap
        if cap == 0:
            lat = t
            continue
        its = ((t - lat) * slot_s) * job.rate[cap]
        if its >= left:
            real = math.ceil(now_s + lat * slot_s + left / job.rate[cap])
            end = _align(real - now_s, slot_s)
            if end > t:
                raise PlanError("a fallback plan ends past its period")
            for k in list(work.keys):
                if k < d_slot:
                    continue
                if k < end and k in orig:
                    last_free = orig[k]
                if lat <= k < end:
                    work.take(k, cap)
            if last_free is None:
                raise PlanError("the artifact reads an unset last_event_gpu here")
            if lat != end:
                work.put(lat, last_free - cap)
                if last_free - cap < 0:
                    raise PlanError("a fallback plan takes more GPUs than are free")
            if end not in orig:
                work.put(end, last_free)
            return done(end, real, real <= ddl)
        left -= its
        for k in free.keys:
            if k < lat:
                last_free = work.val[k]
        for k in list(work.keys):
            if lat <= k < t:
                work.take(k, cap)
        lat = t
    if not left > 0:
        raise PlanError("a fallback plan has no iterations left past the profile")
    cap = min(cluster_gpus, job.max_gpus) if assign is None else assign
    if cap not in job.rate:
        raise PlanError(f"no throughput at {cap} GPUs")
    alloc[lat] = cap
    real = math.ceil(now_s + lat * slot_s + left / job.rate[cap])
    end = _align(real - now_s, slot_s)
    if not now_s + end * slot_s > ddl:
        raise PlanError("a plan past the profile ends by its deadline")
    work.put(lat, cluster_gpus - cap)
    work.put(end, cluster_gpus)
    return done(end, real, real <= ddl)


def _forward(job, work, alloc, orig, span, caps, clock, seconds, done) -> Plan:  # type: ignore[no-untyped-def]
    """MSS found a cap: run forward from the start at the previous cap before the period the
    backward fill completed in (`point`), at the cap from there, to the slot the work ends."""
    start, d_slot, point = span
    cap, last_cap = caps
    left, now_s, slot_s, cluster_gpus = clock
    lat: int | None = None
    gpus = 0
    end: int | None = None
    real = 0.0
    for t in work.keys:
        if t > d_slot:
            break
        if t < start:
            continue
        if lat is not None:
            alloc[lat] = gpus
            work.take(lat, gpus)
            if gpus:
                its = seconds(lat, t) * job.rate[gpus]
                if lat < point or its < left:
                    if its >= left:
                        raise PlanError("a plan completes before the period MSS chose")
                    left -= its
                else:
                    run = math.ceil(left / job.rate[gpus])
                    end = lat + _align(run, slot_s)
                    real = now_s + lat * slot_s + run
                    if end > t:
                        raise PlanError("a plan ends past the period it completes in")
                    break
        lat = t
        gpus = min(cap if t >= point else last_cap, job.fits(work.val[t]))
    if end is None:
        if lat is None or gpus == 0:
            raise PlanError("a plan completes at zero GPUs")
        alloc[lat] = gpus
        work.take(lat, gpus)
        run = math.ceil(left / job.rate[gpus])
        end = lat + _align(run, slot_s)
        real = now_s + lat * slot_s + run
    last_free = cluster_gpus
    for k, v in orig.items():
        if start <= k < end:
            last_free = v
    if end not in orig:
        work.put(end, last_free)
    return done(end, real, real <= job.deadline)
