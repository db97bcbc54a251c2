"""ElasticFlow's per-job plan on a free-GPU profile, computed as its artifact computes it.

The artifact's `ef_sim_allocation` (scheduler.py of pkusys/ElasticFlow, commit 04a0109) gives
one job GPUs per period of a free-GPU profile. Its numbers depend on details the paper does
not state, so each is reproduced here and named (the artifact's variable in brackets):

- A profile is a step function of free GPUs over slots from now; it is kept merged
  (`utils.merge_dict`): a breakpoint whose value equals the previous one is dropped, and the
  periods a plan walks are the runs between breakpoints. The deadline's slot (`aligned_ddl`,
  the deadline rounded up to the slot grid) is added as a breakpoint while planning, and the
  period ending there lasts only to the exact deadline.
- **MSS.** For each level of the job's curve in turn (a cap), the periods from the deadline
  back to the start are filled at min(cap, the largest level that fits the free GPUs); the
  first cap whose backward fill reaches the job's remaining iterations wins. The job then runs
  forward from the start at that cap from the period where the backward fill completed
  (`point`) and at the previous cap before it, to the slot its work completes in. Its
  allocation (`allocations`) keeps a zero breakpoint at every later profile breakpoint before
  the deadline: the first one is where the artifact next re-plans (a scale event), and the
  GPU-time of a plan counts the last period to that breakpoint (`get_allocation_time`).
- **Fallback.** When no cap completes by the deadline, the job runs at the largest cap up to
  the deadline's slot, then from that slot on at the largest level that fits the free GPUs
  at the start of each period, to completion; past the profile's last breakpoint it runs at
  min(cluster, its limit) alone. Two of the artifact's profile updates on this path are
  kept as it makes them: where the run ends inside a period, the period's free GPUs become
  the value of the last original breakpoint before the end minus the job's GPUs
  (`last_event_gpu`), and past the last breakpoint the profile becomes the whole cluster
  minus the job, then the whole cluster.
- **Scale-up estimate** (`assign_gpu=True`, used by the idle-GPU hand-out): the job runs at
  the given count to the profile's next original breakpoint (the deadline's slot is not one
  here), and if it does not complete in time there, MSS (or the fallback) continues from that
  breakpoint.
- Times are kept as the artifact keeps them: real ends are whole seconds rounded up on the
  trace's absolute clock (`math.ceil(event_time + iter_left / throughput)` in two of the three
  paths, relative in the third), planned ends are rounded up to the slot grid from now.

The states the artifact asserts never happen (a profile below zero, a job planned with no
iterations left or at zero GPUs) raise `PlanError`: a replay that reaches them has left the
artifact's semantics.

The planner is compiled with numba (`cluster.ef_kernels`): ElasticFlow estimates a plan for
every job after every GPU it hands out, about 10^7 plans on the largest ITP trace. The
arithmetic is the artifact's, operation for operation (numba does not reorder or fuse
floating-point operations), so the compiled plans equal the interpreted ones bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cluster.ef_kernels import (
    FREE_K,
    FREE_V,
    OUT_K,
    OUT_V,
    PlanError,
    _align,
    _load,
    _plan_w,
    workspace,
)

__all__ = ["Demand", "Plan", "PlanError", "Profile", "Tables", "plan"]


@dataclass(frozen=True, slots=True)
class Profile:
    """Free GPUs from each breakpoint (slots from now, the first 0) to the next; merged."""

    keys: tuple[int, ...]
    vals: tuple[int, ...]

    @classmethod
    def constant(cls, gpus: int) -> Profile:
        return cls((0,), (gpus,))


@dataclass(frozen=True, slots=True)
class Demand:
    """What the planner reads of a job: iterations left, absolute deadline, its levels (GPU
    counts up to its limit, ascending) and throughput at each, and its limit."""

    iter_left: float
    deadline: float
    levels: tuple[int, ...]
    rate: dict[int, float]
    max_gpus: int


@dataclass(frozen=True, slots=True)
class Plan:
    """One job's plan: its allocation (merged breakpoints, slots from now), its planned end
    (slots from now, on the grid), its real end (absolute seconds), whether that meets the
    deadline, and the free profile it leaves."""

    alloc: tuple[tuple[int, int], ...]
    end: int
    real_end: float
    ok: bool
    free: Profile

    def next_change(self) -> int | None:
        """The first breakpoint of its allocation after now: where the artifact schedules a
        scale event (`add_job_scale_event_new`)."""
        return self.alloc[1][0] if len(self.alloc) > 1 else None


class Tables:
    """A job type's levels, throughput by GPU count (NaN where not profiled) and the largest
    level that fits each count of free GPUs (0..cluster): what the compiled planner reads."""

    def __init__(self, levels: tuple[int, ...], rate: dict[int, float], gpus: int) -> None:
        self.levels = np.array(levels, dtype=np.int64)
        top = max(max(rate), gpus)
        self.rate = np.full(top + 1, np.nan)
        for g, r in rate.items():
            self.rate[g] = r
        self.fit = np.zeros(gpus + 1, dtype=np.int64)
        for g in levels:
            if g <= gpus:
                self.fit[g:] = g


def plan(
    job: Demand,
    free: Profile,
    now_s: float,
    slot_s: float,
    cluster_gpus: int,
    assign: int | None = None,
) -> Plan:
    """The job's plan from now on `free` (see the module doc); with `assign`, the estimate
    with that many GPUs from now (the artifact's scale-up estimate)."""
    tables = Tables(job.levels, job.rate, cluster_gpus)
    free = np.array([free.keys, free.vals], dtype=np.int64).reshape(2, -1)
    ws = workspace(free.shape[1] + 2)
    assign_ = -1 if assign is None else assign
    d_slot = _align(job.deadline - now_s, slot_s)
    zero = tables.levels[0] <= cluster_gpus
    none = np.zeros((1, 1), np.int64)
    n = free.shape[1]
    m, nxt, _ = _load(ws, free, n, none, none, 0, 0, -1, d_slot, zero, cluster_gpus, False)
    na, end, real, ok, nf, _ = _plan_w(
        job.iter_left, job.deadline, 0, tables.levels[None], np.array([len(tables.levels)]),
        tables.rate[None], tables.fit[None], np.array([job.max_gpus]),
        m, nxt, now_s, slot_s, cluster_gpus, assign_, ws, True, False,
    )  # fmt: skip
    return Plan(
        tuple(zip(ws[OUT_K, :na].tolist(), ws[OUT_V, :na].tolist(), strict=True)),
        int(end),
        float(real),
        bool(ok),
        Profile(tuple(ws[FREE_K, :nf].tolist()), tuple(ws[FREE_V, :nf].tolist())),
    )
