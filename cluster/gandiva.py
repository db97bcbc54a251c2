"""Gandiva (OSDI'18) as the ElasticFlow artifact runs it as a baseline: GPUs by node sets per
job size, time slicing inside a set, and sets grown and shrunk by demand.

Each job size (1, 2, 4, 8, ... GPUs) has its own node sets: enough whole nodes for one job of
that size, shared by up to `capacity` jobs at once (4 one-GPU jobs on a 4-GPU node, 2 two-GPU
jobs, one larger job). An arrival joins the least-loaded set of its size while that set's load
(+1 per job ever placed: the artifact never lowers it when a job ends) stays below capacity,
else takes free nodes for a new set, else time-slices into the least-loaded set, else waits.
Within a set the first `capacity` jobs run; on rounds at a whole minute they rotate to the
back. Every round, sets are grown or shrunk towards each size's share of the GPU demand. Jobs
run for their trace duration at their trace GPUs; a job is judged by when its execution ends.
Rounds happen at arrivals only (then every slot once none are left): a job that ends between
them frees its nodes at the next round. Every placed job pays the artifact's scaling overhead
each round (`utils.estimate_overhead`: a base of 7 s on clusters of 256 GPUs or more, every
ITP cluster, 2 s below).

The rules come from the artifact's `gandiva_sim_jobs` (scheduler.py) and `cluster.py`
(`gandiva_placement`, `gandiva_node_set_adjust`, `time_slicing_execute`); the replay equals
its per-event log on the 195-job trace and cluster01..05 (`moelambda bench cluster`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cluster.simulate import Running, overhead_s
from cluster.workload import NODE_CLASSES, Cluster, Job, ScalingCurve, check_fits
from ground.errors import UsageError

__all__ = ["Gandiva"]

_RESTART_EVERY = 60


@dataclass(eq=False)
class _Set:
    nodes: list[int]
    capacity: int
    util: int = 0
    jobs: list[Running] = field(default_factory=list)


class Gandiva:
    name = "gandiva"
    judges_plan = True  # judged by when its execution ends, not the round it leaves at
    ticks = True  # after the last arrival, a round every slot

    def __init__(self, cluster: Cluster, slot_s: float = 60.0) -> None:
        self.cluster, self.slot = cluster, slot_s
        self.free_nodes = list(range(cluster.nodes))
        self.sets: dict[int, list[_Set]] = {size: [] for size in NODE_CLASSES}
        self.pending: list[Running] = []
        self.released = False
        self.round = 0

    def curve(self, job: Job) -> ScalingCurve:
        return job.own_curve()

    def check(self, jobs: list[Job]) -> None:
        """Refuse, before the replay, a job Gandiva cannot place: larger than the cluster, or
        of a size the artifact keeps no node sets for."""
        check_fits(jobs, self.cluster)
        odd = next((j for j in jobs if j.gpus not in self.sets), None)
        if odd is not None:
            raise UsageError(
                f"job {odd.id} asks for {odd.gpus} GPUs; Gandiva places jobs of "
                f"{', '.join(map(str, NODE_CLASSES))} GPUs only (the artifact's node classes).",
                "give the job one of those sizes, or use another --scheduler.",
            )

    def _nodes_for(self, gpus: int) -> int:
        return math.ceil(gpus / self.cluster.gpus_per_node)

    def _new_set(self, gpus: int) -> _Set:
        count = self._nodes_for(gpus)
        nodes, self.free_nodes = self.free_nodes[:count], self.free_nodes[count:]
        return _Set(nodes, count * self.cluster.gpus_per_node // gpus)

    def _place(self, entry: Running) -> bool:
        """The artifact's `gandiva_placement`, including its queue rotation of the sets."""
        sets = self.sets[entry.job.gpus]
        if sets:
            first = sets.pop(0)
            sets.append(first)
            if first.util + 1 < first.capacity:
                return self._join(sets, first, entry)
        if self._nodes_for(entry.job.gpus) <= len(self.free_nodes):
            new = self._new_set(entry.job.gpus)
            sets.append(new)
            return self._join(sets, new, entry)
        if sets:  # time slicing into the set now at the front
            return self._join(sets, sets[0], entry, rotate=True)
        return False

    @staticmethod
    def _join(sets: list[_Set], chosen: _Set, entry: Running, rotate: bool = False) -> bool:
        if rotate:
            sets.append(sets.pop(0))
        chosen.util += 1
        chosen.jobs.append(entry)
        sets.sort(key=lambda s: s.util)
        return True

    def _deal(self, sets: list[_Set], jobs: list[Running]) -> None:
        """Hand jobs out one at a time to the least-loaded set."""
        for entry in jobs:
            sets[0].util += 1
            sets[0].jobs.append(entry)
            sets.sort(key=lambda s: s.util)

    def _adjust(self) -> None:
        """Grow or shrink each size's sets towards its share of the GPU demand."""
        demand = {size: sum(len(s.jobs) for s in sets) * size for size, sets in self.sets.items()}
        occupied = {
            size: sum(len(s.nodes) for s in sets) * self.cluster.gpus_per_node
            for size, sets in self.sets.items()
        }
        total = sum(demand.values())
        if not total:
            return
        for size, sets in self.sets.items():
            if not demand[size]:
                continue
            target = min(math.floor(demand[size] / total * self.cluster.gpus), demand[size])
            diff = target - occupied[size]
            if diff > 0:
                self._expand(size, sets, math.ceil(diff / size))
            elif diff < 0:
                self._shrink(sets, math.ceil(-diff / size))

    def _expand(self, size: int, sets: list[_Set], count: int) -> None:
        made_last = False
        for _ in range(count):
            made_last = self._nodes_for(size) <= len(self.free_nodes)
            if made_last:
                sets.append(self._new_set(size))
        # The artifact re-deals its jobs unless the last new set took a single node (its
        # loop variable is shadowed by the node loop's): kept, since it moves the numbers.
        if made_last and self._nodes_for(size) == 1:
            return
        jobs = [j for s in sets for j in s.jobs]
        for s in sets:
            s.jobs, s.util = [], 0
        self._deal(sets, jobs)

    def _shrink(self, sets: list[_Set], count: int) -> None:
        count = min(count, len(sets) - 1)
        jobs = []
        for _ in range(max(count, 0)):
            gone = sets.pop(0)
            jobs += gone.jobs
            self.free_nodes += gone.nodes
        self._deal(sets, jobs)

    def advance(self, jobs: list[Running], now: float, elapsed: float) -> None:
        """Adjust the sets, then run each set's first `capacity` jobs over the interval."""
        self._adjust()
        rotate = int(now % 60) == 0
        self.released = False
        for sets in self.sets.values():
            for s in list(sets):
                running = s.jobs[: s.capacity]
                for entry in running:
                    entry.executed += max(elapsed - entry.overhead, 0.0)
                    entry.overhead = 0.0
                    if entry.executed >= entry.job.duration:
                        entry.judged = now - (entry.executed - entry.job.duration)
                        entry.end = now
                if rotate and len(s.jobs) > s.capacity:
                    s.jobs = s.jobs[s.capacity :] + running
                s.jobs = [j for j in s.jobs if j.end > now]
                if not s.jobs:
                    self.free_nodes += s.nodes
                    sets.remove(s)
                    self.released = True
        for entry in jobs:  # the artifact clears the overhead only of jobs that ever waited
            if entry.state.get("waited"):
                entry.overhead = 0.0

    def arrive(self, now: float, new: list[Running], jobs: list[Running]) -> list[Running]:
        for entry in new:
            if not self._place(entry):
                entry.state["waited"] = True
                self.pending.append(entry)
        return new

    def schedule(self, now: float, jobs: list[Running]) -> float:
        if self.released:  # the artifact skips the job after each one it places
            i = 0
            while i < len(self.pending):
                if self._place(self.pending[i]):
                    self.pending.pop(i)
                i += 1
        active = {id(j) for sets in self.sets.values() for s in sets for j in s.jobs[: s.capacity]}
        for entry in jobs:
            entry.gpus = entry.job.gpus if id(entry) in active else 0
        return math.inf

    def charge(self, now: float, jobs: list[Running], round_index: int) -> None:
        restart = self.round > 0 and self.round % _RESTART_EVERY == 0
        self.round += 1
        placed = {id(j) for sets in self.sets.values() for s in sets for j in s.jobs}
        for entry in jobs:
            if id(entry) in placed:
                entry.overhead = overhead_s(entry.job.gpus, restart, self.cluster.gpus)
