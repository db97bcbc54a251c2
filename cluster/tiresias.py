"""Tiresias' discretised two-dimensional least-attained-service (2D-LAS): not elastic, not
deadline-aware.

A job gets exactly the GPUs its trace asks for. Jobs sit in priority queues by attained
service (GPUs x seconds run so far), thresholds `limits`; the lowest queue runs first, and
within a queue the earliest arrival. At every scheduling event the jobs are taken in that
order and each one that fits the GPUs still idle runs; a running job that does not make the
cut is preempted.
"""

from __future__ import annotations

from cluster.simulate import Active
from cluster.workload import Cluster

__all__ = ["Tiresias"]


class Tiresias:
    name = "tiresias"

    def __init__(self, cluster: Cluster, limits: tuple[float, ...] = (3600.0,)) -> None:
        self.cluster, self.limits = cluster, limits
        self.every_slot = True  # attained service moves jobs between queues between events

    def admit(self, job: Active, now: float, active: list[Active]) -> bool:
        return True

    def _queue(self, entry: Active) -> int:
        return sum(entry.attained >= limit for limit in self.limits)

    def allocate(self, now: float, active: list[Active]) -> dict[int, int]:
        order = sorted(active, key=lambda a: (self._queue(a), a.job.submit, a.job.id))
        idle = self.cluster.gpus
        gpus = {}
        for entry in order:
            want = min(entry.job.gpus, self.cluster.gpus)
            if want <= idle:
                gpus[entry.job.id] = want
                idle -= want
        return gpus
