"""The event-driven cluster simulator every scheduler runs on.

It advances from event to event as the ElasticFlow artifact's simulator does, because its
published numbers depend on that cadence: the events are arrivals, the ends a scheduler plans
and the time it asks to be woken (ElasticFlow: its next planned change of GPU count), which
counts only if it comes before every other pending event, as the artifact adds its scale event.
Events that fall within one slot (`slot_s`, 60 s in the artifacts) of the current time are
handled together one slot later, so two scheduling rounds are at least a slot apart (a lone
last event keeps its own time). A policy with `merges_arrivals_only` (Tiresias) follows the
artifact's other loop instead, `dlas_sim_jobs`, which merges arrivals alone: the next arrival
moves to one slot from now when within a slot and another arrival follows, the last arrival
keeps its own time whatever else is pending, and the policy keeps its ends and wake-ups a
slot away itself.

At each event the simulator first runs every job over the interval just passed (its
throughput at its GPU count, minus the scaling overhead it paid at the interval's start),
removes the jobs whose planned end has come (or that finished early: they end at this event),
hands arrivals to the policy, lets it decide every job's GPUs, planned end and wake-up, and
charges the overheads of the new round. No work counts past the end a job is judged by, and a
job whose judged end lies before the previous event is a state the artifact asserts never
happens: it raises. A job meets its deadline if the end it is judged by comes by then:
ElasticFlow (`judges_plan`) judges the end its last plan promised, as its artifact does; the
others the end they scheduled (or the early finish).

A scheduler is a `Policy`: `advance` (progress over the interval just passed: `run_interval`
for throughput-driven schedulers), `arrive` (which of the new jobs it admits), `schedule` (GPU
counts, planned ends, the next wake-up) and `charge` (the overhead each job pays this round).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cluster.workload import Cluster, Job, ScalingCurve

__all__ = [
    "SUMMARY_KEYS",
    "Policy",
    "Result",
    "Running",
    "arrival_order",
    "next_event",
    "overhead_s",
    "run_interval",
    "simulate",
    "summarise",
]

SUMMARY_KEYS = (
    "scheduler",
    "jobs",
    "deadline_ratio",
    "avg_jct_s",
    "p95_jct_s",
    "makespan_s",
    "preemptions",
    "gpu_utilisation",
    "wall_s",
)


@dataclass(eq=False)
class Running:
    """A job in the system: what is left, what it holds, what its scheduler promised."""

    job: Job
    curve: ScalingCurve  # the levels this scheduler may give it
    iter_left: float
    gpus: int = 0
    overhead: float = 0.0  # seconds of the current interval lost to scaling
    end: float = math.inf  # the planned end: the job leaves the system at this event
    judged: float = math.inf  # the end its deadline is judged by
    executed: float = 0.0  # seconds run
    state: dict[str, Any] = field(default_factory=dict)  # the policy's own bookkeeping

    def rate(self, gpus: int) -> float:
        """Throughput at `gpus` (a count between levels runs at the level below)."""
        level = self.curve.by_level.get(gpus)
        return float(self.curve.at(gpus)) if level is None else level


class Policy(Protocol):
    name: str

    def curve(self, job: Job) -> ScalingCurve: ...

    def advance(self, jobs: list[Running], now: float, elapsed: float) -> None: ...

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]: ...

    def schedule(self, now: float, jobs: list[Running]) -> float: ...

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None: ...


def overhead_s(gpus: int, restart: bool, cluster_gpus: int, cached: bool = False) -> float:
    """The artifact's scaling overhead (`utils.estimate_overhead`): 2 s, or 7 s on clusters of
    256 GPUs or more (every ITP cluster: 512 or 1,024 GPUs); a job whose GPU set is still
    cached pays only that; otherwise 2 s per doubling of its GPUs, and 27 s (47 s on those
    large clusters) more on the rounds that restart every trainer. The cluster's size is a
    required argument because every scheduler's overhead depends on it."""
    large = cluster_gpus >= 256
    overhead = 7.0 if large else 2.0
    if cached:
        return overhead
    if restart:
        overhead += 47.0 if large else 27.0
    # math.log(x, 2), not log2: they differ in the last bit for 280 of the counts up to 1,024
    # and Tiresias truncates executed seconds to whole ones after subtracting the overhead
    return overhead + (math.log(gpus, 2) + 1) * 2


@dataclass
class Result:
    scheduler: str
    jobs: int
    deadline_ratio: float | None
    avg_jct_s: float | None
    p95_jct_s: float | None
    makespan_s: float
    preemptions: int
    gpu_utilisation: float
    wall_s: float
    finish: dict[int, float] = field(default_factory=dict, repr=False)
    # this process's CPU seconds for the replay: on a shared machine the wall time also
    # counts other work, and `bench cluster` reports both
    cpu_s: float | None = field(default=None, repr=False)
    dropped: list[int] = field(default_factory=list, repr=False)
    met: set[int] = field(default_factory=set, repr=False)

    def summary(self) -> dict[str, object]:
        """The fields `moelambda cluster simulate --json` prints (the issue's contract)."""
        return {k: getattr(self, k) for k in SUMMARY_KEYS}


def next_event(now: float, times: list[float], slot_s: float) -> float:
    """The time of the next round: the earliest event, moved to one slot from now when it is
    within a slot and another event is pending (the merge rule of ElasticFlow's loop,
    `ef_sim_jobs_access_control`, whose one event list holds arrivals and ends alike)."""
    first = min(times)
    if int(first - now) <= slot_s and any(t != first for t in times):
        return now + slot_s
    return first


def _next_event_arrivals(now: float, later: list[float], coming: list[float],
                         slot_s: float) -> float:  # fmt: skip
    """The time of the next round when only arrivals are merged (Tiresias' loop,
    `dlas_sim_jobs`): its event list holds arrivals alone, so the next arrival is moved to one
    slot from now when within a slot and another arrival follows, and the last one keeps its
    own time; the policy's ends and wake-ups (`later`) are a slot away or more already."""
    times = list(later)
    if coming:
        first = coming[0]
        times.append(now + slot_s if int(first - now) <= slot_s and len(coming) > 1 else first)
    return min(times)


def run_interval(jobs: list[Running], now: float, elapsed: float) -> None:
    """Progress every job over the `elapsed` seconds that end at `now`; a job whose work is
    done before its planned end leaves at this event instead."""
    for entry in jobs:
        if not entry.gpus:
            continue
        run = elapsed
        if now > entry.judged:
            run -= now - entry.judged  # the artifact counts no work past the promised end
        if run <= 0:
            raise AssertionError(
                f"job {entry.job.id} was promised an end before the last event: the artifact "
                "asserts this never happens (`run_all_jobs`)"
            )
        run = run - entry.overhead if run >= entry.overhead else 0.0
        rate = entry.rate(entry.gpus)
        work = run * rate
        if entry.iter_left <= work and entry.end > now:
            entry.state["early"] = now - elapsed + math.ceil(entry.iter_left / rate)
            entry.end = now
        entry.iter_left -= work
        entry.executed += run
        entry.overhead = 0.0


def simulate(
    jobs: list[Job],
    cluster: Cluster,
    policy: Policy,
    *,
    slot_s: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    on_round: Callable[[float, dict[int, int]], None] | None = None,
    reference: bool = False,
) -> Result:
    """Run `policy` on `jobs` until every admitted job has left the system. A policy that
    cannot run some job refuses the trace first (its `check`), before any replay.
    `on_round` sees each round's time and the GPUs each job holds (job id: GPUs, jobs holding
    none left out): what the artifact logs per event (`cluster.artifact`).

    A policy with its own `replay` (EDF: thousands of waiting jobs, re-planned every round)
    runs that instead: the same rounds over arrays, touching in Python only the jobs that
    hold GPUs, arrive or leave. `reference=True` runs this generic loop regardless: the
    specification those replays are tested against, result for result."""
    check = getattr(policy, "check", None)
    if check is not None:
        check(jobs)
    replay = getattr(policy, "replay", None)
    if replay is not None and not reference:
        return replay(jobs, cluster, slot_s=slot_s, progress=progress, on_round=on_round)
    started_at = time.perf_counter(), time.process_time()
    arrivals, submits, after = arrival_order(jobs)
    active: list[Running] = []
    finish: dict[int, float] = {}
    met: set[int] = set()
    dropped: list[int] = []
    busy_gpu_s, preemptions, rounds = 0.0, 0, 0
    now = submits[0] if submits else 0.0
    elapsed = 0.0
    seen = 0
    judges_plan = getattr(policy, "judges_plan", False)
    ticks = getattr(policy, "ticks", False)  # rounds every slot once arrivals are over
    merges_arrivals = getattr(policy, "merges_arrivals_only", False)
    while seen < len(arrivals) or active:
        policy.advance(active, now, elapsed)
        busy_gpu_s += sum(a.gpus * elapsed for a in active)
        leaving = [a for a in active if a.end <= now]
        for entry in leaving:
            finish[entry.job.id] = now
            when = entry.judged if judges_plan else entry.state.pop("early", entry.end)
            if when <= entry.job.deadline:
                met.add(entry.job.id)
        active = [a for a in active if a.end > now]
        new = []
        while seen < len(arrivals) and arrivals[seen].submit <= now:
            job = arrivals[seen]
            new.append(Running(job, policy.curve(job), job.iterations))
            seen += 1
        if new:
            admitted = policy.arrive(now, new, active)
            dropped += [n.job.id for n in new if n not in admitted]
            active += admitted
        if progress is not None:
            progress(seen, len(arrivals))
        before = {id(a): a.gpus for a in active}
        wake = policy.schedule(now, active) if active else math.inf
        held = sum(a.gpus for a in active)
        if held > cluster.gpus:
            raise AssertionError(f"{policy.name} allocated {held} of {cluster.gpus} GPUs")
        for entry in active:
            preemptions += bool(before[id(entry)] and not entry.gpus)
        if on_round is not None:
            on_round(now, {a.job.id: a.gpus for a in active if a.gpus})
        coming = (
            [submits[i] for i in (seen, after[seen]) if i < len(submits)]
            if seen < len(submits)
            else []
        )
        if wake >= min((*(a.end for a in active), *coming), default=math.inf):
            wake = math.inf  # a wake-up counts only before every pending event (the artifact)
        events = [wake, *(a.end for a in active), *coming]
        if any(math.isfinite(t) for t in events):  # the artifact charges only then
            policy.charge(now, active, rounds)
            rounds += 1
        if not judges_plan:
            for entry in active:
                entry.judged = entry.end
        pending = [t for t in (wake, *(a.end for a in active)) if math.isfinite(t)]
        pending += coming
        if ticks and seen == len(arrivals) and active:
            pending.append(now + slot_s)
        if not pending:  # nothing will change: jobs left waiting never run (too big)
            break
        if merges_arrivals:
            later = [t for t in (wake, *(a.end for a in active)) if math.isfinite(t)]
            nxt = _next_event_arrivals(now, later, coming, slot_s)
        else:
            nxt = next_event(now, pending, slot_s)
        elapsed, now = nxt - now, nxt
    return summarise(
        policy.name, jobs, cluster, finish, met, dropped, busy_gpu_s, preemptions, started_at
    )


def arrival_order(jobs: list[Job]) -> tuple[list[Job], list[float], list[int]]:
    """The jobs by submission (ties by id), their submission times, and for each the index
    of the first job submitted later (the merge rule counts distinct event times)."""
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    submits = [j.submit for j in arrivals]
    after = np.searchsorted(submits, submits, side="right").tolist()
    return arrivals, submits, after


def summarise(
    name: str,
    jobs: list[Job],
    cluster: Cluster,
    finish: dict[int, float],
    met: set[int],
    dropped: list[int],
    busy_gpu_s: float,
    preemptions: int,
    started_at: tuple[float, float],
) -> Result:
    """A replay's result from what it recorded (shared by `simulate` and the policies' own
    replays, so both report alike); `started_at` is (perf_counter, process_time) at the
    start."""
    first_submit = min((j.submit for j in jobs), default=0.0)
    jct = np.array([finish[j.id] - j.submit for j in jobs if j.id in finish])
    with_deadline = [j for j in jobs if math.isfinite(j.deadline)]
    makespan = max(finish.values(), default=0.0) - first_submit
    return Result(
        scheduler=name,
        jobs=len(jobs),
        deadline_ratio=len(met & {j.id for j in with_deadline}) / len(with_deadline)
        if with_deadline
        else None,
        avg_jct_s=float(jct.mean()) if jct.size else None,
        p95_jct_s=float(np.percentile(jct, 95)) if jct.size else None,
        makespan_s=makespan,
        preemptions=preemptions,
        gpu_utilisation=busy_gpu_s / (cluster.gpus * makespan) if makespan else 0.0,
        wall_s=time.perf_counter() - started_at[0],
        finish=finish,
        dropped=dropped,
        met=met,
        cpu_s=time.process_time() - started_at[1],
    )
