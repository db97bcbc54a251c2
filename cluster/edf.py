"""Earliest deadline first as the ElasticFlow artifact runs it as a baseline
(`one_queue_edf_sim_jobs`, `edf_sim_allocation` in its scheduler.py).

Every round, jobs are planned in deadline order on a fresh free-GPU profile (slots from now),
each at the largest count its table profiles (up to its batch size and 64; more GPUs than
help it, as the artifact does) in every period where that many are free, otherwise at the
largest level that is free, until its work is done; the plan holds its GPUs to its end
rounded up to a slot. Elastic and preemptive, no admission control, no scaling overhead; a
job's end is its real end, not rounded to a slot. The round runs compiled (`_edf_round`):
the artifact's EDF re-plans every job at every event, about 10^7 plans on the largest ITP
trace.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from cluster.ef_planner import _first_at_least, _merge_into, _put
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
        gpus, real = _edf_round(
            types, base, left, self.level, self.rate, self.slot, self.cluster.gpus
        )
        for entry, g, r in zip(order, gpus.tolist(), real.tolist(), strict=True):
            entry.gpus = g
            entry.end = now + r
        return math.inf

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        return None


@njit(cache=True)
def _edf_round(types, base, left, level, rate, slot_s, gpus):  # type: ignore[no-untyped-def]
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
