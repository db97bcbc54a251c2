"""A fluid network simulator to time any all-to-all send order (spec §1.5).

The model is the one behind Fig. 4: a big switch whose only bottlenecks are the GPU NICs. A
sender works through its own list one flow at a time at most at its NIC rate; a receiver's NIC is
shared max-min fairly among the flows into it. Rates are constant between events (a flow ends, a
wait ends), so the simulation jumps from event to event and is exact, with no time step to tune.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu.aurora.a2a import Schedule, _bandwidth, _square, schedule

__all__ = [
    "Send",
    "Wait",
    "aurora_sequences",
    "order_times",
    "rank_order",
    "rcs_order",
    "simulate",
    "sjf_order",
]

_SEND, _WAIT, _END = 0, 1, 2
_RCS_SEEDS = 5
# Events closer than this (relative to the clock) are one event: float noise must not leave
# a flow with a few bytes to send or a sender waking a femtosecond late.
_REL_EPS = 1e-12


@dataclass(frozen=True)
class Send:
    dest: int
    tokens: float


@dataclass(frozen=True)
class Wait:
    """Idle until this absolute time: Aurora's rounds need senders to hold back, not just order."""

    until_s: float


def simulate(
    sequences: list[list[Send | Wait]], bandwidth: np.ndarray, token_bytes: float
) -> float:
    """Seconds until the last byte arrives when every sender works through its own sequence.

    Each sender's single flow is capped by its own NIC, so the max-min fair allocation splits into
    one independent water-filling per receiver (progressive filling with the sender caps). An
    empty list (what `aurora_sequences` makes of a schedule with no rounds) takes no time.
    """
    if not sequences:
        return 0.0
    rate_cap = _bandwidth(bandwidth, len(sequences))
    if token_bytes <= 0:
        raise ValueError(f"token_bytes must be positive, got {token_bytes}")
    kind, dest, amount, start = _flatten(sequences, token_bytes)
    senders = np.arange(len(sequences))
    ptr = start.copy()
    left = amount[ptr].copy()
    clock = last = 0.0
    while True:
        ptr, left = _advance(ptr, left, kind, amount, clock)
        sending, waiting = kind[ptr] == _SEND, kind[ptr] == _WAIT
        if not (sending.any() or waiting.any()):
            return float(last)
        rate = np.zeros(len(ptr))
        if sending.any():
            rate[sending] = _share(dest[ptr[sending]], rate_cap[senders[sending]], rate_cap)
        ends = np.full(len(ptr), np.inf)
        ends[sending] = left[sending] / rate[sending]
        ends[waiting] = amount[ptr[waiting]] - clock
        step = float(ends.min())
        clock += step
        left = np.where(sending, left - rate * step, left)
        finished = sending & (ends <= step + _REL_EPS * clock)
        left[finished] = 0.0
        if finished.any():
            last = clock


def rank_order(tokens: np.ndarray) -> list[list[Send]]:
    """The vanilla all-to-all: every sender walks destinations 0..n-1, so all collide early."""
    d = _traffic(tokens)
    return [_sends(d[i], np.arange(len(d))) for i in range(len(d))]


def sjf_order(tokens: np.ndarray) -> list[list[Send]]:
    """Shortest job first per sender (the paper's SJF baseline); ties keep rank order."""
    d = _traffic(tokens)
    return [_sends(d[i], np.argsort(d[i], kind="stable")) for i in range(len(d))]


def rcs_order(tokens: np.ndarray, rng: np.random.Generator) -> list[list[Send]]:
    """Random communication scheduling (the paper's RCS baseline): a random order per sender."""
    d = _traffic(tokens)
    return [_sends(d[i], rng.permutation(len(d))) for i in range(len(d))]


def aurora_sequences(schedule: Schedule) -> list[list[Send | Wait]]:
    """Per sender, round by round: its real chunk, then idle until the round ends.

    The waits are what keep the rounds contention-free: a sender done early must not start its
    next chunk while another sender still feeds that receiver.
    """
    if not schedule.rounds:
        return []
    ends = np.cumsum([r.seconds for r in schedule.rounds])
    n = len(schedule.rounds[0].dest)
    sequences: list[list[Send | Wait]] = [[] for _ in range(n)]
    for r, end in zip(schedule.rounds, ends, strict=True):
        for i in np.flatnonzero(r.dest >= 0):
            sequences[i].append(Send(int(r.dest[i]), float(r.tokens[i])))
        for seq in sequences:
            seq.append(Wait(float(end)))
    return sequences


def order_times(
    tokens: np.ndarray, bandwidth: np.ndarray, token_bytes: float, seed: int = 0
) -> dict[str, float]:
    """Seconds of one all-to-all under each order: rank, SJF, RCS (mean of a few seeds), Aurora.

    Aurora uses the "min_pair" rounds; with homogeneous NICs its time is the lower bound.
    """
    rng = np.random.default_rng(seed)
    rcs = [simulate(rcs_order(tokens, rng), bandwidth, token_bytes) for _ in range(_RCS_SEEDS)]
    plan = schedule(tokens, bandwidth, token_bytes)
    return {
        "rank": simulate(rank_order(tokens), bandwidth, token_bytes),
        "sjf": simulate(sjf_order(tokens), bandwidth, token_bytes),
        "rcs": float(np.mean(rcs)),
        "aurora": simulate(aurora_sequences(plan), bandwidth, token_bytes),
    }


def _share(dest: np.ndarray, cap: np.ndarray, bandwidth: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows (one per sender, capped by `cap`) into shared receivers.

    Within a receiver, sort the caps ascending; the candidate level at position m is what is left
    of the NIC after the m smaller flows, split over the rest. The candidates rise while flows are
    cap-bound and fall after, so the fair level is their maximum and every flow gets
    min(cap, level), all in a few segmented numpy operations.
    """
    order = np.lexsort((cap, dest))
    d, c = dest[order], cap[order]
    first = np.ones(len(d), dtype=bool)
    first[1:] = d[1:] != d[:-1]
    start = np.flatnonzero(first)
    count = np.diff(start, append=len(d))
    group = np.repeat(np.arange(len(start)), count)
    before = np.cumsum(c) - c
    before -= before[start][group]
    position = np.arange(len(d)) - start[group]
    level = (bandwidth[d] - before) / (count[group] - position)
    rate = np.empty_like(c)
    rate[order] = np.minimum(c, np.maximum.reduceat(level, start)[group])
    return rate


def _advance(
    ptr: np.ndarray, left: np.ndarray, kind: np.ndarray, amount: np.ndarray, clock: float
) -> tuple[np.ndarray, np.ndarray]:
    """Move every sender past items that are done: sent flows, empty flows, waits already over."""
    while True:
        k = kind[ptr]
        done = ((k == _SEND) & (left <= 0.0)) | (
            (k == _WAIT) & (amount[ptr] <= clock * (1 + _REL_EPS))
        )
        if not done.any():
            return ptr, left
        ptr = np.where(done, ptr + 1, ptr)
        left = np.where(done, amount[ptr], left)


def _flatten(
    sequences: list[list[Send | Wait]], token_bytes: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Items of all senders in one array each (kind, dest, bytes or wake time), plus an end
    marker per sender, so an event updates every sender with array indexing."""
    n = len(sequences)
    kind, dest, amount, start = [], [], [], []
    for i, seq in enumerate(sequences):
        start.append(len(kind))
        for item in seq:
            if isinstance(item, Send):
                _check_send(item, i, n)
                kind.append(_SEND)
                dest.append(item.dest)
                amount.append(item.tokens * token_bytes)
            elif isinstance(item, Wait):
                kind.append(_WAIT)
                dest.append(-1)
                amount.append(item.until_s)
            else:
                raise ValueError(f"sender {i}: expected Send or Wait, got {item!r}")
        kind.append(_END)
        dest.append(-1)
        amount.append(0.0)
    return np.array(kind), np.array(dest), np.array(amount, dtype=float), np.array(start, int)


def _check_send(item: Send, sender: int, n: int) -> None:
    if not 0 <= item.dest < n or item.dest == sender:
        raise ValueError(f"sender {sender}: destination {item.dest} is not another of {n} GPUs")
    if not item.tokens >= 0:
        raise ValueError(f"sender {sender}: tokens must be non-negative, got {item.tokens}")


def _sends(row: np.ndarray, order: np.ndarray) -> list[Send]:
    return [Send(int(j), float(row[j])) for j in order if row[j] > 0]


def _traffic(tokens: np.ndarray) -> np.ndarray:
    d = _square(tokens, "tokens")
    np.fill_diagonal(d, 0.0)
    return d
