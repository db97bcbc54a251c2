"""Where ElasticFlow's artifact puts each job's GPUs, which decides its scaling overhead.

A job pays the short overhead only when its GPU set (first GPU, count) was used since the last
restart of every trainer: the artifact's trainer cache (`LOG.scheduling_result` records the
ranks of each placed job; `utils.estimate_overhead` reads the flag). So the overhead depends on
the artifact's placement, reproduced here (`cluster.elastic_placement`):

- Every round starts from an empty cluster: the artifact releases every job before planning
  (`estimate_all_jobs`), so free nodes are in id order.
- Jobs are placed in the round's job order (by GPUs, descending, after the idle-GPU hand-out's
  ordering): first every job of at least a node, then the smaller ones by size class, largest
  class first.
- Node sets are filed by class (1, 2, 4, 8, 12, 16, ... GPUs). A job tries the first set of its
  own class, then the first set of each larger class (largest first), then takes new nodes
  from the front of the free list. A set with GPUs left over is refiled under the largest
  class dividing what is left; a full one under the joining job's class; lists are kept in
  order of load, and a set tried and not fitting goes to the back of its list.
- A job's ranks are read node by node: a set filed under a class of at least a node gives its
  first job the ranks from its first node; a smaller set gives its jobs consecutive ranks in
  the order they joined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cluster.workload import NODE_CLASSES as CLASSES

__all__ = ["Nodes"]


@dataclass(eq=False)
class _Set:
    nodes: list[int]
    capacity: int
    util: int
    jobs: list[int] = field(default_factory=list)


class Nodes:
    """The artifact's free-node list across rounds and one round's placement.

    Nodes are numbered switch by switch; the artifact's node id is the index within the
    switch, and its free list is sorted by that id (stably) whenever nodes come back, so on a
    cluster of several switches the order of equal ids follows the order nodes were released.
    """

    def __init__(self, switches: int, nodes_per_switch: int, per_node: int) -> None:
        self.per_switch, self.per_node = nodes_per_switch, per_node
        self.free = list(range(switches * nodes_per_switch))
        self.sets: dict[int, _Set] = {}  # each placed job's node set

    def place(self, sizes: dict[int, int]) -> dict[int, list[int]]:
        """Place jobs (key: a job, in the round's order; value: its GPUs, 0 not placed) on
        the free nodes and return each one's first GPU as read (see `_Round.ranks`)."""
        placer = _Round(self, sizes)
        for job, size in sizes.items():
            if size >= self.per_node:
                placer.place(job)
        for cls in reversed(CLASSES):
            if cls < self.per_node:
                for job, size in sizes.items():
                    if size == cls:
                        placer.place(job)
        self.free = placer.free
        return placer.ranks()

    def release(self, order: list[int]) -> None:
        """Release placed jobs in this order: a set's nodes return when its last job does,
        and the free list is re-sorted by node id, stably (`release_job_res`)."""
        back: list[int] = []
        for job in order:
            node_set = self.sets.pop(job, None)
            if node_set is None:
                continue
            node_set.jobs.remove(job)
            if not node_set.jobs:
                back += node_set.nodes
        self.free = sorted(self.free + back, key=lambda n: n % self.per_switch)


class _Round:
    """One round's placement (`cluster.elastic_placement`), from the free list in order."""

    def __init__(self, nodes: Nodes, sizes: dict[int, int]) -> None:
        self.nodes, self.sizes, self.per_node = nodes, sizes, nodes.per_node
        self.free = list(nodes.free)
        self.lists: dict[int, list[_Set]] = {c: [] for c in CLASSES}

    def _file(self, node_set: _Set, own: list[_Set]) -> None:
        """File a set by the GPUs it has left (under the joining job's class when full)."""
        left = len(node_set.nodes) * self.per_node - node_set.util
        target = own
        if left > 0:
            target = self.lists[next(c for c in reversed(CLASSES) if c <= left and left % c == 0)]
        target.append(node_set)
        own.sort(key=lambda s: s.util)
        target.sort(key=lambda s: s.util)

    def _join(self, source: list[_Set], own: list[_Set], job: int) -> bool:
        node_set = source.pop(0)
        size = self.sizes[job]
        if node_set.util + size > node_set.capacity:
            source.append(node_set)
            return False
        node_set.util += size
        node_set.jobs.append(job)
        self.nodes.sets[job] = node_set
        self._file(node_set, own)
        return True

    def place(self, job: int) -> None:
        size = self.sizes[job]
        if size not in self.lists:
            raise ValueError(f"ElasticFlow's placement has no class for {size} GPUs")
        own = self.lists[size]
        if own and self._join(own, own, job):
            return
        for larger in reversed(CLASSES):
            if larger <= size:
                break
            if self.lists[larger] and self._join(self.lists[larger], own, job):
                return
        count = math.ceil(size / self.per_node)
        if count > len(self.free):
            raise AssertionError(f"no nodes left for a {size}-GPU job")
        node_set = _Set(self.free[:count], count * self.per_node, size, [job])
        self.free = self.free[count:]
        self.nodes.sets[job] = node_set
        self._file(node_set, own)

    def ranks(self) -> dict[int, list[int]]:
        """Each placed job's first GPU, once per node it is read on: a set filed under a
        class of at least a node gives its first job the ranks from its first node; a smaller
        set gives its jobs consecutive ranks in joining order, on every node it spans."""
        owner: dict[int, tuple[int, _Set]] = {}
        for cls in CLASSES:
            for node_set in self.lists[cls]:
                for node in node_set.nodes:
                    owner.setdefault(node, (cls, node_set))
        starts: dict[int, list[int]] = {}
        seen: set[int] = set()
        for node in sorted(owner):
            cls, node_set = owner[node]
            base = node * self.per_node
            if cls >= self.per_node:
                first = node_set.jobs[0]
                if first not in seen:
                    starts.setdefault(first, []).append(base)
                    seen.add(first)
                continue
            for job in node_set.jobs:
                starts.setdefault(job, []).append(base)
                base += self.sizes[job]
            seen.add(node_set.jobs[0])
        return starts
