"""Rubick (MLSys'25; the artifact's "Morphling"): reconfigurable DL-cluster scheduling.

The simulation follows the public artifact (AlibabaPAI/reconfigurable-dl-scheduler, commit
80e85248), because its own simulator produced the numbers this module is checked against:

- Time moves in fixed rounds (60 s): every job first runs the round at the *profiled*
  iteration time of its placement and plan (`rubick_workload.Profile`), then the policy
  re-decides every active job. A job that gets a new placement (GPU counts per node) pays a
  260 s checkpoint-restart, its first start included. A job finishes after `steps + 1`
  iterations (the artifact counts one more than the trace's steps); JCT = finish - submit,
  makespan = the first round boundary by which every job has finished.
- The policy decides with the *predicted* curves (`rubick_model.gpu_curve`): data-parallel
  models live on one node and grow to the best plan for the GPUs free there; LLaMA jobs take
  whole 3D placements from fixed menus (`_LLAMA`). Jobs are visited by ascending GPU slope
  (guaranteed jobs first), and a final pass hands each node's leftover GPUs to the job with
  the steepest slope there, then lets LLaMA jobs grow to the largest menu entry that fits.

Deliberately reproduced artifact behaviours (each changes the published numbers):

1. The victim loop of Algorithm 1 (shrink a lower-slope job for this one) never runs in
   the artifact (its guard is always true), so no job is ever shrunk for another.
   Guaranteed jobs (`is_sla`) only start where 1.5x their predicted rate reaches the
   profiled rate of their request.
2. LLaMA jobs holding >= 32 GPUs release them at the start of every round while they have
   restarted fewer than 7 times (or when > 12 guaranteed jobs are active), so the others
   are served first; the final pass usually gives them back.
3. The leftover pass reads the node's free GPUs as they were *before the last job of the
   round was placed* and each job's GPU count of the *previous* round.
4. A job whose allocation is withdrawn keeps running on its last placement: the artifact's
   simulator compares the new allocation with itself and so never applies an empty one.
5. The 3D allocator visits nodes in the order `heapq.heappop` yields from a list of
   (free GPUs, node) that was never heapified.
6. LLaMA jobs get a DP curve too (the artifact's "skip LLaMA" test compares a model object
   with a string); it only orders them, and puts a queued LLaMA job behind new ones.
7. The curve has no NVLink point beyond one node, so a job holding more than 8 GPUs reads
   -1 there: a multi-node LLaMA job has a steep slope and is visited last, after the jobs
   that may take the GPUs it released (which is when 2. and 4. combine).
Without 6. and 7. the base trace gives 25,000 s average JCT instead of the artifact's 3,638 s.
The paper's minRes, anti-starvation threshold and 0.97 reconfiguration rule are not part of
the artifact's policy and so not of this one (A6 of the spec).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cluster.rubick_model import MODELS, gpu_curve
from cluster.rubick_workload import Trace, load_trace, profile
from cluster.simulate import Result
from cluster.workload import Cluster
from ground.errors import UsageError

__all__ = ["ARTIFACT_CLUSTER", "RUBICK_SCHEDULERS", "simulate_rubick"]

#: Rubick and the paper's ablations this simulator can express: `rubick-e` reconfigures plans
#: on fixed resources, `rubick-n` neither (each job runs its request and its own plan).
RUBICK_SCHEDULERS: tuple[str, ...] = ("rubick", "rubick-e", "rubick-n")

RESTART_S = 260.0  # the artifact's checkpoint-restart delay per placement change
STARVED_AGE_S = 200_000.0  # jobs older than this get top slope (the artifact's anti-starvation)
_RELEASE_RESTARTS, _RELEASE_SLA = 7, 12
_HORIZON_S = 30 * 86_400.0  # a job still unfinished this long after the last arrival is stuck
_SLA_SLACK = 1.5  # a guaranteed job runs if 1.5x its predicted rate reaches its request's

# LLaMA 3D menus (artifact `sched/models/llama*.py`): GPU count -> placements tried in order,
# in the order the allocator tries the counts, and each placement's plan.
_LLAMA: dict[str, tuple[dict[int, tuple[str, ...]], dict[str, str]]] = {
    "llama7": (
        {
            16: ("88", "4444", "22222222"),
            64: ("88888888",),
            32: ("8888", "44444444"),
            8: ("8",),
            4: ("4",),
            2: ("2",),
            1: ("1",),
        },
        {
            "88888888": "248",
            "8888": "244",
            "88": "182",
            "44444444": "244",
            "4444": "242",
            "22222222": "224",
            "8": "zero-offload",
            "4": "zero-offload",
            "2": "zero-offload",
            "1": "zero-offload",
        },
    ),
    "llama30": (
        {48: ("888888",), 40: ("88888",), 32: ("8888",), 24: ("444444",)},
        {"888888": "344", "88888": "524", "8888": "442", "444444": "641"},
    ),
}


ARTIFACT_CLUSTER = Cluster(8, 8)  # the artifact's simulated cluster: 8 nodes of 8 GPUs


def _family(plan: str) -> str:
    """The profile rows a plan Rubick chose runs at in the artifact: its plans are tuples
    that only match a row through a ZeRO name, so plain DP (GA or GC) runs at the GA row and
    a 3D plan at the mean of the rows of its node and GPU count."""
    return plan if plan in ("zero-dp", "zero-offload") else "ga"


def _fit_3d(free: np.ndarray, chunks: tuple[int, ...]) -> dict[int, int] | None:
    """Place the chunks (GPUs per node) of a 3D placement, one per node, visiting nodes in
    the artifact's un-heapified heappop order; None if they do not all fit."""
    queue = [(int(f), n) for n, f in enumerate(free) if f > 0]
    left, got = sorted(chunks, reverse=True), {}
    need = sum(chunks)
    while sum(got.values()) < need and queue:
        _, node = heapq.heappop(queue)  # the list is not a heap: this is the artifact's order
        got.setdefault(node, 0)
        for i, chunk in enumerate(left):
            if chunk and chunk <= free[node]:
                got[node] += chunk
                left[i] = 0
                break
    return got if sum(got.values()) == need else None


class _Rubick:
    """The artifact's policy state and one scheduling round (`decide`)."""

    def __init__(self, trace: Trace, cluster: Cluster, scheduler: str = "rubick") -> None:
        self.trace, self.cluster = trace, cluster
        self.fixed = scheduler != "rubick"
        n = len(trace)
        curves = {m: gpu_curve(MODELS[m], cluster.gpus_per_node) for m in set(trace.model)}
        self.curve = curves
        self.tp = np.stack([curves[m].throughput for m in trace.model])
        self.best = np.stack([curves[m].gpus for m in trace.model])
        self.base = np.array([MODELS[m].base_throughput for m in trace.model])
        self.llama = np.array([MODELS[m].three_d for m in trace.model])
        self.alloc = np.zeros((n, cluster.nodes), dtype=int)
        self.plan = [""] * n
        self.seen = np.full(n, -1)  # order of first scheduling (the artifact's dict order)
        # a guaranteed job's request: its profiled rate with its GPUs on one node, its own plan
        self.sla_rate = np.array(
            [
                MODELS[m].batch / profile(m).iter_time((g,), p) if s else 0.0
                for m, g, p, s in zip(trace.model, trace.gpus, trace.plan, trace.sla, strict=True)
            ]
        )

    def _slope(
        self, jobs: np.ndarray, gpus: np.ndarray, delta: int, age: np.ndarray
    ) -> np.ndarray:
        """Predicted throughput gained per extra GPU, normalised by the model's usual rate.

        The artifact's curve has no NVLink-bandwidth point beyond one node, so a job holding
        more GPUs reads -1 there: multi-node LLaMA jobs get a steep slope and go last."""
        top = self.cluster.gpus_per_node
        now = np.where(gpus > top, -1.0, self.tp[jobs, np.minimum(gpus, top)])
        more = self.tp[jobs, np.minimum(gpus + delta, top)]
        slope = np.abs(now - more) / self.base[jobs] / delta
        return np.where(age > STARVED_AGE_S, 1e9, slope)

    def _place(self, j: int, node: int, gpus: int) -> None:
        self.alloc[j, node] = gpus
        plan = self.curve[self.trace.model[j]].plan[gpus]
        self.plan[j] = (plan[1] or plan[0]) if plan else ""

    def _grow_on_node(self, j: int, free: np.ndarray) -> None:
        """A DP job takes every free GPU of its node (or of the emptiest node), then keeps
        the best count within them; a guaranteed job only if that meets its request."""
        mine = np.flatnonzero(self.alloc[j])
        nodes = mine if mine.size else np.argsort(-free, kind="stable")
        for node in nodes:
            own = self.alloc[j, node]
            total = int(free[node] + own)
            if self.trace.sla[j]:
                ok = _SLA_SLACK * self.tp[j, total] >= self.sla_rate[j]
            else:
                ok = total != own
            if ok:
                self._place(j, node, int(self.best[j, total]))
                return

    def _llama_fit(self, j: int, free: np.ndarray, counts: list[int]) -> bool:
        menu, plans = _LLAMA[self.trace.model[j]]
        for count in counts:
            for shape in menu[count]:
                got = _fit_3d(free, tuple(map(int, shape)))
                if got is not None:
                    self.alloc[j] = 0
                    for node, gpus in got.items():
                        self.alloc[j, node] = gpus
                    self.plan[j] = plans[shape]
                    return True
        return False

    def _leftovers(self, stale_free: np.ndarray, prev: np.ndarray, age: np.ndarray) -> None:
        """Per node, hand the (stale) free GPUs to the steepest-slope DP job there."""
        for node in range(self.cluster.nodes):
            on = np.flatnonzero(self.alloc[:, node])
            if not on.size:
                continue
            on = on[np.argsort(self.seen[on], kind="stable")]
            left, grown, done = int(stale_free[node]), {}, False
            while left > 0 and not done:
                ranked = on[np.argsort(-self._slope(on, prev[on], left, age[on]), kind="stable")]
                movable = np.flatnonzero(~self.llama[ranked])
                # the artifact stops after this pass when the job it moves is the last ranked
                done = not movable.size or movable[0] == len(ranked) - 1
                if not movable.size:
                    break
                j = int(ranked[movable[0]])
                gpus = int(self.best[j, min(prev[j] + left, self.cluster.gpus_per_node)])
                grown[j] = gpus
                left -= gpus - prev[j]
                done = done or gpus == prev[j]
            for j, gpus in grown.items():
                self._place(j, node, gpus)

    def decide(self, now: float, active: np.ndarray, restarts: np.ndarray) -> None:
        """One round of the artifact's policy over the active jobs (index order)."""
        gpus = self.cluster.gpus_per_node
        age = now - self.trace.submit
        prev = self.alloc.sum(axis=1)
        new = self.seen[active] < 0
        slope = np.where(
            new,
            np.abs(self.tp[active, 1]) / self.base[active],
            self._slope(active, prev[active], 1, age[active]),
        )
        by_slope = active[np.argsort(slope, kind="stable")]
        sla = self.trace.sla[by_slope]
        order = np.concatenate([by_slope[sla], by_slope[~sla]])
        if self.fixed:
            self._start_fixed(order)
            return
        release = (
            self.llama[active]
            & (prev[active] >= 32)
            & ((np.maximum(restarts[active], 0) < _RELEASE_RESTARTS) | (sla.sum() > _RELEASE_SLA))
        )
        self.alloc[active[release]] = 0
        stale_free = None
        for j in order:
            if self.seen[j] < 0:
                self.seen[j] = self.seen.max() + 1
            free = gpus - self.alloc.sum(axis=0)
            stale_free = free
            if self.llama[j]:
                self._llama_fit(j, free, list(_LLAMA[self.trace.model[j]][0]))
            else:
                self._grow_on_node(j, free)
        self._leftovers(stale_free, prev, age)
        for j in by_slope[self.llama[by_slope]]:
            mine = self.alloc[j].copy()
            self.alloc[j] = 0
            free = gpus - self.alloc.sum(axis=0)
            counts = sorted(_LLAMA[self.trace.model[j]][0], reverse=True)
            if not self._llama_fit(j, free, counts):
                self.alloc[j] = mine

    def _start_fixed(self, order: np.ndarray) -> None:
        """The ablations: in slope order, start each waiting job on exactly its request (a DP
        job on the emptiest node, a LLaMA job on its menu's placements); nothing moves."""
        for j in order:
            if self.seen[j] < 0:
                self.seen[j] = self.seen.max() + 1
            if self.alloc[j].any():
                continue
            free = self.cluster.gpus_per_node - self.alloc.sum(axis=0)
            want = int(self.trace.gpus[j])
            if self.llama[j]:
                if not self._llama_fit(j, free, [want]):
                    continue
            else:
                node = int(np.argmax(free))
                if free[node] < want:
                    continue
                self.alloc[j, node] = want
            self.plan[j] = self.fixed_plan[j] or self.plan[j]

    def profile_keys(self) -> list[str]:
        """The profile row each job's plan runs at. Rubick's plans go through the artifact's
        lookup (see `_family`); the ablations' plans run at their own rows, as a plan the
        artifact never changed does, so they are not handicapped by that lookup."""
        return list(self.plan) if self.fixed else [_family(p) for p in self.plan]

    def fix_plans(self, reconfigure: bool) -> None:
        """The plan each job keeps under an ablation: with `reconfigure` the best DP plan on
        exactly its requested GPUs (LLaMA: its menu's), else the trace's own plan, looked up
        as the artifact looks up a plan it never changed (its exact profile row)."""
        trace = self.trace
        fits = [
            g in _LLAMA[m][0] if MODELS[m].three_d else g <= self.cluster.gpus_per_node
            for m, g in zip(trace.model, trace.gpus, strict=True)
        ]
        if not all(fits):
            bad = [n for n, ok in zip(trace.names, fits, strict=True) if not ok]
            raise UsageError(
                f"jobs {', '.join(bad[:3])} request GPUs their fixed placement cannot hold.",
                "use scheduler 'rubick', which re-sizes jobs.",
            )
        self.fixed_plan: list[str | None] = []
        for m, g, p in zip(trace.model, trace.gpus, trace.plan, strict=True):
            best = self.curve[m].exact[g] if g < len(self.curve[m].exact) else None
            if not reconfigure:
                self.fixed_plan.append(p)
            elif MODELS[m].three_d:
                self.fixed_plan.append(None)  # the menu's plan, set when placed
            else:
                self.fixed_plan.append((best[1] or best[0]) if best else p)


class _Jobs:
    """What the artifact's simulator tracks per job, as arrays advanced together."""

    def __init__(self, trace: Trace) -> None:
        n = len(trace)
        self.trace = trace
        self.placement: list[tuple[int, ...]] = [()] * n
        self.restarts = np.full(n, -1)  # -1: never placed (the artifact's None)
        self.delay = np.zeros(n)
        self.done = np.zeros(n, dtype=np.int64)
        self.progress = np.zeros(n)
        self.iter_s = np.full(n, np.inf)
        self.finish = np.full(n, np.nan)

    def advance(self, start: float, dt: float) -> None:
        """Run every placed, unfinished job for `dt` seconds from `start`."""
        run = np.isfinite(self.iter_s) & np.isnan(self.finish)
        delay = np.where(run, np.minimum(self.delay, dt), 0.0)
        self.delay -= delay
        total = self.progress + np.where(run, dt - delay, 0.0)
        iters = np.where(run, np.floor(total / self.iter_s), 0).astype(np.int64)
        need = self.trace.steps + 1 - self.done
        ends = run & (iters >= need)
        self.finish[ends] = (start + delay + need * self.iter_s - self.progress)[ends]
        self.done += iters
        self.progress = np.where(
            run, total - iters * np.where(run, self.iter_s, 0.0), self.progress
        )

    def apply(self, alloc: np.ndarray, plans: list[str], active: np.ndarray) -> None:
        """Restart every job whose placement changed; an emptied one keeps running (see 4.)."""
        for j in active:
            counts = tuple(sorted(int(c) for c in alloc[j] if c))
            if not counts or counts == self.placement[j]:
                continue
            self.placement[j] = counts
            self.delay[j] = RESTART_S
            self.restarts[j] += 1
            it = profile(self.trace.model[j]).iter_time(counts, plans[j])
            if not np.isfinite(it):
                raise UsageError(
                    f"no profiled or interpolable iteration time for {self.trace.names[j]} "
                    f"on placement {counts}.",
                    "use the shipped profiles' models and GPU counts.",
                )
            self.iter_s[j] = it


def simulate_rubick(
    workload: str | Path,
    *,
    scheduler: str = "rubick",
    interval_s: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    cluster: Cluster = ARTIFACT_CLUSTER,
) -> Result:
    """Replay a Rubick workload (shipped name or CSV) on the artifact's 8x8-GPU cluster."""
    if scheduler not in RUBICK_SCHEDULERS:
        raise UsageError(
            f"unknown Rubick scheduler '{scheduler}'.",
            f"use one of: {', '.join(RUBICK_SCHEDULERS)}.",
        )
    if not interval_s > 0:
        raise UsageError(f"interval {interval_s} s is not positive.", "pass --slot 60.")
    started = time.perf_counter()
    trace = load_trace(workload)
    too_big = [m for m in set(trace.model) if MODELS[m].three_d and cluster.nodes < 8]
    if too_big:
        raise UsageError(f"{', '.join(too_big)} need 8 nodes.", "simulate 8 nodes of 8 GPUs.")
    policy, jobs = _Rubick(trace, cluster, scheduler), _Jobs(trace)
    if policy.fixed:
        policy.fix_plans(reconfigure=scheduler == "rubick-e")
    now, busy = 0.0, 0.0
    horizon = trace.submit.max() + _HORIZON_S
    while np.isnan(jobs.finish).any():
        if now > horizon:
            stuck = [trace.names[j] for j in np.flatnonzero(np.isnan(jobs.finish))[:3]]
            raise UsageError(
                f"jobs {', '.join(stuck)} never finish: the policy cannot place them.",
                "check their GPU requests and guarantees against the cluster.",
            )
        jobs.advance(now, interval_s)
        busy += interval_s * policy.alloc.sum()
        now += interval_s
        active = np.flatnonzero((trace.submit <= now) & np.isnan(jobs.finish))
        policy.alloc[np.isfinite(jobs.finish)] = 0
        if active.size:
            policy.decide(now, active, jobs.restarts)
            jobs.apply(policy.alloc, policy.profile_keys(), active)
        if progress is not None:
            progress(int(np.isfinite(jobs.finish).sum()), len(trace))
    jct = jobs.finish - trace.submit
    return Result(
        scheduler=scheduler,
        jobs=len(trace),
        deadline_ratio=None,
        avg_jct_s=float(jct.mean()),
        p95_jct_s=float(np.percentile(jct, 95)),
        makespan_s=now,
        preemptions=int(np.maximum(jobs.restarts, 0).sum()),
        gpu_utilisation=float(busy / (cluster.gpus * now)),
        wall_s=time.perf_counter() - started,
        finish={i: float(f) for i, f in enumerate(jobs.finish)},
    )
