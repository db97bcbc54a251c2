"""ElasticFlow (ASPLOS'23) as its artifact's simulator runs it (`ef_sim_jobs_access_control` in
scheduler.py of pkusys/ElasticFlow, commit 04a0109). Each rule below names the artifact
function it comes from; the per-job plan is `cluster.ef_planner`, the placement that decides
the overhead `cluster.ef_placement`. The replay was compared with the artifact's per-event
logs (`scheduling_events.csv`, `job.csv`) round by round (docs/cluster.md).

A round (the simulator's event: an arrival, a planned end, or a scale event):

1. **Progress** (`JOBS.run_all_jobs`): each job runs the interval at its GPUs minus the
   overhead it paid at the interval's start, and no work counts past the real end its last
   plan promised. A job whose work is done before its planned end leaves at this event.
2. **Ends** (`ef_sim_jobs_access_control`): a job leaving meets its deadline if its last
   plan's real end (`real_end_time`) is by then, whenever it actually finished.
3. **Admission** (`estimate_all_jobs` on the jobs in the system plus the round's arrivals):
   every job is planned afresh in deadline order (ties keep the previous round's order); the
   arrivals are admitted together only if every plan, old and new, meets its deadline.
4. **Plans** (`estimate_all_jobs`, then `ef_sim_allocation` per job): every job in the system
   is planned again, in deadline order, on a fresh profile; its GPUs now are its plan's.
5. **Idle GPUs** (`allocate_free_gpus`, `get_marginal`): each job's plan with its next level
   now (`assign_gpu`) is estimated on the profile with its own plan given back; the jobs are
   sorted by planned GPU-time gained per GPU, descending (jobs holding no GPUs first; a job
   that cannot grow or does not fit counts -inf and keeps a stale value once it cannot grow
   any more), and the first that fits gets its level. Every estimate is then made again,
   and this repeats until no job gets one.
6. **Order and placement**: the jobs are sorted by GPUs, descending (stably: every sort of
   the round keeps the order of ties, and the order carries to the next round), and placed
   (`ef_placement`); a job whose GPU set was used since the last restart is cached.
7. **Scale event** (`JOBS.add_job_scale_event_new`): the next round is at the earliest first
   change of any job's allocation (its first breakpoint after now, which may be a zero after
   its end), unless an arrival or planned end comes first.
8. **Overhead** (`utils.estimate_overhead`, the simulation branch of the loop): each running
   job's planned end moves by its scaling overhead (2 s when cached, else 2 s per doubling
   plus 2 s, and 27 s more on every 60th round, when every trainer restarts and the cache
   empties; 7 s and 47 s on clusters of 256 GPUs or more).

`elasticflow-noadmit` is the same replay admitting every arrival (our ablation; the artifact's
`ef_sim_jobs` differs in other ways and is not reproduced).
"""

from __future__ import annotations

import math

import numpy as np

from cluster.ef_kernels import admits, plan_round
from cluster.ef_placement import Nodes
from cluster.ef_planner import Tables
from cluster.simulate import Running, overhead_s, run_interval
from cluster.workload import Cluster, Job, ScalingCurve

__all__ = ["ElasticFlow", "elastic_max_gpus"]

_ELASTIC_MAX_T4 = {"bert": 16, "cifar10": 16, "yolov3": 4, "ncf": 1}
_RESTART_EVERY = 60  # rounds between restarts of every trainer (the artifact's)


def elastic_max_gpus(model: str, batch: int, gpu_type: str) -> int:
    """The most GPUs ElasticFlow gives a job: the artifact's per-model limits (its
    `models.get_max_gpu`), where its profiles show scaling stop paying."""
    if gpu_type.upper() == "T4":
        if model == "deepspeech2" and batch == 320:
            return 32
        return _ELASTIC_MAX_T4.get(model, 64)
    limits = {
        ("gpt2", 128): 16,
        ("gpt2", 256): 32,
        ("bert", 64): 8,
        ("inception3", 64): 16,
        ("inception3", 128): 32,
        ("resnet50", 64): 32,
        ("vgg16", 64): 32,
    }
    if model == "deepspeech2":
        return batch
    if model == "bert":
        return limits.get((model, batch), 16)
    return limits.get((model, batch), min(batch, 64))


class ElasticFlow:
    """ElasticFlow, or with `admission=False` its no-admission-control ablation."""

    judges_plan = True

    def __init__(
        self,
        cluster: Cluster,
        curves: dict[tuple[str, int], ScalingCurve],
        gpu_type: str,
        slot_s: float = 60.0,
        *,
        admission: bool = True,
    ) -> None:
        self.cluster, self.curves, self.gpu_type = cluster, curves, gpu_type
        self.slot, self.admission = slot_s, admission
        self.name = "elasticflow" if admission else "elasticflow-noadmit"
        self.order: list[Running] = []  # the artifact's `runnable_jobs`, in its order
        per_switch = cluster.nodes // cluster.switches
        self.nodes = Nodes(cluster.switches, per_switch, cluster.gpus_per_node)
        self.cache: set[tuple[int, int]] = set()
        self.types = JobTypes(cluster.gpus)

    def curve(self, job: Job) -> ScalingCurve:
        return self.curves[job.model, job.batch].capped(self._limit(job))

    def _limit(self, job: Job) -> int:
        return elastic_max_gpus(job.model, job.batch, self.gpu_type)

    def _arrays(self, jobs: list[Running]) -> tuple[np.ndarray, ...]:
        """The kernels' view of the jobs, in this order: type, iterations left, deadline."""
        types = np.array([a.state["type"] for a in jobs], dtype=np.int64)
        left = np.array([a.iter_left for a in jobs], dtype=np.float64)
        ddl = np.array([a.job.deadline for a in jobs], dtype=np.float64)
        t = self.types
        return types, left, ddl, (t.levels, t.nlevels, t.rate, t.fit, t.max_gpus)

    advance = staticmethod(run_interval)

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]:
        for entry in new:
            levels = tuple(int(g) for g in entry.curve.levels)
            rate = dict(zip(levels, (float(r) for r in entry.curve.rate), strict=True))
            key = entry.job.model, entry.job.batch
            entry.state["type"] = self.types.of(key, levels, rate, self._limit(entry.job))
        if self.admission:
            present = {id(a) for a in jobs}
            order = _by_deadline([*(a for a in self.order if id(a) in present), *new])
            if not admits(*self._arrays(order), now, self.slot, self.cluster.gpus):
                return []
        self.order += new
        return new

    def schedule(self, now: float, jobs: list[Running]) -> float:
        present = {id(a) for a in jobs}
        gone = [a for a in self.order if id(a) not in present]
        order = _by_deadline([a for a in self.order if id(a) in present])
        # Releases (`release_job_res`): the round's ends in the order of their end events
        # (early finishes last), then every other job in deadline order.
        gone.sort(key=lambda a: ("early" in a.state, a.end))
        self.nodes.release([a.job.id for a in (*gone, *order)])
        perm, held, end, real, change = plan_round(
            *self._arrays(order), now, self.slot, self.cluster.gpus
        )
        wake = math.inf
        for entry, gpus, e, r, c in zip(
            order, held.tolist(), end.tolist(), real.tolist(), change.tolist(), strict=True
        ):
            entry.gpus = gpus
            entry.end = now + e * self.slot
            entry.judged = r
            if c >= 0:
                wake = min(wake, now + c * self.slot)
        order = [order[k] for k in perm.tolist()]
        order.sort(key=lambda a: a.gpus, reverse=True)
        self.order = order
        self._place(order)
        return wake

    def _place(self, order: list[Running]) -> None:
        """Place the round's jobs and read which GPU sets the trainer cache already holds
        (`LOG.scheduling_result`): the flag a job's overhead depends on."""
        visits = self.nodes.place({a.job.id: a.gpus for a in order})
        by_id = {a.job.id: a for a in order}
        for start, job in sorted((s, j) for j, starts in visits.items() for s in starts):
            key = start, by_id[job].gpus
            by_id[job].state["cached"] = key in self.cache
            self.cache.add(key)

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        restart = round_index > 0 and round_index % _RESTART_EVERY == 0
        for entry in jobs:
            if entry.gpus:
                cached = entry.state.get("cached", False)
                entry.overhead = overhead_s(entry.gpus, restart, self.cluster.gpus, cached)
                entry.end += entry.overhead
            else:
                entry.overhead = 0.0
        if restart:
            self.cache.clear()


class JobTypes:
    """The tables of every (model, batch) seen so far, stacked for the compiled kernels."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.index: dict[tuple[str, int], int] = {}
        self._tables: list[tuple[Tables, int]] = []
        self.levels = self.nlevels = self.rate = self.fit = self.max_gpus = np.empty(0)

    def of(self, key: tuple[str, int], levels: tuple[int, ...], rate: dict[int, float],
           max_gpus: int) -> int:  # fmt: skip
        """The type's index, stacking its tables the first time it is seen."""
        if key not in self.index:
            self.index[key] = len(self._tables)
            self._tables.append((Tables(levels, rate, self.gpus), max_gpus))
            self._stack()
        return self.index[key]

    def _stack(self) -> None:
        width = max(len(t.levels) for t, _ in self._tables)
        top = max(len(t.rate) for t, _ in self._tables)
        count = len(self._tables)
        self.levels = np.zeros((count, width), np.int64)
        self.nlevels = np.zeros(count, np.int64)
        self.rate = np.full((count, top), np.nan)
        self.fit = np.zeros((count, self.gpus + 1), np.int64)
        self.max_gpus = np.zeros(count, np.int64)
        for i, (t, max_gpus) in enumerate(self._tables):
            self.levels[i, : len(t.levels)] = t.levels
            self.nlevels[i] = len(t.levels)
            self.rate[i, : len(t.rate)] = t.rate
            self.fit[i] = t.fit
            self.max_gpus[i] = max_gpus


def _by_deadline(jobs: list[Running]) -> list[Running]:
    """Deadline order; ties keep the order given (Python's sort is stable, as the
    artifact's)."""
    return sorted(jobs, key=lambda a: a.job.deadline)
