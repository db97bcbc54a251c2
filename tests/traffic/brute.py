"""Pure-Python twins of the simulator's compiled kernels, written event by event and
environment by environment, for the tests to hold `planner.traffic._kernels` to."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np


def brute_batches(
    times: list[float], tokens: list[int], max_tokens: int, window_s: float, records: int
) -> list[tuple[list[int], float, int]]:
    """(members, dispatch, tokens) per execution, by walking the stream one arrival at a time
    with an open delivery (the event source mapping) that its window or its message count
    closes, and splitting each closed delivery as the batcher does, one request at a time."""
    out: list[tuple[list[int], float, int]] = []

    def close(delivered: list[int], at: float) -> None:
        members: list[int] = []
        total = 0
        for r in delivered:
            if members and total + tokens[r] > max_tokens:
                out.append((members, at, total))
                members, total = [], 0
            members.append(r)
            total += tokens[r]
        if members:
            out.append((members, at, total))

    open_: list[int] = []
    opened = 0.0
    for r, t in enumerate(times):
        if open_ and t > opened + window_s:  # the window ended before this arrival
            close(open_, opened + window_s)
            open_ = []
        if not open_:
            opened = t
        open_.append(r)
        if len(open_) == records:  # the batch size reached: delivered at once
            close(open_, t)
            open_ = []
    if open_:
        close(open_, opened + window_s)
    return out


@dataclass
class _Env:
    free_at: float  # when its current invocation ends (or ended)
    provisioned: bool
    dead: bool = False


def brute_pools(
    dispatch: np.ndarray,
    offset: np.ndarray,  # (B, F)
    duration: np.ndarray,  # (B, F)
    replicas: np.ndarray,  # (B, F)
    stage: np.ndarray,  # (F,)
    init_s: np.ndarray,
    provisioned: np.ndarray,
    idle_s: float,
    ping_interval_s: np.ndarray,
    ping_count: np.ndarray,
    ping_s: float,
    period_s: float,
    reserved: np.ndarray | None = None,
    retry_waits: tuple[float, ...] = (),
) -> dict[str, np.ndarray]:
    """Every environment as an object and every event in one heap: the delay and failure per
    batch, cold starts per (batch, function), cold pings, pings and provisioned seconds."""
    batches, functions = offset.shape
    reserved = np.zeros(functions, dtype=int) if reserved is None else reserved
    delay = np.zeros(batches)
    failed = np.zeros(batches, dtype=bool)
    cold = np.zeros((batches, functions), dtype=int)
    cold_pings = np.zeros(functions, dtype=int)
    pings = np.zeros(functions, dtype=int)
    pc_seconds = np.zeros(functions)
    for s in range(int(stage.max()) + 1):
        members = [f for f in range(functions) if stage[f] == s]
        late = np.zeros((batches, functions))
        for f in members:
            envs = [_Env(-math.inf, True) for _ in range(int(provisioned[f]))]
            start = {b: dispatch[b] + delay[b] + offset[b, f] for b in range(batches)}
            # (time, 0 ping / 1 retry / 2 new, batch, attempt, replicas)
            events = [
                (start[b], 2, b, 0, int(replicas[b, f]))
                for b in range(batches)
                if replicas[b, f] > 0 and not failed[b]
            ]
            if ping_interval_s[f] > 0:
                events += [
                    (k * ping_interval_s[f], 0, -1, 0, int(ping_count[f]))
                    for k in range(int(math.ceil(period_s / ping_interval_s[f])) + 1)
                    if k * ping_interval_s[f] < period_s
                ]
            heapq.heapify(events)
            while events:
                t, kind, b, attempt, need = heapq.heappop(events)
                d = ping_s if kind == 0 else duration[b, f]
                for env in envs:
                    if not env.provisioned and env.free_at <= t and t - env.free_at > idle_s:
                        env.dead = True
                envs = [e for e in envs if not e.dead]
                in_flight = sum(1 for e in envs if e.free_at > t)
                admit = need if reserved[f] <= 0 else min(need, max(reserved[f] - in_flight, 0))
                idle_pc = [e for e in envs if e.provisioned and e.free_at <= t]
                idle_od = sorted(
                    (e for e in envs if not e.provisioned and e.free_at <= t),
                    key=lambda e: -e.free_at,
                )
                served = 0
                for env in idle_pc[:admit]:
                    env.free_at = t + d
                    served += 1
                    if kind != 0:
                        pc_seconds[f] += d
                for env in idle_od[: admit - served]:
                    env.free_at = t + d
                    served += 1
                new = admit - served
                envs += [_Env(t + init_s[f] + d, False) for _ in range(new)]
                if kind == 0:
                    cold_pings[f] += new
                    pings[f] += admit
                    continue
                if admit:
                    cold[b, f] += new
                    late[b, f] = max(late[b, f], t - start[b] + (init_s[f] if new else 0.0))
                if need > admit:
                    if attempt < len(retry_waits):
                        heapq.heappush(
                            events, (t + retry_waits[attempt], 1, b, attempt + 1, need - admit)
                        )
                    else:
                        failed[b] = True
        for b in range(batches):
            ends = [
                (offset[b, f] + duration[b, f], late[b, f]) for f in members if replicas[b, f] > 0
            ]
            if ends and not failed[b]:
                delay[b] += max(e + x for e, x in ends) - max(e for e, _ in ends)
    return {
        "delay": delay,
        "failed": failed,
        "cold": cold,
        "cold_pings": cold_pings,
        "pings": pings,
        "pc_seconds": pc_seconds,
    }
