"""Tiresias' discretised two-dimensional least-attained-service (2D-LAS), as the ElasticFlow
artifact runs it as a baseline: not elastic, not deadline-aware.

A job gets exactly the GPUs its trace asks for and runs for the trace's duration (seconds of
execution at that count; the throughput tables play no part). Jobs sit in three priority
queues by attained service in GPU-seconds; a job is demoted one queue when it passes the
queue's limit (3,250 and 7,200 GPU-seconds) and never promoted. At every event the queues are
walked in order, each job in queue order running if its GPUs are still free (later jobs
backfill) and a running job that no longer fits is preempted; jobs left waiting move to the
back of their queue. Starting or resuming costs the artifact's scaling overhead (no cache;
`utils.estimate_overhead`, whose base is 7 s on clusters of 256 GPUs or more, every ITP
cluster), and on the rounds that restart every trainer the running jobs pay it again. A job
leaves at its end (at least one slot after the event that planned it) and meets its deadline
if its execution ends by then.

The rules each come from the artifact's `dlas_sim_jobs` (scheduler.py, `dlas-gpu`), and the
replay equals its per-event log on the 195-job trace and cluster01..05 (every event: its time
and the GPUs each job holds; `moelambda bench cluster`):

- executed seconds are whole: `int(executed + max(int(interval) - overhead, 0))` per event;
- the jobs are visited, for progress and demotion, in its `runnable_jobs` order (most GPUs
  first, stably over arrival order), so jobs demoted at one event join their new queue in
  that order;
- every event counts towards the restart of every trainer at each 60th (`schedule_count`),
  an event with no job in the system too;
- events: arrivals within a slot of the last event are merged one slot later, except the
  last arrival, which keeps its time; ends and queue jumps are at least a slot away; a jump
  counts only if before every other event.
"""

from __future__ import annotations

import math

from cluster.simulate import Running, overhead_s
from cluster.workload import Cluster, Job, ScalingCurve, check_fits

__all__ = ["Tiresias"]

_LIMITS = (3250.0, 7200.0)  # GPU-seconds, the artifact's queue limits (its third is unused)
_RESTART_EVERY = 60


class Tiresias:
    name = "tiresias"
    judges_plan = True  # judged by when its execution ends, not when it leaves
    merges_arrivals_only = True  # `dlas_sim_jobs` merges arrivals only, the last never

    def __init__(self, cluster: Cluster, slot_s: float = 60.0) -> None:
        self.cluster, self.slot = cluster, slot_s
        self.queues: list[list[Running]] = [[] for _ in range(len(_LIMITS) + 1)]
        self.round = 0  # events so far (the artifact's schedule_count)
        self.restart = False

    def curve(self, job: Job) -> ScalingCurve:
        return job.own_curve()

    def check(self, jobs: list[Job]) -> None:
        """Refuse, before the replay, a job larger than the cluster: it would wait forever."""
        check_fits(jobs, self.cluster)

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]:
        for entry in new:
            entry.state.update(queue=0, checked=now)
            self.queues[0].append(entry)
        return new

    def advance(self, jobs: list[Running], now: float, elapsed: float) -> None:
        """Count each running job's execution since the last event, net of its overhead,
        and demote the ones past their queue's limit (`dlas_sim_jobs`, at every event).

        As in the artifact: the executed seconds are truncated to whole ones after each
        interval (`int(executed + run)`); the jobs are visited in its `runnable_jobs` order
        (sorted by GPUs, most first, stably over arrival order, every round), which is the
        order jobs demoted at the same event join the back of their new queue; and every
        event counts towards the restart of every trainer each 60th event (its
        `schedule_count`), whether or not any job is in the system."""
        self.restart = self.round > 0 and self.round % _RESTART_EVERY == 0
        self.round += 1
        for entry in sorted(jobs, key=lambda a: -a.job.gpus):
            state = entry.state
            if "queue" not in state:
                continue
            if entry.gpus:
                run = max(int(now - state["checked"]) - entry.overhead, 0)
                entry.executed = int(entry.executed + run)
                entry.overhead = 0.0
                q = state["queue"]
                if q < len(_LIMITS) and int(entry.executed * entry.job.gpus) >= _LIMITS[q]:
                    self.queues[q].remove(entry)
                    self.queues[q + 1].append(entry)
                    state["queue"] = q + 1
            state["checked"] = now

    def schedule(self, now: float, jobs: list[Running]) -> float:
        restart = self.restart
        present = {id(a) for a in jobs}  # jobs that left are dropped from their queues
        self.queues = [[a for a in q if id(a) in present] for q in self.queues]
        free = self.cluster.gpus
        for queue in self.queues:
            for entry in queue:
                if free >= entry.job.gpus:
                    if not entry.gpus:  # starts or resumes
                        entry.overhead = overhead_s(entry.job.gpus, restart, self.cluster.gpus)
                    entry.gpus = entry.job.gpus
                    free -= entry.job.gpus
                else:
                    entry.gpus = 0
            queue.sort(key=lambda a: not a.gpus)  # waiting jobs to the back, in order
        wake = math.inf
        for entry in jobs:
            if not entry.gpus:
                entry.end = entry.judged = math.inf
                continue
            remaining = entry.job.duration - entry.executed
            if restart:
                entry.overhead = overhead_s(entry.job.gpus, restart, self.cluster.gpus)
                remaining += entry.overhead
            entry.judged = int(now + remaining)
            entry.end = max(now + self.slot, entry.judged)
            q = entry.state["queue"]
            if q < len(_LIMITS):  # the artifact divides seconds, not GPU-seconds, by the GPUs
                jump = int(math.ceil((_LIMITS[q] - entry.executed) / entry.job.gpus) + now)
                wake = min(wake, max(jump, now + self.slot))
        return wake

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        return None
