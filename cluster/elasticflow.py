"""ElasticFlow (ASPLOS'23): admission control by minimum satisfactory share, elastic allocation
of the idle GPUs by marginal return; and EDF, its deadline-ordered, non-elastic baseline.

Plans are per slot from now: `free[t]` GPUs are left in slot t after the jobs planned before.
`progressive_filling` (Algorithm 1's inner step) gives a job the smallest per-slot cap j, a
power-of-two level, whose latest slots up to its deadline hold its remaining iterations: its
minimum satisfactory share (MSS). Admission plans every admitted job and the new one in
deadline order and drops the new one if it, or a job it would push out, cannot be planned.
Each scheduling event gives every job its MSS for the next slot, then hands out the idle GPUs
one level step at a time to the job whose plan's GPU-time grows least per GPU (Algorithm 2;
the GPU-time saved, usually negative under concave curves, is its priority).
"""

from __future__ import annotations

import math

import numpy as np

from cluster.simulate import Active
from cluster.workload import Cluster, ScalingCurve

__all__ = ["EDF", "ElasticFlow", "progressive_filling"]


def progressive_filling(
    curve: ScalingCurve, remaining: float, free: np.ndarray, slot_s: float
) -> np.ndarray | None:
    """The job's per-slot GPUs over `free` (slots from now to its deadline): at the smallest
    level cap that completes `remaining` iterations, filling its latest slots first and only
    as many as it needs; None if even the largest cap cannot.

    Caps are tried from the smallest up (most jobs need one of the first); counts are looked
    up in the curve's per-count tables, not searched.
    """
    if remaining <= 0:
        return np.zeros(free.size, dtype=int)
    if free.size == 0:
        return None
    level, rate = curve.by_count
    target = remaining * (1 - 1e-12)
    for cap in curve.levels:
        gpus = level[np.minimum(cap, free)]
        done = np.cumsum(rate[gpus[::-1]]) * slot_s  # work of the latest k slots
        if done[-1] >= target:
            needed = int(np.searchsorted(done, target))
            plan = np.zeros(free.size, dtype=int)
            plan[free.size - needed - 1 :] = gpus[free.size - needed - 1 :]
            return plan
    return None


def _horizon(deadline: float, now: float, slot_s: float) -> int:
    """Slots from now up to the deadline, aligned up to a slot boundary (as the artifact)."""
    return max(0, math.ceil((deadline - now) / slot_s - 1e-9))


class ElasticFlow:
    """ElasticFlow, or with `admission=False` its no-admission-control ablation."""

    def __init__(self, cluster: Cluster, slot_s: float, *, admission: bool = True) -> None:
        self.cluster, self.slot_s, self.admission = cluster, slot_s, admission
        self.name = "elasticflow" if admission else "elasticflow-noadmit"
        self.every_slot = True  # a plan's per-slot counts change between events

    def _plans(
        self, now: float, jobs: list[Active]
    ) -> tuple[dict[int, np.ndarray], np.ndarray, list[Active]]:
        """MSS plans of `jobs` in deadline order, the free profile left, and the jobs that
        could not be planned (they run on what is idle)."""
        finite = [j for j in jobs if math.isfinite(j.job.deadline)]
        horizon = max((_horizon(j.job.deadline, now, self.slot_s) for j in finite), default=0)
        free = np.full(horizon, self.cluster.gpus, dtype=int)
        plans, unplanned = {}, []
        for entry in sorted(jobs, key=lambda a: (a.job.deadline, a.job.submit, a.job.id)):
            if not math.isfinite(entry.job.deadline):
                unplanned.append(entry)  # best effort: idle GPUs only
                continue
            n = _horizon(entry.job.deadline, now, self.slot_s)
            plan = progressive_filling(entry.curve, entry.remaining, free[:n], self.slot_s)
            if plan is None:
                unplanned.append(entry)
                continue
            free[:n] -= plan
            plans[entry.job.id] = plan
        return plans, free, unplanned

    def admit(self, job: Active, now: float, active: list[Active]) -> bool:
        if not self.admission:
            return True
        _, _, before = self._plans(now, active)
        _, _, after = self._plans(now, [*active, job])
        lost = {a.job.id for a in after} - {a.job.id for a in before}
        return not lost

    def allocate(self, now: float, active: list[Active]) -> dict[int, int]:
        plans, free, unplanned = self._plans(now, active)
        by_id = {a.job.id: a for a in active}
        gpus = {i: int(plan[0]) if plan.size else 0 for i, plan in plans.items()}
        idle = self.cluster.gpus - sum(gpus.values())

        def step(i: int) -> tuple[float, int, np.ndarray] | None:
            """(priority, extra GPUs, new plan) of one level more for job i in slot 0."""
            entry, plan = by_id[i], plans[i]
            levels = entry.curve.levels
            above = levels[levels > gpus[i]]
            if not above.size or above[0] - gpus[i] > idle or plan.size == 0:
                return None
            more = int(above[0])
            left = entry.remaining - float(entry.curve.at(more)) * self.slot_s
            rest = free[1 : plan.size] + plan[1:]
            tail = progressive_filling(entry.curve, max(left, 0.0), rest, self.slot_s)
            if tail is None:
                return None
            new = np.r_[more, tail]
            saved = float(plan.sum() - new.sum())
            return saved / (more - gpus[i]), more - gpus[i], new

        candidates = {i: step(i) for i in plans}
        while idle > 0:
            options = {i: c for i, c in candidates.items() if c is not None and c[1] <= idle}
            if not options:
                break
            i = max(options, key=lambda k: (options[k][0], -by_id[k].job.deadline))
            _, extra, new = options[i]
            old = plans[i]
            free[1 : old.size] += old[1:] - new[1:]
            plans[i] = new
            gpus[i] += extra
            idle -= extra
            candidates[i] = step(i)
        for entry in unplanned:  # late or best-effort jobs run on what is left
            level = int(entry.curve.level_at_most(min(idle, entry.curve.max_gpus)))
            if level:
                gpus[entry.job.id] = level
                idle -= level
        return gpus


class EDF:
    """Earliest deadline first, not elastic (the paper's baseline): in deadline order, a job
    starts once as many GPUs as it can use without lowering its throughput (its curve's
    largest level) are idle, and keeps them until it finishes; later jobs wait behind it."""

    name = "edf"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def admit(self, job: Active, now: float, active: list[Active]) -> bool:
        return True

    def allocate(self, now: float, active: list[Active]) -> dict[int, int]:
        gpus = {a.job.id: a.decided for a in active if a.decided}
        idle = self.cluster.gpus - sum(gpus.values())
        waiting = [a for a in active if not a.decided]
        for entry in sorted(waiting, key=lambda a: (a.job.deadline, a.job.submit, a.job.id)):
            if entry.curve.max_gpus > idle:
                break
            gpus[entry.job.id] = entry.curve.max_gpus
            idle -= entry.curve.max_gpus
        return gpus
