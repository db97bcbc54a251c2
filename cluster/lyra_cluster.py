"""The servers Lyra schedules on: 443 training (V100) then 520 inference (T4) 8-GPU servers.

Per server the free GPUs, whether it is on loan, its group (BASE/FLEX/NONE, §A1) and the GPUs
each job holds there; per job its base and flexible workers, so reclaiming (§A2.2) can tell a
scale-in from a preemption. Placement is best-fit decreasing's inner step (§A2.4).
"""

from __future__ import annotations

import numpy as np

from cluster.lyra_trace import INFER_SERVERS, SERVER_GPUS, TRAIN_SERVERS

__all__ = ["BASE", "FLEX", "LOAN", "NONE", "TRAIN", "Cluster"]

TRAIN, LOAN = 0, 1  # pools
NONE, BASE, FLEX = 0, 1, 2  # groups of on-loan servers


class Cluster:
    """Servers (training first, then inference) and which job holds what where."""

    def __init__(self) -> None:
        n = TRAIN_SERVERS + INFER_SERVERS
        self.free = np.full(n, SERVER_GPUS)
        self.infer = np.arange(n) >= TRAIN_SERVERS
        self.on_loan = np.zeros(n, dtype=bool)
        self.group = np.zeros(n, dtype=np.int8)
        self.jobs: list[dict[int, int]] = [{} for _ in range(n)]
        self.base: dict[int, list[tuple[int, int]]] = {}  # job -> [(server, GPUs)]
        self.flex: dict[int, list[tuple[int, int]]] = {}

    def allowed(self, pool: int, flex: bool) -> np.ndarray:
        if pool == TRAIN:
            return ~self.infer
        return self.on_loan & (self.group != (BASE if flex else FLEX))

    def place(self, job: int, size: int, count: int, pool: int, flex: bool) -> bool:
        """Best-fit (least leftover) placement of `count` workers of `size` GPUs (§A2.4);
        all or nothing."""
        mask = self.allowed(pool, flex)
        done: list[tuple[int, int]] = []
        for _ in range(count):
            cand = np.where(mask & (self.free >= size), self.free, SERVER_GPUS + 1)
            s = int(np.argmin(cand))
            if cand[s] > SERVER_GPUS:
                for server, gpus in done:
                    self._take(job, server, -gpus)
                return False
            self._take(job, s, size)
            done.append((s, size))
            if pool == LOAN:
                self.group[s] = FLEX if flex else BASE
        (self.flex if flex else self.base).setdefault(job, []).extend(done)
        return True

    def _take(self, job: int, s: int, gpus: int) -> None:
        self.free[s] -= gpus
        held = self.jobs[s].get(job, 0) + gpus
        if held:
            self.jobs[s][job] = held
        else:
            del self.jobs[s][job]
            if not self.jobs[s]:
                self.group[s] = NONE

    def drop_on(self, job: int, s: int) -> int:
        """Release the job's flexible workers on server `s`; returns how many."""
        workers = self.flex[job]
        gone = [(x, g) for x, g in workers if x == s]
        for x, g in gone:
            self._take(job, x, -g)
        self.flex[job] = [(x, g) for x, g in workers if x != s]
        if not self.flex[job]:
            del self.flex[job]
        return len(gone)

    def drop(self, job: int, flex: bool) -> None:
        """Release all of the job's base or flexible workers."""
        for s, gpus in (self.flex if flex else self.base).pop(job, []):
            self._take(job, s, -gpus)
