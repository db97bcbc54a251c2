"""Tiresias' discretised two-dimensional least-attained-service (2D-LAS), as the ElasticFlow
artifact runs it as a baseline: not elastic, not deadline-aware.

A job gets exactly the GPUs its trace asks for and runs for the trace's duration (seconds of
execution at that count; the throughput tables play no part). Jobs sit in three priority
queues by attained service in GPU-seconds; a job is demoted one queue when it passes the
queue's limit (3,250 and 7,200 GPU-seconds) and never promoted. At every event the queues are
walked in order, each job in queue order running if its GPUs are still free (later jobs
backfill) and a running job that no longer fits is preempted; jobs left waiting move to the
back of their queue. Starting or resuming costs the artifact's scaling overhead (no cache),
and on the rounds that restart every trainer the running jobs pay it again. A job leaves at
its end (at least one slot after the event that planned it) and meets its deadline if its
execution ends by then.
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

    def __init__(self, cluster: Cluster, slot_s: float = 60.0) -> None:
        self.cluster, self.slot = cluster, slot_s
        self.queues: list[list[Running]] = [[] for _ in range(len(_LIMITS) + 1)]
        self.round = 0

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
        and demote the ones past their queue's limit."""
        for entry in jobs:
            state = entry.state
            if "queue" not in state:
                continue
            if entry.gpus:
                run = max(int(now - state["checked"]) - entry.overhead, 0)
                entry.executed += run
                entry.overhead = 0.0
                q = state["queue"]
                if q < len(_LIMITS) and entry.executed * entry.job.gpus >= _LIMITS[q]:
                    self.queues[q].remove(entry)
                    self.queues[q + 1].append(entry)
                    state["queue"] = q + 1
            state["checked"] = now

    def schedule(self, now: float, jobs: list[Running]) -> float:
        restart = self.round > 0 and self.round % _RESTART_EVERY == 0
        self.round += 1
        present = {id(a) for a in jobs}  # jobs that left are dropped from their queues
        self.queues = [[a for a in q if id(a) in present] for q in self.queues]
        free = self.cluster.gpus
        for queue in self.queues:
            for entry in queue:
                if free >= entry.job.gpus:
                    if not entry.gpus:  # starts or resumes
                        entry.overhead = overhead_s(entry.job.gpus, restart)
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
                entry.overhead = overhead_s(entry.job.gpus, restart)
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
