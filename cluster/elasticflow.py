"""ElasticFlow (ASPLOS'23) and its deadline-ordered baseline EDF, as its artifact runs them.

Both plan on a free-GPU profile (`cluster.profile.Steps`): the GPUs idle in each slot from now
(slots of `slot_s`: every breakpoint a plan makes is on that grid), every GPU free past its
last breakpoint. A *period* is a run of slots with the same free count; the slot holding a
deadline is cut at it.

ElasticFlow gives each job, in deadline order, its minimum satisfactory share (MSS): the
smallest cap c (a level of its curve) such that, filling its periods backwards from the
deadline at min(c, what is free), it completes. The period where that backward fill completes
is where the job starts running at c; periods before it get the previous cap (none for the
first). The plan holds its GPUs until its end rounded up to a slot. A job that no cap saves
gets a fallback plan that runs on past its deadline; a job is judged by the end its last plan
promised (`real_end`), and an arrival is admitted only if every job, old and new, still has
an MSS plan (one infeasible job blocks every admission until it ends, as in the artifact).
Idle GPUs then go, one level at a time, to the jobs whose planned GPU-time grows most per GPU
(the artifact sorts that marginal in descending order, the paper says ascending; we follow the
artifact, whose numbers we reproduce), jobs planned to start later first.

EDF plans in deadline order too, each job at the largest count its table profiles (up to its
batch size and 64; more GPUs than help it, as the artifact does) when that many are free,
otherwise at the largest level that is free; elastic and preemptive, no admission control,
no scaling overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.profile import Steps
from cluster.simulate import Running, overhead_s, run_interval
from cluster.workload import Cluster, Job, ScalingCurve

__all__ = ["EDF", "ElasticFlow", "buddy_offsets", "elastic_max_gpus", "profiled_max_gpus"]

_ELASTIC_MAX_T4 = {"bert": 16, "cifar10": 16, "yolov3": 4, "ncf": 1}
_RESTART_EVERY = 60  # rounds between restarts of every trainer (the artifact's)


def elastic_max_gpus(model: str, batch: int, gpu_type: str) -> int:
    """The most GPUs ElasticFlow gives a job: the artifact's per-model limits (its
    `models.get_max_gpu`), where its profiles show scaling stop paying."""
    if gpu_type.upper() == "T4":
        if model == "deepspeech2" and batch == 320:
            return 32
        return _ELASTIC_MAX_T4.get(model, 64)
    limits = {
        ("gpt2", 128): 16,
        ("gpt2", 256): 32,
        ("bert", 64): 8,
        ("inception3", 64): 16,
        ("inception3", 128): 32,
        ("resnet50", 64): 32,
        ("vgg16", 64): 32,
    }
    if model == "deepspeech2":
        return batch
    if model == "bert":
        return limits.get((model, batch), 16)
    return limits.get((model, batch), min(batch, 64))


def profiled_max_gpus(curve: ScalingCurve, batch: int) -> int:
    """The most GPUs the other schedulers give a job: its largest profiled count, at most its
    batch size and 64 (the artifact's rule for every non-elastic scheduler)."""
    return int(min(curve.max_gpus, batch, 64))


def _slots(seconds: float, slot_s: float) -> int:
    """Seconds from now rounded up to whole slots (the artifact's `align_to_time_slot`)."""
    return math.ceil(seconds / slot_s - 1e-9)


@dataclass
class Plan:
    """A job's GPUs per slot from now (a step function, 0 from `end` on), its promised end in
    seconds from now, whether that meets the deadline, and its GPU-time as the artifact
    counts it (the last period to its next breakpoint, if the plan has one)."""

    steps: Steps
    end: int
    real_end: float
    ok: bool
    gpu_time: float

    @property
    def now(self) -> int:
        return int(self.steps.vals[0])


def _plan(head: list[tuple[int, int]], end: int) -> Steps:
    """A plan from (start, GPUs) pieces in order, ending at slot `end`."""
    pieces = [(s, g) for s, g in head if s < end]
    starts = [0, *(s for s, _ in pieces), end]
    vals = [0, *(g for _, g in pieces), 0]
    return Steps.of(starts, vals)


class _Planner:
    """MSS, fallback and scale-up plans of one job on a free profile (see the module doc).
    Plain Python over a profile's few dozen periods: numpy's per-call cost dominated here."""

    def __init__(self, curve: ScalingCurve, gpus: int, slot_s: float) -> None:
        self.gpus, self.slot = gpus, slot_s
        level, rate = curve.by_count
        self.level = level[: gpus + 1].tolist()  # the largest level <= a count
        self.rate = rate.tolist()  # throughput at the level below a count
        self.caps = [int(c) for c in curve.levels[curve.levels <= gpus]]
        self.top = self.level[gpus]
        self.above = dict(zip([0, *self.caps], self.caps, strict=False))

    def _finish(self, left: float, start: int, gpus: int) -> tuple[int, float]:
        """(aligned end in slots, real end in seconds) of `left` iterations from slot
        `start` at `gpus`."""
        real = math.ceil(left / self.rate[gpus] - 1e-9)
        return start + _slots(real, self.slot), start * self.slot + real

    def mss(
        self,
        left: float,
        free: Steps,
        ddl_s: float,
        k0: int = 0,
        head: tuple[tuple[int, int], ...] = (),
        used: float = 0.0,
    ) -> Plan:
        """The MSS plan from slot k0 (or the fallback when no cap meets the deadline);
        `head` and `used` are the pieces and GPU-time already planned before k0."""
        slot, rate = self.slot, self.rate
        k_ddl = _slots(ddl_s, slot)
        if k_ddl <= k0:
            return self._after_deadline(left, free, max(k_ddl, k0), list(head), used)
        starts = free.breaks(k0, k_ddl)
        ends = [*starts[1:], k_ddl]
        dur = [(e - b) * slot for b, e in zip(starts, ends, strict=True)]
        dur[-1] = ddl_s - starts[-1] * slot
        can = [self.level[min(n, self.gpus)] for n in free.values(starts)]
        target = left * (1 - 1e-12)
        periods = range(len(starts))
        prev = 0
        for cap in self.caps:
            done, point = 0.0, -1
            for p in reversed(periods):  # the latest periods first, at min(cap, free)
                done += dur[p] * rate[cap if can[p] >= cap else can[p]]
                if done >= target:
                    point = p
                    break
            if point < 0:
                prev = cap
                continue
            alloc = [min(prev if p < point else cap, can[p]) for p in periods]
            done, f = 0.0, len(starts) - 1
            for p in periods:  # run forward from now: where does the work complete?
                work = dur[p] * rate[alloc[p]]
                if done + work >= target:
                    f = p
                    break
                done += work
            end, real = self._finish(left - done, starts[f], alloc[f])
            last = (ends[f] if ends[f] < k_ddl else end) - starts[f]
            used += slot * (
                sum(alloc[p] * (ends[p] - starts[p]) for p in range(f)) + alloc[f] * last
            )
            pieces = [*head, *zip(starts[: f + 1], alloc[: f + 1], strict=True)]
            return Plan(_plan(pieces, end), end, real, real <= ddl_s + 1e-9, used)
        alloc = [min(prev, c) for c in can]
        left -= sum(d * rate[a] for d, a in zip(dur, alloc, strict=True))
        used += slot * sum(a * (e - b) for a, b, e in zip(alloc, starts, ends, strict=True))
        pieces = [*head, *zip(starts, alloc, strict=True)]
        return self._after_deadline(left, free, k_ddl, pieces, used)

    def _after_deadline(
        self, left: float, free: Steps, start: int, pieces: list[tuple[int, int]], used: float
    ) -> Plan:
        """The fallback: past the deadline, as many GPUs as are free (up to its limit) until
        done; the profile's last period (every GPU free) lasts forever."""
        starts = free.breaks(start, math.inf)
        ends = [*starts[1:], math.inf]
        for b, e, n in zip(starts, ends, free.values(starts), strict=True):
            gpus = self.level[min(n, self.gpus)]
            work = (e - b) * self.slot * self.rate[gpus]
            pieces.append((b, gpus))
            if gpus and work >= left:
                end, real = self._finish(left, b, gpus)
                used += gpus * (end - b) * self.slot
                return Plan(_plan(pieces, end), end, real, False, used)
            left -= work
            used += gpus * (e - b) * self.slot
        raise AssertionError("a profile's last period has every GPU free")

    def scale_up(self, left: float, free: Steps, ddl_s: float, gpus: int) -> Plan:
        """The plan with `gpus` until the profile's next breakpoint, then MSS again: what
        a job would have if given the next level now (the artifact's marginal estimate)."""
        slot = self.slot
        k_ddl = _slots(ddl_s, slot)
        k1 = free.starts[1] if len(free.starts) > 1 else k_ddl
        end, real = self._finish(left, 0, gpus)
        if k1 >= end or k1 <= 0:  # done before the profile changes, or already late
            return Plan(_plan([(0, gpus)], end), end, real, real <= ddl_s, gpus * end * slot)
        dur = k1 * slot if k1 != k_ddl else ddl_s
        rest = free.minus(_plan([(0, gpus)], k1))
        left -= dur * self.rate[gpus]
        return self.mss(left, rest, ddl_s, k1, ((0, gpus),), gpus * k1 * slot)


class ElasticFlow:
    """ElasticFlow, or with `admission=False` its no-admission-control ablation."""

    judges_plan = True

    def __init__(
        self,
        cluster: Cluster,
        curves: dict[tuple[str, int], ScalingCurve],
        gpu_type: str,
        slot_s: float = 60.0,
        *,
        admission: bool = True,
    ) -> None:
        self.cluster, self.curves, self.gpu_type = cluster, curves, gpu_type
        self.slot, self.admission = slot_s, admission
        self.name = "elasticflow" if admission else "elasticflow-noadmit"
        self.cache: set[tuple[int, int]] = set()
        self._planners: dict[tuple[str, int], _Planner] = {}

    def curve(self, job: Job) -> ScalingCurve:
        limit = elastic_max_gpus(job.model, job.batch, self.gpu_type)
        return self.curves[job.model, job.batch].capped(limit)

    def _planner(self, entry: Running) -> _Planner:
        key = entry.job.model, entry.job.batch
        if key not in self._planners:
            self._planners[key] = _Planner(entry.curve, self.cluster.gpus, self.slot)
        return self._planners[key]

    def _plan_all(self, now: float, jobs: list[Running]) -> tuple[dict[int, Plan], Steps]:
        """Every job's plan in deadline order on a fresh profile, and what is left free."""
        free = Steps.constant(self.cluster.gpus)
        plans = {}
        for entry in _by_deadline(jobs):
            plan = self._planner(entry).mss(entry.iter_left, free, entry.job.deadline - now)
            free = free.minus(plan.steps)
            plans[id(entry)] = plan
        return plans, free

    advance = staticmethod(run_interval)

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]:
        if not self.admission:
            return new
        plans, _ = self._plan_all(now, [*jobs, *new])
        return new if all(p.ok for p in plans.values()) else []

    def schedule(self, now: float, jobs: list[Running]) -> float:
        plans, free = self._plan_all(now, jobs)
        for entry in jobs:
            plan = plans[id(entry)]
            entry.state["plan"] = plan
            entry.gpus = plan.now
            entry.judged = now + plan.real_end  # extra GPUs below do not move it (artifact)
        order = self._allocate_idle(now, _by_deadline(jobs), free)
        for entry in order:
            entry.end = now + entry.state["plan"].end * self.slot
        self._place(order)
        return math.inf  # re-plans at arrivals and completions only

    def _next_level(self, entry: Running) -> int:
        return self._planner(entry).above.get(entry.gpus, entry.gpus)

    def _allocate_idle(self, now: float, order: list[Running], free: Steps) -> list[Running]:
        """Hand idle GPUs out one level at a time (the artifact's `allocate_free_gpus`):
        after every step each job's plan with one more level is estimated again, and the
        job whose planned GPU-time grows most per GPU gets it, jobs holding none first."""
        idle = self.cluster.gpus - sum(a.gpus for a in order)
        while idle > 0:
            options: dict[int, Plan] = {}
            gain: dict[int, float] = {}
            for entry in order:
                step = self._next_level(entry) - entry.gpus
                if not 0 < step <= idle:
                    continue
                mine = free.plus(entry.state["plan"].steps)
                plan = self._planner(entry).scale_up(
                    entry.iter_left, mine, entry.job.deadline - now, entry.gpus + step
                )
                options[id(entry)] = plan
                grows = (plan.gpu_time - entry.state["plan"].gpu_time) / step
                gain[id(entry)] = math.inf if entry.gpus == 0 else grows
            if not options:
                break
            order = sorted(order, key=lambda a: -gain.get(id(a), -math.inf))
            chosen = order[0]
            plan = options[id(chosen)]
            free = free.plus(chosen.state["plan"].steps).minus(plan.steps)
            idle -= plan.now - chosen.gpus
            chosen.gpus = plan.now
            chosen.state["plan"] = plan
        return order

    def _place(self, order: list[Running]) -> None:
        """Place every running job afresh (largest first, as the artifact does); a job whose
        (first GPU, count) was placed before since the last restart finds its trainers
        cached."""
        running = [a for a in order if a.gpus]
        for entry, offset in zip(running, buddy_offsets([a.gpus for a in running]), strict=True):
            key = offset, entry.gpus
            entry.state["cached"] = key in self.cache
            self.cache.add(key)

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        restart = round_index > 0 and round_index % _RESTART_EVERY == 0
        large = self.cluster.gpus >= 256
        for entry in jobs:
            if entry.gpus:
                cached = entry.state.get("cached", False)
                entry.overhead = overhead_s(entry.gpus, restart, cached, large)
                entry.end += entry.overhead
        if restart:
            self.cache.clear()


class EDF:
    """Earliest deadline first, elastic and preemptive as the artifact runs it (see the
    module doc); no admission control and no scaling overhead."""

    name = "edf"

    def __init__(
        self, cluster: Cluster, curves: dict[tuple[str, int], ScalingCurve], slot_s: float = 60.0
    ) -> None:
        self.cluster, self.curves, self.slot = cluster, curves, slot_s

    def curve(self, job: Job) -> ScalingCurve:
        curve = self.curves[job.model, job.batch]
        return curve.capped(profiled_max_gpus(curve, job.batch))

    advance = staticmethod(run_interval)

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]:
        return new

    def _plan(self, entry: Running, free: Steps) -> tuple[Steps, float]:
        """(GPUs per slot until the end rounded up to a slot, end in seconds from now)."""
        base = min(entry.curve.max_gpus, self.cluster.gpus)
        level, rate = entry.curve.by_count
        starts = free.breaks(0, math.inf)
        ends = [*starts[1:], math.inf]
        left, pieces = entry.iter_left, []
        for b, e, n in zip(starts, ends, free.values(starts), strict=True):
            gpus = base if n >= base else int(level[n])
            work = (e - b) * self.slot * rate[gpus]
            pieces.append((b, gpus))
            if gpus and work >= left:
                real = b * self.slot + math.ceil(left / rate[gpus] - 1e-9)
                return _plan(pieces, _slots(real, self.slot)), real
            left -= work
        raise AssertionError("a profile's last period has every GPU free")

    def schedule(self, now: float, jobs: list[Running]) -> float:
        free = Steps.constant(self.cluster.gpus)
        for entry in _by_deadline(jobs):
            plan, real = self._plan(entry, free)
            free = free.minus(plan)
            entry.gpus = int(plan.vals[0])
            entry.end = now + real
        return math.inf

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        return None


def buddy_offsets(sizes: list[int]) -> list[int]:
    """The first GPU of each power-of-two block, packed largest first (stable among equal
    sizes): every block starts at a multiple of its size, so blocks never straddle a node
    (or a switch) they fit in, and any set of blocks whose sizes sum to at most the cluster
    fits (buddy allocation with migration, ElasticFlow Sec. 4.3)."""
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    offsets = [0] * len(sizes)
    at = 0
    for i in order:
        offsets[i] = at
        at += sizes[i]
    return offsets


def _by_deadline(jobs: list[Running]) -> list[Running]:
    return sorted(jobs, key=lambda a: (a.job.deadline, a.job.submit, a.job.id))
