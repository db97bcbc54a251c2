"""Lyra (spec Part A): capacity loaning from an inference cluster plus elastic scaling, replayed.

A trace-driven simulator of §A4: the scheduler runs on a 60 s epoch grid [A] (only when an
arrival, a completion or a loan change gives it something to do), the orchestrator every 300 s
(§A2.1), and jobs progress continuously between epochs with exact completion times. Per job the
work is `workers * duration` V100 worker-seconds and runs at `speed * workers` (§A1, linear
scaling); a T4 worker takes twice the GPUs of a V100 worker (16 vs 32 GB, §A4) and, at 1 T4 =
1/3 V100 (§A2.3), runs at 2/3 of its speed. A preempted job loses its progress and pays 63 s
(§A2.2: no checkpointing by default).

Choices the spec leaves open [A]: the usage predictor is perfect (the orchestrator sizes the
loan for the larger of this and the next 5-minute sample; the thesis's LSTM loss is 0.00048);
idle inference servers are lent lowest index first; a preempted job stays on the training
cluster afterwards; queued jobs are placed in queue order (SJF or FIFO), each job's workers
best-fit; the MCKP runs per pool (training V100s, on-loan T4s) because in Basic a job's workers
share one GPU type. `Result.gpu_utilisation` is Table 3.5's "GPU Training": V100-equivalent
GPUs training jobs hold (T4 = 1/3) over the training cluster, within the trace's days;
`LyraStats` carries the rest of §A3's metrics.

Schedulers (§A3's names): `baseline` (FIFO, no loaning, no scaling), `opportunistic`
(fungible jobs queue FIFO on idle inference servers, inference takes servers back at random),
`random` / `scf` / `lyra-loaning` (loaning with that reclaim policy, SJF, no scaling: Table 3.5
rows 7-9), `gandiva` / `afs` / `lyra-scaling` (scaling only: rows 10, 11, 13) and `lyra`
(both, row 2). Pollux and Lyra+TunedJobs need goodput models and are left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cluster.lyra_cluster import FLEX, LOAN, NONE, TRAIN, Cluster
from cluster.lyra_mckp import (
    flex_items,
    greedy_marginal,
    reclaim_lyra,
    reclaim_random,
    reclaim_scf,
    solve_mckp,
)
from cluster.lyra_trace import (
    INFER_SERVERS,
    LOAD,
    SERVER_GPUS,
    TICK_S,
    TRAIN_SERVERS,
    LyraTrace,
    generate_trace,
)
from cluster.simulate import Result
from ground.errors import UsageError

__all__ = [
    "LYRA_SCHEDULERS",
    "Assumptions",
    "LyraRun",
    "LyraStats",
    "Scheme",
    "replay",
    "run_lyra",
]

EPOCH_S = 60.0  # job-scheduler period [A]; the orchestrator runs every TICK_S
PREEMPT_S = 63.0
HEADROOM = 0.02
T4_SPEED = 2.0 / 3.0  # a T4 worker: 2x the GPUs at 1/3 of a V100 each


@dataclass(frozen=True)
class Assumptions:
    """The model's assumptions that decide whether Lyra beats the baseline on mean JCT (each
    measured in docs/cluster.md, `moelambda bench lyra`). Defaults: as built.

    - `t4_speed`: a loaned T4 worker's speed relative to a V100 worker (§A2.3: a T4 is 1/3 of
      a V100 and a worker takes 2 of them, so 2/3).
    - `checkpoint`: a preempted job resumes where it was (True) or restarts from scratch
      (§A2.2: no job checkpoints by default).
    - `unscaled_elastic`: the workers a scheme without elastic scaling gives an elastic job:
      the w_max it asks for ("w_max", [A]) or its base demand ("w_min").
    """

    t4_speed: float = T4_SPEED
    checkpoint: bool = False
    unscaled_elastic: str = "w_max"


@dataclass(frozen=True)
class Scheme:
    """What a scheduler does: its queue order, loaning and reclaim policy, and scaling."""

    order: str  # "fifo" (head-of-line blocking) or "sjf"
    loaning: str  # "none", "opportunistic", "random", "scf" or "lyra"
    scaling: str  # "none", "gandiva", "afs" or "mckp"


_SCHEMES = {
    "baseline": Scheme("fifo", "none", "none"),
    "opportunistic": Scheme("fifo", "opportunistic", "none"),
    "random": Scheme("sjf", "random", "none"),
    "scf": Scheme("sjf", "scf", "none"),
    "lyra-loaning": Scheme("sjf", "lyra", "none"),
    "gandiva": Scheme("fifo", "none", "gandiva"),
    "afs": Scheme("sjf", "none", "afs"),
    "lyra-scaling": Scheme("sjf", "none", "mckp"),
    "lyra": Scheme("sjf", "lyra", "mckp"),
}
LYRA_SCHEDULERS: tuple[str, ...] = tuple(_SCHEMES)


@dataclass
class LyraStats:
    """The §A3 metrics `Result` has no field for (times in seconds)."""

    queue_mean_s: float
    queue_median_s: float
    queue_p95_s: float
    jct_median_s: float
    preemption_ratio: float  # preemptions / submissions (Table 3.5 footnote, §D.5)
    overall_utilisation: float  # (V100 + all busy T4) / all GPUs, over the trace's days
    loaned_server_hours: float
    loan_utilisation: float  # T4 GPU-time training used / T4 GPU-time on loan
    flex_reclaim_share: float  # share of reclaimed servers the FLEX group supplied
    collateral_damage: float  # GPUs freed on kept servers / GPUs reclaimed
    scaling_ops: int


@dataclass
class LyraRun:
    result: Result
    stats: LyraStats


class _Sim:
    """One replay: the trace's jobs as arrays, the cluster, the clock and the counters."""

    def __init__(self, trace: LyraTrace, scheme: Scheme, seed: int, a: Assumptions) -> None:
        self.t, self.s, self.a = trace, scheme, a
        self.c = Cluster()
        self.rng = np.random.default_rng(seed + 1)
        n = trace.jobs
        self.work = trace.workers * trace.duration
        self.rem = self.work.astype(float)
        self.speed = np.ones(n)
        self.pool = np.zeros(n, dtype=np.int8)
        self.nbase = np.zeros(n, dtype=int)
        self.nflex = np.zeros(n, dtype=int)
        self.delay = np.zeros(n)
        self.npre = np.zeros(n, dtype=int)
        self.finish = np.full(n, np.nan)
        self.first_start = np.full(n, np.nan)
        self.elastic = trace.elastic if scheme.scaling != "none" else np.zeros(n, dtype=bool)
        at_base = self.elastic | (trace.elastic & (a.unscaled_elastic == "w_min"))
        self.start_workers = np.where(at_base, trace.w_min, trace.workers)
        self.running: set[int] = set()
        self.queue: list[int] = []
        self.preemptions = self.scaling_ops = 0
        self.v100_s = self.t4_s = self.loan_s = 0.0
        self.reclaimed = self.flex_reclaimed = self.collateral = 0

    # -- job placement -----------------------------------------------------------------
    def _t4_shape(self, job: int, workers: int) -> tuple[int, int]:
        """A V100 worker of g GPUs becomes 2g T4 GPUs, split into whole-server chunks."""
        t4 = 2 * int(self.t.gpus_per_worker[job])
        size = min(t4, SERVER_GPUS)
        return size, workers * t4 // size

    def _pools(self, job: int) -> tuple[int, ...]:
        """Where a job may run, preferred first (§A2.4): elastic jobs on loan first. A job
        preempted once stays on the training cluster [A]: otherwise a multi-day job on loan
        loses its work at every evening reclaim and never ends."""
        if not self.t.fungible[job] or self.s.loaning == "none" or self.npre[job]:
            return (TRAIN,)
        if self.s.loaning == "opportunistic":
            return (LOAN,)
        return (LOAN, TRAIN) if self.t.elastic[job] else (TRAIN, LOAN)

    def _launch(self, job: int, now: float) -> bool:
        workers = int(self.start_workers[job])
        for pool in self._pools(job):
            if pool == TRAIN:
                size, count = int(self.t.gpus_per_worker[job]), workers
            else:
                size, count = self._t4_shape(job, workers)
            if self.c.place(job, size, count, pool, flex=False):
                self.pool[job] = pool
                self.speed[job] = 1.0 if pool == TRAIN else self.a.t4_speed
                self.nbase[job] = workers
                self.running.add(job)
                if math.isnan(self.first_start[job]):
                    self.first_start[job] = now
                return True
        return False

    def _preempt(self, job: int) -> None:
        self.c.drop(job, flex=False)
        self.c.drop(job, flex=True)
        self.running.discard(job)
        self.nbase[job] = self.nflex[job] = 0
        if not self.a.checkpoint:
            self.rem[job] = self.work[job]
        self.delay[job] = PREEMPT_S
        self.npre[job] += 1
        self.preemptions += 1
        self.queue.append(job)

    # -- scheduling (§A2.3) --------------------------------------------------------------
    def schedule(self, now: float) -> None:
        if self.queue:
            self._phase1(now)
        if self.s.scaling != "none":
            self._phase2()

    def _phase1(self, now: float) -> None:
        q = np.array(self.queue)
        if self.s.order == "fifo":
            order = q[np.lexsort((q, self.t.submit[q]))]
        else:
            order = q[np.argsort(self.work[q] / self.start_workers[q], kind="stable")]
        launched, blocked = set(), set()
        for job in order.tolist():
            pools = self._pools(job)
            if blocked.issuperset(pools):
                continue  # FIFO: an earlier job of these pools waits, so this one waits too
            if self._launch(job, now) or self._launch_by_scaling_in(job, now):
                launched.add(job)
            elif self.s.order == "fifo":
                blocked.update(pools)
                if blocked.issuperset((TRAIN, LOAN)):
                    break
        if launched:
            self.queue = [j for j in self.queue if j not in launched]

    def _launch_by_scaling_in(self, job: int, now: float) -> bool:
        """Flexible workers are part of the resource set (§A2.3): when a base demand does not
        fit in idle GPUs, scale in elastic jobs of its pools, the ones whose flexible workers
        save the least time per GPU first, until it fits; phase 2 then hands back the rest."""
        if self.s.scaling == "none" or not self.c.flex:
            return False
        pools = self._pools(job)
        donors = [j for j in self.c.flex if self.pool[j] in pools]
        held = sum(g for j in donors for _, g in self.c.flex[j])
        need = int(self.t.gpus_per_worker[job] * self.start_workers[job])
        mask = ~self.c.infer if TRAIN in pools else np.zeros_like(self.c.infer)
        idle = int(self.c.free[mask | (self.c.on_loan if LOAN in pools else False)].sum())
        if held == 0 or idle + held < need:
            return False
        donors.sort(key=lambda j: self.rem[j] / (self.nbase[j] + self.nflex[j]))
        for other in donors:
            self.c.drop(other, flex=True)
            self.nflex[other] = 0
            self.scaling_ops += 1
            if self._launch(job, now):
                return True
        return False

    def _phase2(self) -> None:
        """Flexible demand (§A2.3 phase 2), per pool because a job's workers share one GPU
        type in Basic. Only the free room is handed out [A]: flexible workers keep their GPUs
        until a base demand needs them (`_launch_by_scaling_in`), which avoids moving workers
        every epoch for the same answer."""
        for pool in (TRAIN, LOAN):
            jobs = [j for j in self.running if self.elastic[j] and self.pool[j] == pool]
            if not jobs:
                continue
            jobs.sort()
            sizes = [self._flex_size(j, pool) for j in jobs]
            held = sum(int(self.nflex[j]) * sz for j, sz in zip(jobs, sizes, strict=True))
            mask = self.c.allowed(pool, flex=True)
            unit = min(sizes)
            room = int((self.c.free[mask] // unit).sum()) * unit
            if room < unit or all(
                self.nbase[j] + self.nflex[j] >= self.t.workers[j] for j in jobs
            ):
                continue  # nobody can grow: keep the current split rather than churn
            capacity = room + held
            self._apply(jobs, sizes, self._decide(jobs, sizes, pool, capacity), pool)

    def _flex_size(self, job: int, pool: int) -> int:
        return int(self.t.gpus_per_worker[job]) * (1 if pool == TRAIN else 2)

    def _decide(self, jobs: list[int], sizes: list[int], pool: int, capacity: int) -> list[int]:
        """Extra workers per job: the MCKP (Lyra), AFS's greedy, or Gandiva's fill-when-idle."""
        speed = 1.0 if pool == TRAIN else self.a.t4_speed
        groups = [
            flex_items(
                float(self.rem[j]),
                int(self.nbase[j] + self.nflex[j]),
                int(self.t.workers[j]),
                sz,
                speed,
            )
            for j, sz in zip(jobs, sizes, strict=True)
        ]
        if self.s.scaling == "mckp":
            picks = solve_mckp(groups, capacity)
        elif self.s.scaling == "afs":
            picks = greedy_marginal(groups, capacity)
        else:  # Gandiva scales out only when nothing is pending
            picks = [len(g) - 1 for g in groups] if not self.queue else [-1] * len(groups)
            picks = _trim_to(groups, picks, capacity)
        return [int(self.nflex[j]) + p + 1 for j, p in zip(jobs, picks, strict=True)]

    def _apply(self, jobs: list[int], sizes: list[int], want: list[int], pool: int) -> None:
        """Scale out with best fit; a worker that does not fit (fragmentation) is not added."""
        for j, sz, w in zip(jobs, sizes, want, strict=True):
            if w > self.nflex[j]:
                added = 0
                while self.nflex[j] + added < w and self.c.place(j, sz, 1, pool, flex=True):
                    added += 1
                if added:
                    self.nflex[j] += added
                    self.scaling_ops += 1

    # -- loaning (§A2.1, §A2.2) ----------------------------------------------------------
    def orchestrate(self, tick: int) -> None:
        need = self.t.inference_gpus
        u = max(need[tick % need.size], need[(tick + 1) % need.size]) / (INFER_SERVERS * 8)
        loaned = int(self.c.on_loan.sum())
        delta = math.floor(INFER_SERVERS * (1 - u - HEADROOM)) - loaned
        if delta > 0:
            idle = np.flatnonzero(self.c.infer & ~self.c.on_loan)[:delta]
            self.c.on_loan[idle] = True
        elif delta < 0:
            self._reclaim(-delta)

    def _reclaim(self, n: int) -> None:
        on = np.flatnonzero(self.c.on_loan)
        servers = {int(s): self.c.jobs[s] for s in on}
        if self.s.loaning == "lyra":
            flex = {s for s in servers if self.c.group[s] == FLEX}
            chosen, victims = reclaim_lyra(n, servers, flex)
        elif self.s.loaning == "scf":
            chosen, victims = reclaim_scf(n, servers)
        else:
            chosen, victims = reclaim_random(n, servers, self.rng)
        chosen_set = set(chosen)
        for s in chosen:
            if self.c.group[s] == FLEX:
                self.flex_reclaimed += 1
                for j in list(self.c.jobs[s]):
                    self._scale_in_from(j, s)
        for j in victims:
            self.collateral += sum(g for s, g in self.c.base.get(j, []) if s not in chosen_set)
            self._preempt(j)
        self.c.on_loan[chosen] = False
        self.c.group[chosen] = NONE
        self.reclaimed += len(chosen)

    def _scale_in_from(self, job: int, s: int) -> None:
        """Drop the job's flexible workers on server `s` (a FLEX server being reclaimed)."""
        self.nflex[job] -= self.c.drop_on(job, s)
        self.scaling_ops += 1

    # -- time --------------------------------------------------------------------------
    def advance(self, now: float, dt: float, window: float) -> list[int]:
        """Run every job for `dt` seconds from `now`; returns the jobs that finished."""
        if not self.running or dt <= 0:
            return []
        run = np.fromiter(self.running, dtype=int)
        rate = self.speed[run] * (self.nbase[run] + self.nflex[run])
        wait = np.minimum(self.delay[run], dt)
        self.delay[run] -= wait
        due = self.rem[run] / rate
        done = due <= dt - wait
        self.finish[run[done]] = now + wait[done] + due[done]
        self.rem[run] -= rate * (dt - wait)
        inside = max(min(now + dt, window) - now, 0.0)
        train = ~self.c.infer
        self.v100_s += inside * float(SERVER_GPUS * train.sum() - self.c.free[train].sum())
        loan = self.c.on_loan
        self.t4_s += inside * float(SERVER_GPUS * loan.sum() - self.c.free[loan].sum())
        self.loan_s += inside * SERVER_GPUS * float(loan.sum())
        finished = run[done].tolist()
        for j in finished:
            self.c.drop(j, flex=False)
            self.c.drop(j, flex=True)
            self.running.discard(j)
        return finished

    def next_completion(self, now: float) -> float:
        if not self.running:
            return math.inf
        run = np.fromiter(self.running, dtype=int)
        rate = self.speed[run] * (self.nbase[run] + self.nflex[run])
        return now + float(np.min(self.delay[run] + self.rem[run] / rate))


def _trim_to(groups: list[list[tuple[int, float]]], picks: list[int], capacity: int) -> list[int]:
    """Lower picks in order until their weights fit (Gandiva fills first come, first served)."""
    out, used = [], 0
    for g, p in zip(groups, picks, strict=True):
        while p >= 0 and used + g[p][0] > capacity:
            p -= 1
        used += g[p][0] if p >= 0 else 0
        out.append(p)
    return out


def replay(
    trace: LyraTrace,
    scheduler: str = "lyra",
    *,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    assumptions: Assumptions | None = None,
) -> LyraRun:
    """Replay `trace` under `scheduler` until every job has finished."""
    if scheduler not in _SCHEMES:
        raise UsageError(
            f"unknown Lyra scheduler '{scheduler}'.", f"use one of: {', '.join(LYRA_SCHEDULERS)}."
        )
    started = time.perf_counter()
    sim = _Sim(trace, _SCHEMES[scheduler], seed, assumptions or Assumptions())
    loaning = sim.s.loaning != "none"
    window = trace.days * 86400
    submit = trace.submit
    n, seen, now, tick = trace.jobs, 0, 0.0, 0
    done = 0
    while done < n:
        nxt_arrival = submit[seen] if seen < n else math.inf
        nxt = min(nxt_arrival, sim.next_completion(now))
        nxt = max(now + EPOCH_S, math.ceil(nxt / EPOCH_S) * EPOCH_S)
        if loaning:
            nxt = min(nxt, tick * TICK_S)
        done += len(sim.advance(now, nxt - now, window))
        now = nxt
        while seen < n and submit[seen] <= now:
            sim.queue.append(seen)
            seen += 1
        if loaning and now >= tick * TICK_S:
            sim.orchestrate(tick)
            tick += 1
        sim.schedule(now)
        if progress is not None:
            progress(done, n)
    return LyraRun(_result(sim, scheduler, time.perf_counter() - started), _stats(sim))


def _result(sim: _Sim, scheduler: str, wall: float) -> Result:
    t = sim.t
    jct = sim.finish - t.submit
    window = t.days * 86400
    busy = sim.v100_s + sim.t4_s * sim.a.t4_speed / 2  # T4 GPUs normalised to V100s
    return Result(
        scheduler=scheduler,
        jobs=t.jobs,
        deadline_ratio=None,
        avg_jct_s=float(jct.mean()),
        p95_jct_s=float(np.percentile(jct, 95)),
        makespan_s=float(np.nanmax(sim.finish) - t.submit[0]),
        preemptions=sim.preemptions,
        gpu_utilisation=busy / (TRAIN_SERVERS * SERVER_GPUS * window),
        wall_s=wall,
        finish={i: float(f) for i, f in enumerate(sim.finish)},
    )


def _stats(sim: _Sim) -> LyraStats:
    t = sim.t
    wait = sim.first_start - t.submit  # until the first launch (§A3's queuing time)
    window = t.days * 86400
    inference_s = float(np.sum(t.inference_gpus[: int(window / TICK_S)]) * TICK_S)
    all_gpus = (TRAIN_SERVERS + INFER_SERVERS) * SERVER_GPUS
    return LyraStats(
        queue_mean_s=float(wait.mean()),
        queue_median_s=float(np.median(wait)),
        queue_p95_s=float(np.percentile(wait, 95)),
        jct_median_s=float(np.median(sim.finish - t.submit)),
        preemption_ratio=sim.preemptions / t.jobs,
        overall_utilisation=(sim.v100_s + sim.t4_s + inference_s) / (all_gpus * window),
        loaned_server_hours=sim.loan_s / SERVER_GPUS / 3600,
        loan_utilisation=sim.t4_s / sim.loan_s if sim.loan_s else 0.0,
        flex_reclaim_share=sim.flex_reclaimed / sim.reclaimed if sim.reclaimed else 0.0,
        collateral_damage=sim.collateral / (sim.reclaimed * SERVER_GPUS) if sim.reclaimed else 0.0,
        scaling_ops=sim.scaling_ops,
    )


def run_lyra(
    *,
    scheduler: str = "lyra",
    days: float = 15,
    jobs: int = 50_000,
    seed: int = 0,
    inference_demand: np.ndarray | None = None,
    progress: Callable[[int, int], None] | None = None,
    load: float = LOAD,
    assumptions: Assumptions | None = None,
) -> LyraRun:
    """Generate the seeded trace (`cluster.lyra_trace`; `load` = offered GPU-seconds over the
    training cluster's) and replay it: `Result` and `LyraStats`."""
    if scheduler not in _SCHEMES:
        raise UsageError(
            f"unknown Lyra scheduler '{scheduler}'.", f"use one of: {', '.join(LYRA_SCHEDULERS)}."
        )
    trace = generate_trace(
        days=days, jobs=jobs, seed=seed, inference_demand=inference_demand, load=load
    )
    return replay(trace, scheduler, seed=seed, progress=progress, assumptions=assumptions)
