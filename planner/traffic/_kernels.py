"""The compiled loops of the traffic simulator (numba): the batcher and the environment pools.

The rules are documented in `planner.traffic.simulate` and `ground.coldstart`; every compiled
function lives in this one file because numba's on-disk cache (`cache=True`) invalidates a
function when its own file changes, not when a function it calls in another file does. Each
kernel has a pure-Python twin in the tests (`tests/traffic/brute.py`) that they are held to.
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

__all__ = ["batch_requests", "run_pools"]

_HIST = 256  # environments-in-use histogram bins per function (the last one collects more)


@njit(cache=True)
def batch_requests(times, tokens, max_tokens, window_s, records):  # type: ignore[no-untyped-def]
    """(first request, delivery time, tokens, delivery index) of each execution the front
    door starts for a sorted request stream: `ground.frontdoor.batches`, compiled.

    A delivery opens at the first request not yet delivered and takes the requests arriving
    within `window_s` of its opening, up to `records`; it is delivered `window_s` after it
    opened or at its `records`-th arrival. Its requests are split in order into executions of
    at most `max_tokens` tokens (a larger request alone).
    """
    n = times.size
    first = np.empty(n + 1, np.int64)
    dispatch = np.empty(n, np.float64)
    size = np.empty(n, np.int64)
    delivery = np.empty(n, np.int64)
    count = 0
    d = 0
    i = 0
    while i < n:
        deadline = times[i] + window_s
        j = i + 1
        while j < n and j - i < records and times[j] <= deadline:
            j += 1
        at = times[j - 1] if j - i == records else deadline
        k = i
        while k < j:
            total = tokens[k]
            m = k + 1
            while m < j and total + tokens[m] <= max_tokens:
                total += tokens[m]
                m += 1
            first[count] = k
            dispatch[count] = at
            size[count] = total
            delivery[count] = d
            count += 1
            k = m
        d += 1
        i = j
    first[count] = n
    return first[: count + 1], dispatch[:count], size[:count], delivery[:count]


@njit(cache=True)
def _pool(  # type: ignore[no-untyped-def]
    starts,
    order,
    durations,
    replicas,
    init_s,
    provisioned,
    reserved,
    retry_waits,
    idle_s,
    ping_interval_s,
    ping_count,
    ping_s,
    period_s,
    late,
    cold,
    failed,
    hist,
):
    """One function's execution environments over its invocations (see `run_pools`).

    Fills, per batch b: `late[b]`, how much later than its warm start its last replica ends
    (throttled retries' waits plus INIT if it started cold); `cold[b]`, environments it
    started; `failed[b]`, whether a replica was still throttled after the last retry. `hist`
    counts environments in use after each placement. Returns (cold starts of pings, pings,
    seconds served by provisioned environments, most environments in use at once).
    """
    pings_max = int(period_s / ping_interval_s) + 2 if ping_interval_s > 0 else 0
    size = 3 * (order.size * (retry_waits.size + 1) + 2 + pings_max)
    free_at = np.empty(size, np.float64)  # idle environments, oldest first (a stack on top)
    free_n = np.empty(size, np.int64)
    bottom = 0
    top = 0
    busy = [(0.0, 0, 0)]  # (end, environments, provisioned?) as a heap
    busy.pop()
    retries = [(0.0, 0, 0, 0)]  # (time, batch, attempt, replicas) throttled, to retry
    retries.pop()
    in_use = 0
    peak = 0
    pc_free = provisioned
    ping_cold = 0
    pings = 0
    pc_seconds = 0.0
    next_ping = 0.0 if ping_interval_s > 0 else np.inf
    k = 0
    while k < order.size or next_ping < period_s or len(retries) > 0:
        t_new = starts[order[k]] if k < order.size else np.inf
        t_retry = retries[0][0] if len(retries) > 0 else np.inf
        t_ping = next_ping if next_ping < period_s else np.inf
        attempt = 0
        if t_ping <= t_new and t_ping <= t_retry:  # pings first, then retries, then new
            kind = 0
            t = t_ping
            b = -1
            need = ping_count
            d = ping_s
            next_ping += ping_interval_s
        elif t_retry <= t_new:
            kind = 1
            t, b, attempt, need = heapq.heappop(retries)
            d = durations[b]
        else:
            kind = 1
            b = order[k]
            t = t_new
            need = replicas[b]
            d = durations[b]
            k += 1
            if need == 0:
                continue
        while len(busy) > 0 and busy[0][0] <= t:  # environments that finished become idle
            end, n, pc = heapq.heappop(busy)
            in_use -= n
            if pc == 1:
                pc_free += n
            else:
                free_at[top] = end
                free_n[top] = n
                top += 1
        while bottom < top and free_at[bottom] < t - idle_s:  # idle too long: reclaimed
            bottom += 1
        admit = need if reserved <= 0 else min(need, max(reserved - in_use, 0))
        throttled = need - admit
        from_pc = min(admit, pc_free)
        pc_free -= from_pc
        rest = admit - from_pc
        warm = 0
        while rest > 0 and top > bottom:  # most recently used first
            take = min(rest, free_n[top - 1])
            free_n[top - 1] -= take
            if free_n[top - 1] == 0:
                top -= 1
            rest -= take
            warm += take
        if from_pc > 0:
            heapq.heappush(busy, (t + d, from_pc, 1))
        if warm > 0:
            heapq.heappush(busy, (t + d, warm, 0))
        if rest > 0:
            heapq.heappush(busy, (t + init_s + d, rest, 0))
        in_use += admit
        peak = max(peak, in_use)
        if kind == 0:
            ping_cold += rest
            pings += admit  # a throttled ping is an error, neither run nor billed
            continue
        if admit > 0:
            late[b] = max(late[b], t - starts[b] + (init_s if rest > 0 else 0.0))
            cold[b] += rest
            pc_seconds += from_pc * d
            hist[min(in_use, hist.size - 1)] += 1
        if throttled > 0:
            if attempt < retry_waits.size:
                heapq.heappush(retries, (t + retry_waits[attempt], b, attempt + 1, throttled))
            else:
                failed[b] = True
    return ping_cold, pings, pc_seconds, peak


@njit(cache=True)
def run_pools(  # type: ignore[no-untyped-def]
    dispatch,
    grid_i,
    grid_w,
    batch_tokens,
    stage,
    offset,
    duration,
    replicas,
    init_s,
    provisioned,
    reserved,
    retry_waits,
    idle_s,
    ping_interval_s,
    ping_count,
    ping_s,
    period_s,
):
    """Every function's environments over a sequence of batches, stage after stage.

    Batch b's invocation of function f starts at dispatch[b] + its warm offset (the grid's,
    interpolated at the batch's size) + the cold-start delays of the stages before f's. Within a
    stage the delay is how much later its last function finishes because some of them started
    cold or throttled: max over f of (offset + duration + its lateness) minus max of (offset +
    duration). A function with reserved concurrency (`reserved[f]` > 0) runs at most that many
    invocations at once; the others are throttled and retried after `retry_waits` (the state
    machine's retry policy); still throttled after the last, the batch fails and its later
    stages do not run.

    Returns: the delay per batch (B,), whether each failed (B,), the summed delay per stage
    (stages,), cold starts per function of batches and of pings, pings, seconds served by
    provisioned environments, peak environments in use, and the environments-in-use
    histogram (F, 256).
    """
    batches = dispatch.size
    functions = stage.size
    stages = stage.max() + 1
    delay = np.zeros(batches)
    stage_delay = np.zeros(stages)
    cold_batches = np.zeros(functions, np.int64)
    cold_pings = np.zeros(functions, np.int64)
    pings = np.zeros(functions, np.int64)
    pc_seconds = np.zeros(functions)
    peak = np.zeros(functions, np.int64)
    hist = np.zeros((functions, _HIST), np.int64)
    cold = np.zeros(batches, np.int64)
    late = np.zeros(batches)
    failed = np.zeros(batches, np.bool_)
    starts = np.empty(batches)
    off = np.empty(batches)
    dur = np.empty(batches)
    reps = np.empty(batches, np.int64)
    ends_warm = np.empty(batches)
    ends_cold = np.empty(batches)
    for s in range(stages):
        ends_warm[:] = -np.inf
        ends_cold[:] = -np.inf
        for f in range(functions):
            if stage[f] != s:
                continue
            for b in range(batches):
                i, w = grid_i[b], grid_w[b]
                off[b] = (1.0 - w) * offset[i, f] + w * offset[i + 1, f]
                dur[b] = (1.0 - w) * duration[i, f] + w * duration[i + 1, f]
                reps[b] = 0 if failed[b] else replicas[batch_tokens[b], f]
                starts[b] = dispatch[b] + delay[b] + off[b]
            order = np.argsort(starts, kind="mergesort")
            cold[:] = 0
            late[:] = 0.0
            pc_, pn, pcs, pk = _pool(
                starts,
                order,
                dur,
                reps,
                init_s[f],
                provisioned[f],
                reserved[f],
                retry_waits,
                idle_s,
                ping_interval_s[f],
                ping_count[f],
                ping_s,
                period_s,
                late,
                cold,
                failed,
                hist[f],
            )
            cold_pings[f] = pc_
            pings[f] = pn
            pc_seconds[f] = pcs
            peak[f] = pk
            for b in range(batches):
                if reps[b] == 0:
                    continue
                end = off[b] + dur[b]
                ends_warm[b] = max(ends_warm[b], end)
                cold_batches[f] += cold[b]
                ends_cold[b] = max(ends_cold[b], end + late[b])
        for b in range(batches):
            if not failed[b] and ends_cold[b] > ends_warm[b]:
                extra = ends_cold[b] - ends_warm[b]
                delay[b] += extra
                stage_delay[s] += extra
    return delay, failed, stage_delay, cold_batches, cold_pings, pings, pc_seconds, peak, hist
