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

`EDF.replay` runs the simulator's rounds (`cluster.simulate.simulate`, its specification)
over arrays kept in deadline order, because on cluster04 thousands of jobs wait (EDF meets
120 deadlines of 15,802) and a per-job Python pass each round cost more than the planning
itself. Only the jobs that hold GPUs, arrive or leave are touched in Python. It relies on
one property of these plans, asserted as it runs: a job holding no GPUs now ends after the
earliest planned end, so it neither leaves at the next round nor sets its time; what it
does contribute, that some pending event differs from the earliest (the merge rule), is
kept by passing the earliest and latest of the waiting jobs' ends.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable

import numpy as np

from cluster.ef_kernels import edf_round
from cluster.simulate import (
    Result,
    Running,
    arrival_order,
    next_event,
    run_interval,
    summarise,
)
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
        order = sorted(jobs, key=_key)
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

    def replay(
        self,
        jobs: list[Job],
        cluster: Cluster,
        *,
        slot_s: float = 60.0,
        progress: Callable[[int, int], None] | None = None,
        on_round: Callable[[float, dict[int, int]], None] | None = None,
    ) -> Result:
        """`simulate`'s rounds for EDF over arrays (see the module doc); the same result,
        round for round (tests/cluster/test_edf_replay.py)."""
        started_at = time.perf_counter(), time.process_time()
        arrivals, submits, after = arrival_order(jobs)
        rank = {j.id: k for k, j in enumerate(arrivals)}  # the generic loop's `active` order
        keys: list[tuple[float, float, int]] = []  # deadline order, as `schedule` sorts
        order: list[Running] = []
        types = np.zeros(0, np.int64)
        base = np.zeros(0, np.int64)
        left = np.zeros(0)
        held = np.zeros(0, np.int64)
        ends = np.zeros(0)  # each job's planned end (absolute); holding jobs' also on entries
        holding: list[Running] = []  # jobs holding GPUs, in arrival order
        finish: dict[int, float] = {}
        met: set[int] = set()
        busy_gpu_s, preemptions = 0.0, 0
        now = submits[0] if submits else 0.0
        elapsed = 0.0
        seen = 0
        while seen < len(arrivals) or order:
            run_interval(holding, now, elapsed)
            busy_gpu_s += sum(a.gpus * elapsed for a in holding)
            gone = [k for k in np.flatnonzero(ends <= now).tolist() if not held[k]]
            if gone:  # the property the module doc states, checked
                raise AssertionError(f"EDF: job {order[gone[0]].job.id} ends while waiting")
            leaving = [a for a in holding if a.end <= now]
            for entry in leaving:
                finish[entry.job.id] = now
                if entry.state.pop("early", entry.end) <= entry.job.deadline:
                    met.add(entry.job.id)
            if leaving:
                drop = sorted(bisect.bisect_left(keys, _key(a)) for a in leaving)
                for k in reversed(drop):
                    del keys[k], order[k]
                types, base, left, held, ends = (
                    np.delete(x, drop) for x in (types, base, left, held, ends)
                )
                holding = [a for a in holding if a.end > now]
            new = []
            while seen < len(arrivals) and arrivals[seen].submit <= now:
                job = arrivals[seen]
                new.append(Running(job, self.curve(job), job.iterations))
                seen += 1
            for entry in self.arrive(now, new, order):
                k = bisect.bisect_left(keys, _key(entry))
                keys.insert(k, _key(entry))
                order.insert(k, entry)
                top = min(entry.curve.max_gpus, self.cluster.gpus)
                types = np.insert(types, k, entry.state["type"])
                base = np.insert(base, k, top)
                left = np.insert(left, k, entry.iter_left)
                held = np.insert(held, k, 0)
                ends = np.insert(ends, k, math.inf)
            if progress is not None:
                progress(seen, len(arrivals))
            if order:
                for entry in holding:  # the only jobs that progressed
                    left[bisect.bisect_left(keys, _key(entry))] = entry.iter_left
                gpus, real = edf_round(
                    types, base, left, self.level, self.rate, self.slot, self.cluster.gpus
                )
                if int(gpus.sum()) > cluster.gpus:
                    raise AssertionError(f"edf allocated {int(gpus.sum())} of {cluster.gpus}")
                for k in np.flatnonzero(gpus != held).tolist():
                    preemptions += bool(held[k] and not gpus[k])
                    order[k].gpus = int(gpus[k])
                held = gpus
                ends = now + real
                running = np.flatnonzero(held).tolist()
                holding = sorted((order[k] for k in running), key=lambda a: rank[a.job.id])
                for k in running:
                    order[k].end = order[k].judged = float(ends[k])
            if on_round is not None:
                on_round(now, {a.job.id: a.gpus for a in holding})
            coming = (
                [submits[i] for i in (seen, after[seen]) if i < len(submits)]
                if seen < len(submits)
                else []
            )
            pending = [a.end for a in holding]
            waiting = ends[held == 0]
            if waiting.size:
                pending += [float(waiting.min()), float(waiting.max())]
            pending += coming
            if not pending:
                break
            nxt = next_event(now, pending, slot_s)
            elapsed, now = nxt - now, nxt
        return summarise(
            self.name, jobs, cluster, finish, met, [], busy_gpu_s, preemptions, started_at
        )


def _key(entry: Running) -> tuple[float, float, int]:
    """EDF's order: deadline, then submission, then id (`schedule`'s sort)."""
    return entry.job.deadline, entry.job.submit, entry.job.id
