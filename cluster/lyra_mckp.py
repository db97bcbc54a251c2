"""Lyra's two allocation kernels: the flexible-demand MCKP (§A2.3) and server reclaiming (§A2.2).

Both are pure functions over small Python/numpy structures so the spec's worked examples
(Tables 3.1, 3.3, 3.4, Fig. 3.6) can check them directly, apart from the simulator.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "Item",
    "collateral_gpus",
    "flex_items",
    "greedy_marginal",
    "reclaim_lyra",
    "reclaim_random",
    "reclaim_scf",
    "server_fraction_costs",
    "solve_mckp",
]

Item = tuple[int, float]  # (weight in GPUs, value in seconds of JCT saved)
Servers = Mapping[int, Mapping[int, int]]  # server -> {job -> GPUs it holds there}


def flex_items(
    remaining_work: float, w_min: int, w_max: int, gpus_per_worker: int, speed: float = 1.0
) -> list[Item]:
    """One elastic job's MCKP group: +x workers weigh x * gpus_per_worker and are worth the
    JCT they save against running at w_min, `rem/w_min - rem/(w_min + x)` (§A2.3 [R]);
    `speed` is a worker's throughput relative to a V100 worker (T4 workers are slower)."""
    base = remaining_work / (speed * w_min)
    return [
        (x * gpus_per_worker, base - remaining_work / (speed * (w_min + x)))
        for x in range(1, w_max - w_min + 1)
    ]


def solve_mckp(groups: Sequence[Sequence[Item]], capacity: int) -> list[int]:
    """The item index each group takes (-1: none) maximising the total value within capacity.

    The pseudo-polynomial DP of §A2.3, vectorised over capacity: `dp[c]` is the best value
    with weight at most c, and `choice[g, c]` the item group g took to reach it (back-pointer).
    When every group's heaviest item fits at once, each group simply takes its most valuable
    item and the DP is skipped, which is the common case on an idle cluster.
    """
    capacity = max(int(capacity), 0)
    if sum(max((w for w, _ in g), default=0) for g in groups) <= capacity:
        return [max(range(len(g)), key=lambda k, g=g: g[k][1]) if g else -1 for g in groups]
    dp = np.zeros(capacity + 1)
    choice = np.full((len(groups), capacity + 1), -1, dtype=np.int32)
    for gi, group in enumerate(groups):
        new = dp.copy()
        for k, (w, v) in enumerate(group):
            if w > capacity:
                continue
            cand = dp[: capacity + 1 - w] + v
            better = cand > new[w:]
            new[w:][better] = cand[better]
            choice[gi, w:][better] = k
        dp = new
    picks = [-1] * len(groups)
    c = capacity
    for gi in range(len(groups) - 1, -1, -1):
        k = int(choice[gi, c])
        picks[gi] = k
        if k >= 0:
            c -= groups[gi][k][0]
    return picks


def greedy_marginal(groups: Sequence[Sequence[Item]], capacity: int) -> list[int]:
    """AFS-style allocation (§A3 baselines): one worker at a time to the job whose next worker
    saves the most JCT per GPU, until nothing more fits. Not optimal, which is Lyra's point."""
    picks = [-1] * len(groups)
    heap = [(-g[0][1] / g[0][0], gi) for gi, g in enumerate(groups) if g]
    heapq.heapify(heap)
    used = 0
    while heap:
        _, gi = heapq.heappop(heap)
        group, k = groups[gi], picks[gi]
        step = group[k + 1][0] - (group[k][0] if k >= 0 else 0)
        if used + step > capacity:
            continue
        used += step
        picks[gi] = k + 1
        if k + 2 < len(group):
            nxt = group[k + 2]
            gain = (nxt[1] - group[k + 1][1]) / (nxt[0] - group[k + 1][0])
            heapq.heappush(heap, (-gain, gi))
    return picks


def _spans(servers: Servers) -> dict[int, set[int]]:
    spans: dict[int, set[int]] = {}
    for s, jobs in servers.items():
        for j in jobs:
            spans.setdefault(j, set()).add(s)
    return spans


def server_fraction_costs(servers: Servers) -> dict[int, float]:
    """cost(s) = sum over jobs on s of 1/|servers(j)| (Table 3.1's last column)."""
    spans = _spans(servers)
    return {s: sum(1.0 / len(spans[j]) for j in jobs) for s, jobs in servers.items()}


def collateral_gpus(servers: Servers, s: int) -> int:
    """GPUs that preempting every job on `s` frees on other servers that do not become empty."""
    gone = set(servers[s])
    damage = 0
    for other, jobs in servers.items():
        if other == s or not gone & jobs.keys():
            continue
        if jobs.keys() - gone:
            damage += sum(g for j, g in jobs.items() if j in gone)
    return damage


def _vacate(servers: dict[int, dict[int, int]], s: int) -> set[int]:
    """Preempt every job on `s`, removing it from all servers; returns those jobs."""
    gone = set(servers.pop(s))
    for jobs in servers.values():
        for j in gone & jobs.keys():
            del jobs[j]
    return gone


def reclaim_lyra(
    n: int, servers: Servers, flex: frozenset[int] | set[int] = frozenset()
) -> tuple[list[int], set[int]]:
    """Choose `n` on-loan servers to return and the jobs that must be preempted (§A2.2).

    Order: idle servers (free), then FLEX servers (their jobs only scale in), then for one
    server the one with the fewest jobs, else repeatedly the lowest server-fraction cost with
    the smallest collateral damage as tie-break; a server that preemption empties costs 0 and
    goes next.
    """
    left = {s: dict(jobs) for s, jobs in servers.items()}
    chosen = sorted((s for s in left if not left[s]), key=int)[:n]
    flexible = sorted(
        (s for s in left if s in flex and left[s]), key=lambda s: sum(left[s].values())
    )
    chosen += flexible[: n - len(chosen)]
    for s in chosen:
        left.pop(s)
    preempted: set[int] = set()
    if len(chosen) < n and n - len(chosen) == 1 and left:
        costs = server_fraction_costs(left)
        s = min(left, key=lambda s: (len(left[s]), costs[s], collateral_gpus(left, s), s))
        preempted |= _vacate(left, s)
        chosen.append(s)
    while len(chosen) < n and left:
        costs = server_fraction_costs(left)
        low = min(costs.values())
        ties = [s for s, c in costs.items() if c <= low + 1e-12]
        s = min(ties, key=lambda s: (collateral_gpus(left, s), s))
        preempted |= _vacate(left, s)
        chosen.append(s)
    return chosen, preempted


def reclaim_scf(n: int, servers: Servers) -> tuple[list[int], set[int]]:
    """SCF baseline: the n servers with the smallest job counts (§A3)."""
    chosen = sorted(servers, key=lambda s: (len(servers[s]), s))[:n]
    return chosen, set().union(*(servers[s].keys() for s in chosen)) if chosen else set()


def reclaim_random(
    n: int, servers: Servers, rng: np.random.Generator
) -> tuple[list[int], set[int]]:
    """Random baseline: any n on-loan servers, busy or idle (§A3)."""
    pool = sorted(servers)
    chosen = [pool[i] for i in rng.choice(len(pool), size=min(n, len(pool)), replace=False)]
    return chosen, set().union(*(servers[s].keys() for s in chosen)) if chosen else set()
