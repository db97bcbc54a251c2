"""Earliest deadline first as the ElasticFlow artifact runs it as a baseline
(`one_queue_edf_sim_jobs`, `edf_sim_allocation` in its scheduler.py).

Every round, jobs are planned in deadline order on a fresh free-GPU profile (slots from now),
each at the largest count its table profiles (up to its batch size and 64; more GPUs than
help it, as the artifact does) in every period where that many are free, otherwise at the
largest level that is free, until its work is done; the plan holds its GPUs to its end
rounded up to a slot. Elastic and preemptive, no admission control, no scaling overhead; a
job's end is its real end, not rounded to a slot. The round runs compiled
(`cluster.ef_kernels.edf_round`): the artifact's EDF re-plans every job at every event, about
10^7 plans on the largest ITP trace.
"""

from __future__ import annotations

import math

import numpy as np

from cluster.ef_kernels import edf_round
from cluster.simulate import Running, run_interval
from cluster.workload import Cluster, Job, ScalingCurve

__all__ = ["EDF", "profiled_max_gpus"]


def profiled_max_gpus(curve: ScalingCurve, batch: int) -> int:
    """The most GPUs the non-elastic schedulers give a job: its largest profiled count, at
    most its batch size and 64 (the artifact's `max_gpu` for every scheduler but ElasticFlow)."""
    return int(min(curve.max_gpus, batch, 64))


class EDF:
    """Earliest deadline first, elastic and preemptive (see the module doc)."""

    name = "edf"

    def __init__(
        self, cluster: Cluster, curves: dict[tuple[str, int], ScalingCurve], slot_s: float = 60.0
    ) -> None:
        self.cluster, self.curves, self.slot = cluster, curves, slot_s
        self.index: dict[tuple[str, int], int] = {}
        self.level = np.zeros((0, cluster.gpus + 1), np.int64)
        self.rate = np.zeros((0, cluster.gpus + 1))

    def curve(self, job: Job) -> ScalingCurve:
        curve = self.curves[job.model, job.batch]
        return curve.capped(profiled_max_gpus(curve, job.batch))

    def _type(self, entry: Running) -> int:
        """The job type's row in the tables of level and throughput by free GPUs."""
        key = entry.job.model, entry.job.batch
        if key not in self.index:
            counts = np.arange(self.cluster.gpus + 1)
            level = entry.curve.level_at_most(counts).astype(np.int64)
            self.index[key] = len(self.index)
            self.level = np.vstack([self.level, level])
            self.rate = np.vstack([self.rate, entry.curve.at(level)])
        return self.index[key]

    advance = staticmethod(run_interval)

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]:
        for entry in new:
            entry.state["type"] = self._type(entry)
        return new

    def schedule(self, now: float, jobs: list[Running]) -> float:
        order = sorted(jobs, key=lambda a: (a.job.deadline, a.job.submit, a.job.id))
        types = np.array([a.state["type"] for a in order], np.int64)
        base = np.array([min(a.curve.max_gpus, self.cluster.gpus) for a in order], np.int64)
        left = np.array([a.iter_left for a in order])
        gpus, real = edf_round(
            types, base, left, self.level, self.rate, self.slot, self.cluster.gpus
        )
        for entry, g, r in zip(order, gpus.tolist(), real.tolist(), strict=True):
            entry.gpus = g
            entry.end = now + r
        return math.inf

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        return None
