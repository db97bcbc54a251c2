"""Earliest deadline first as the ElasticFlow artifact runs it as a baseline
(`one_queue_edf_sim_jobs`, `edf_sim_allocation` in its scheduler.py).

Jobs are planned in deadline order, each at the largest count its table profiles (up to its
batch size and 64; more GPUs than help it, as the artifact does) when that many are free,
otherwise at the largest level that is free; elastic and preemptive, no admission control,
no scaling overhead. A job's end is its real end (not rounded to a slot).
"""

from __future__ import annotations

import math

from cluster.profile import Steps
from cluster.simulate import Running, run_interval
from cluster.workload import Cluster, Job, ScalingCurve

__all__ = ["EDF", "profiled_max_gpus"]


def profiled_max_gpus(curve: ScalingCurve, batch: int) -> int:
    """The most GPUs the non-elastic schedulers give a job: its largest profiled count, at
    most its batch size and 64 (the artifact's `max_gpu` for every scheduler but ElasticFlow)."""
    return int(min(curve.max_gpus, batch, 64))


def _slots(seconds: float, slot_s: float) -> int:
    """Seconds from now rounded up to whole slots (the artifact's `align_to_time_slot`)."""
    return math.ceil(seconds / slot_s - 1e-9)


class EDF:
    """Earliest deadline first, elastic and preemptive (see the module doc)."""

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
                end = _slots(real, self.slot)
                pieces = [(s, g) for s, g in pieces if s < end]
                starts_ = [0, *(s for s, _ in pieces), end]
                return Steps.of(starts_, [0, *(g for _, g in pieces), 0]), real
            left -= work
        raise AssertionError("a profile's last period has every GPU free")

    def schedule(self, now: float, jobs: list[Running]) -> float:
        free = Steps.constant(self.cluster.gpus)
        for entry in sorted(jobs, key=lambda a: (a.job.deadline, a.job.submit, a.job.id)):
            plan, real = self._plan(entry, free)
            free = free.minus(plan)
            entry.gpus = int(plan.vals[0])
            entry.end = now + real
        return math.inf

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        return None
