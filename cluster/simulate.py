"""The trace-driven cluster simulator every scheduler runs on.

Time is slotted (`slot_s`, 60 s as in the artifacts' Fig. 8 runs): jobs that arrive during a
slot are seen at its end; a scheduler decides again only when something happened (an arrival
or a completion: a scheduling event), and its GPU counts then hold until the next event. A
job whose count changes pays the scaling overhead (`overhead_s`) of that slot; a job that had
GPUs and gets none is preempted. A job finishes inside a slot at the exact time its last
iteration completes.

A scheduler is a `Policy`: `admit` at arrival (False drops the job, which then misses its
deadline), `allocate` at each event (GPU count per active job). The metrics are the issue's:
the deadline-satisfactory ratio over all jobs (dropped and late ones miss), JCT of finished
jobs, makespan, preemptions and GPU utilisation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cluster.workload import Cluster, Job, ScalingCurve

__all__ = ["SUMMARY_KEYS", "Active", "Policy", "Result", "overhead_s", "simulate"]

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


@dataclass
class Active:
    """A job in the system: its curve, what is left, what it holds."""

    job: Job
    curve: ScalingCurve
    remaining: float  # iterations
    gpus: int = 0  # held in the slot being run
    decided: int = 0  # the scheduler's count at its last event
    started: bool = False
    attained: float = 0.0  # GPU-seconds received (Tiresias' attained service)


class Policy(Protocol):
    name: str

    def admit(self, job: Active, now: float, active: list[Active]) -> bool: ...

    def allocate(self, now: float, active: list[Active]) -> dict[int, int]: ...


def overhead_s(gpus: int, restart: bool) -> float:
    """The artifact's scaling overhead (`estimate_overhead`, clusters under 256 GPUs): 2 s,
    27 s more to (re)start a job's processes, and 2 s per doubling of its GPUs."""
    return 2.0 + (27.0 if restart else 0.0) + 2.0 * (math.log2(gpus) + 1.0)


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
    dropped: list[int] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, object]:
        """The fields `moelambda cluster simulate --json` prints (the issue's contract)."""
        keys = SUMMARY_KEYS
        return {k: getattr(self, k) for k in keys}


def simulate(
    jobs: list[Job],
    curves: dict[tuple[str, int], ScalingCurve],
    cluster: Cluster,
    policy: Policy,
    *,
    slot_s: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
) -> Result:
    """Run `policy` on `jobs` until every job has finished or been dropped."""
    started_at = time.perf_counter()
    missing = sorted({(j.model, j.batch) for j in jobs} - set(curves))
    if missing:
        raise ValueError(f"no scaling curve for {missing}")
    pending = sorted(jobs, key=lambda j: (j.submit, j.id))
    active: list[Active] = []
    finish: dict[int, float] = {}
    dropped: list[int] = []
    busy_gpu_s = 0.0
    preemptions = 0
    now = 0.0
    next_job = 0
    event = True
    while next_job < len(pending) or active:
        if not active and next_job < len(pending):  # idle: jump to the next arrival's slot
            now = max(now, math.ceil(pending[next_job].submit / slot_s) * slot_s)
        while next_job < len(pending) and pending[next_job].submit <= now:
            job = pending[next_job]
            next_job += 1
            entry = Active(job, curves[job.model, job.batch], job.iterations)
            if policy.admit(entry, now, active):
                active.append(entry)
            else:
                dropped.append(job.id)
            event = True
        if progress is not None:
            progress(next_job, len(pending))
        if (event or getattr(policy, "every_slot", False)) and active:
            decided = policy.allocate(now, active)
            total = sum(decided.values())
            if total > cluster.gpus:
                raise AssertionError(f"{policy.name} allocated {total} of {cluster.gpus} GPUs")
            for entry in active:
                gpus = decided.get(entry.job.id, 0)
                if entry.gpus and not gpus:
                    preemptions += 1
                entry.decided = gpus
            event = False
        done = []
        for entry in active:
            gpus = entry.decided
            lost = 0.0
            if gpus and gpus != entry.gpus:
                lost = min(slot_s, overhead_s(gpus, restart=not entry.started or not entry.gpus))
                entry.started = True
            entry.gpus = gpus
            if not gpus:
                continue
            rate = float(entry.curve.at(gpus))
            run = slot_s - lost
            if rate * run >= entry.remaining:
                used = lost + entry.remaining / rate
                finish[entry.job.id] = now + used
                busy_gpu_s += gpus * used
                entry.attained += gpus * used
                done.append(entry)
            else:
                entry.remaining -= rate * run
                busy_gpu_s += gpus * slot_s
                entry.attained += gpus * slot_s
        if done:
            active = [a for a in active if a not in done]
            event = True
        now += slot_s
    jct = np.array([finish[j.id] - j.submit for j in jobs if j.id in finish])
    with_deadline = [j for j in jobs if math.isfinite(j.deadline)]
    met = sum(1 for j in with_deadline if finish.get(j.id, math.inf) <= j.deadline + 1e-9)
    makespan = max(finish.values(), default=0.0)
    return Result(
        scheduler=policy.name,
        jobs=len(jobs),
        deadline_ratio=met / len(with_deadline) if with_deadline else None,
        avg_jct_s=float(jct.mean()) if jct.size else None,
        p95_jct_s=float(np.percentile(jct, 95)) if jct.size else None,
        makespan_s=makespan,
        preemptions=preemptions,
        gpu_utilisation=busy_gpu_s / (cluster.gpus * makespan) if makespan else 0.0,
        wall_s=time.perf_counter() - started_at,
        finish=finish,
        dropped=dropped,
    )
