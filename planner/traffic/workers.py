"""Generation workers over a queue, simulated: continuous batching, idle exits, cold starts.

A stream plan (`ground.plan.StreamPlan`, semantics in `ground.stream`) serves a decoder's
requests with workers: each one invocation of the worker function that takes messages into free
slots between decode steps. This module replays a request stream (explicit arrival times,
prompt and generated tokens, so `bench stream` can replay the very arrivals it sent a real
server) through `workers` such workers of `slots` slots each:

    scale-out: a message goes, at its arrival, to a worker waiting idle in its long poll (the
      most recently idle one); else the event source mapping starts a worker with it when fewer
      than `workers` run; else it waits for a busy worker's next poll. A new worker takes a
      warm environment if one has been free for at most `reclaim_s` (a warm start,
      `warm_start_s`), else starts cold (`cold_start_s`: INIT, the weights' load).
    admission: at each iteration boundary a worker with a free slot, whose last ReceiveMessage
      is `poll_s` old, takes up to `receive_max` waiting messages (oldest first) while
      `ground.stream.admissible` holds: the longest admissible request (`max_prompt_tokens`
      of prefill, `max_new_tokens` steps at the full batch's step) must end `margin_s` before
      its deadline, `timeout_s` after its start.
    iteration: one prefill chunk (`prefill_chunk_tokens` tokens at `prefill_token_s` each) of
      the oldest admitted request whose prompt is not done, whose first token comes at the end
      of its last chunk (it then joins the batch); then one decode step of every sequence that
      has its first token, `step_s[b - 1]` for b of them; a sequence retires with its last token
      and frees its slot at once.
    exit: a worker with nothing to do waits `idle_exit_s` (or until it may no longer admit),
      then returns; a request in flight is never cut.

Requests longer than the plan admits (prompt over `max_prompt_tokens`, generation over
`max_new_tokens`) are refused (the endpoint answers 400), counted and not served. Per request:
TTFT (arrival to first token), TPOT (mean gap between its tokens after the first; NaN for one
token), end to end; per run: tokens per second, worker-seconds busy (prefill, decode) and idle,
invocations, cold starts, the decode batch of every step, and, given prices, the bill
(`WorkerPrices`: what `ground.stream` says is billed).

The loop is one compiled function (numba), self-contained in this file so numba's on-disk cache
sees its changes; an hour at one request a second of the Azure conversation trace (3,110
requests, 656,000 output tokens) simulates in milliseconds once compiled (see `tests/traffic/
test_stream_workers.py` for the speed check and a pure-Python twin it is held to).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from ground.errors import UsageError
from ground.stream import poll_requests, request_usage

__all__ = [
    "WorkerPrices",
    "WorkerSpec",
    "WorkersResult",
    "admit_window_s",
    "simulate_workers",
]


@dataclass(frozen=True)
class WorkerSpec:
    """What the simulated workers do: a stream plan's settings, its step table and the
    platform's starts. `step_s[b - 1]` is a decode step of b sequences (len == slots)."""

    workers: int
    slots: int
    step_s: tuple[float, ...]
    prefill_token_s: float
    prefill_chunk_tokens: int
    idle_exit_s: float
    poll_s: float
    timeout_s: float
    max_prompt_tokens: int
    max_new_tokens: int
    flush_tokens: int = 16
    margin_s: float = 0.0
    cold_start_s: float = 0.0  # a new environment's wait before its first iteration (INIT)
    warm_start_s: float = 0.0
    reclaim_s: float = math.inf  # an idle environment is reclaimed after this long
    receive_max: int = 10  # messages one ReceiveMessage returns at most
    # Whether latencies are the client's, through the endpoint's polling of the answer's chunks
    # (`ground.stream.seen_after`), or the worker's writes (False: what the worker does alone).
    reader_polls: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1 or self.slots < 1:
            raise UsageError(
                f"{self.workers} workers of {self.slots} slots serve nothing.",
                "give at least one worker and one slot.",
            )
        if len(self.step_s) != self.slots:
            raise UsageError(
                f"the step table has {len(self.step_s)} entries for {self.slots} slots.",
                "give one decode step time per batch size 1..slots.",
            )
        if self.prefill_chunk_tokens < 1 or self.receive_max < 1 or self.flush_tokens < 1:
            raise UsageError(
                "prefill_chunk_tokens, receive_max and flush_tokens must be at least 1.",
                "pass positive values.",
            )
        checked = (
            ("a step time", min(self.step_s)),
            ("prefill_token_s", self.prefill_token_s),
            ("poll_s", self.poll_s),
            ("idle_exit_s", self.idle_exit_s),
        )
        for what, value in checked:
            if not value > 0 or not math.isfinite(value):
                raise UsageError(f"{what} {value} is not a positive time.", "pass one.")
        if admit_window_s(self) < 0:
            longest = self.timeout_s - self.margin_s - admit_window_s(self)
            raise UsageError(
                f"the longest admissible request ({self.max_prompt_tokens} prompt tokens, "
                f"{self.max_new_tokens} new ones at {self.step_s[-1]:.3f} s per full step) "
                f"takes {longest:,.0f} s, over the worker's {self.timeout_s:g} s.",
                "admit shorter requests (max_prompt_tokens, max_new_tokens), or fewer slots.",
            )


def admit_window_s(spec: WorkerSpec) -> float:
    """How long after its start a worker may still admit (`ground.stream.admissible`
    solved for the time: the longest admissible request must end `margin_s` before the
    deadline); negative when not even a fresh worker may admit."""
    longest = spec.max_prompt_tokens * spec.prefill_token_s + spec.max_new_tokens * spec.step_s[-1]
    return spec.timeout_s - spec.margin_s - longest


@dataclass(frozen=True)
class WorkerPrices:
    """What a worker and its requests cost (`ground.stream`'s billing), from the calibration:
    the worker function's memory and Lambda prices, the queue's and the bucket's requests,
    and what remote experts cost per decode step of b sequences (`remote_step_usd[b - 1]`,
    zeros for one function) and per prompt token (`remote_prefill_token_usd`)."""

    memory_mb: float
    gb_second_usd: float
    request_usd: float
    billing_mb_per_gb: float
    init_billed_s: float  # what a cold start bills (0 where INIT is not billed)
    sqs_request_usd: float
    sqs_long_poll_s: float
    s3_put_usd: float
    s3_get_usd: float
    remote_step_usd: tuple[float, ...]
    remote_prefill_token_usd: float = 0.0


@dataclass(frozen=True, eq=False)
class WorkersResult:
    """One simulated period: per request (NaN where refused), per run, and the bill."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    refused: np.ndarray  # bool: longer than the plan admits
    input_tokens: int
    output_tokens: int
    steps_at: np.ndarray  # (slots + 1,) decode steps run at each batch size (index b)
    prefill_s: float
    decode_s: float
    idle_s: float
    invocations: int
    cold_starts: int
    peak_workers: int
    period_s: float
    bill_usd: dict[str, float] | None
    wall_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def busy_s(self) -> float:
        return self.prefill_s + self.decode_s

    def summary(self) -> dict[str, Any]:
        """What `plan --traffic --slo-ttft/--slo-tpot` records as `StreamPlan.simulated` and
        prints: quantiles over the served requests, throughput, workers, the bill."""
        served = ~self.refused
        steps = int(self.steps_at.sum())
        mean_batch = (
            float((self.steps_at * np.arange(self.steps_at.size)).sum() / steps) if steps else 0.0
        )
        return {
            "requests": int(self.refused.size),
            "served": int(served.sum()),
            "refused": int(self.refused.sum()),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "period_s": self.period_s,
            "ttft_s": quantiles(self.ttft_s),
            "tpot_s": quantiles(self.tpot_s),
            "e2e_s": quantiles(self.e2e_s),
            "output_tokens_per_s": self.output_tokens / self.period_s if self.period_s else 0.0,
            "mean_decode_batch": mean_batch,
            "worker_s": {
                "busy": self.busy_s,
                "prefill": self.prefill_s,
                "decode": self.decode_s,
                "idle": self.idle_s,
            },
            "invocations": self.invocations,
            "cold_starts": self.cold_starts,
            "peak_workers": self.peak_workers,
            "bill_usd": self.bill_usd,
            "notes": self.notes,
            "wall_s": round(self.wall_s, 4),
        }


def quantiles(values: np.ndarray) -> dict[str, float | None]:
    """p50, p99 and max of the finite values (None when there are none)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"p50": None, "p99": None, "max": None}
    qs = np.quantile(finite, [0.5, 0.99, 1.0], method="inverted_cdf")
    return {k: float(v) for k, v in zip(("p50", "p99", "max"), qs, strict=True)}


def simulate_workers(
    times_s: np.ndarray,
    prompt_tokens: np.ndarray,
    new_tokens: np.ndarray,
    spec: WorkerSpec,
    prices: WorkerPrices | None = None,
    *,
    period_s: float | None = None,
) -> WorkersResult:
    """Replay requests through `spec`'s workers (module docstring).

    The arrivals are explicit so that a replay against a real server (`bench stream`) and this
    model see the same requests; `planner.traffic.load_arrivals` gives them for a spec
    (`times_s`, `tokens`, `generated`).

    Example::

        arrivals = load_arrivals("azure-conv", scale=0.18, hours=1)
        spec = WorkerSpec(workers=2, slots=8, step_s=(0.09,) * 8, prefill_token_s=0.004,
                          prefill_chunk_tokens=256, idle_exit_s=10, poll_s=0.25,
                          timeout_s=900, max_prompt_tokens=4142, max_new_tokens=601)
        result = simulate_workers(arrivals.times_s, arrivals.tokens, arrivals.generated, spec)
        print(result.summary()["ttft_s"]["p99"])

    Args:
        times_s: Arrival seconds, sorted.
        prompt_tokens: Each request's prompt tokens (>= 1).
        new_tokens: Each request's generated tokens (>= 1).
        spec: The workers.
        prices: Prices for the bill. Defaults to None: no bill.
        period_s: The period the stream covers (for tokens per second). Defaults to None: the
            last arrival.

    Raises:
        UsageError: Arrays of different lengths, unsorted times, or a request of no tokens.
    """
    started = time.perf_counter()
    times = np.ascontiguousarray(times_s, dtype=np.float64)
    prompt = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    gen = np.ascontiguousarray(new_tokens, dtype=np.int64)
    if not times.size == prompt.size == gen.size:
        raise UsageError(
            f"{times.size} arrival times, {prompt.size} prompts and {gen.size} generations.",
            "give one prompt length and one generation length per arrival.",
        )
    if times.size and (np.any(np.diff(times) < 0) or (prompt.min() < 1) or (gen.min() < 1)):
        raise UsageError(
            "arrival times must be sorted and every request must have a prompt token and a "
            "new token.",
            "sort the arrivals; drop empty requests.",
        )
    refused = (prompt > spec.max_prompt_tokens) | (gen > spec.max_new_tokens)
    keep = np.flatnonzero(~refused)
    first, finish, steps_at, totals = _run_workers(
        times[keep],
        prompt[keep],
        gen[keep],
        spec.workers,
        spec.slots,
        np.asarray(spec.step_s, dtype=np.float64),
        float(spec.prefill_token_s),
        int(spec.prefill_chunk_tokens),
        float(spec.idle_exit_s),
        float(spec.poll_s),
        float(admit_window_s(spec)),
        float(spec.cold_start_s),
        float(spec.warm_start_s),
        float(spec.reclaim_s),
        int(spec.receive_max),
    )
    prefill_s, decode_s, idle_s, invocations, cold, peak = totals
    ttft = np.full(times.size, np.nan)
    e2e = np.full(times.size, np.nan)
    tpot = np.full(times.size, np.nan)
    if spec.reader_polls:
        first, finish = reader_view(times[keep], first, finish, gen[keep], spec.flush_tokens)
    ttft[keep] = first - times[keep]
    e2e[keep] = finish - times[keep]
    many = gen[keep] > 1
    tpot[keep[many]] = (finish[many] - first[many]) / (gen[keep][many] - 1)
    period = float(period_s) if period_s is not None else float(times[-1] if times.size else 0.0)
    result = WorkersResult(
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        refused=refused,
        input_tokens=int(prompt[keep].sum()),
        output_tokens=int(gen[keep].sum()),
        steps_at=steps_at,
        prefill_s=float(prefill_s),
        decode_s=float(decode_s),
        idle_s=float(idle_s),
        invocations=int(invocations),
        cold_starts=int(cold),
        peak_workers=int(peak),
        period_s=period,
        bill_usd=None,
        wall_s=0.0,
    )
    bill = None if prices is None else worker_bill(result, gen[keep], spec, prices)
    return _with(result, bill_usd=bill, wall_s=time.perf_counter() - started)


def reader_view(
    sent: np.ndarray, first: np.ndarray, finish: np.ndarray, new_tokens: np.ndarray, flush: int
) -> tuple[np.ndarray, np.ndarray]:
    """(first token, last token) as the endpoint's reader sees them: it polls from the send
    for chunk 0 (the first token), then after each piece for the next (`ground.stream`:
    chunk k after the token F k, the final answer at the sequence's end), each seen at its
    first poll at or after its write (`ground.stream.seen_after`). Token times between the
    first and the last are taken as evenly spaced (the simulator keeps only those two)."""
    from ground.stream import seen_after

    per_token = np.where(new_tokens > 1, (finish - first) / np.maximum(new_tokens - 1, 1), 0.0)
    seen = sent + seen_after(first - sent)
    first_seen = seen.copy()
    chunks = (new_tokens - 1) // flush  # full chunks after the first token
    for k in range(1, int(chunks.max(initial=0)) + 1):
        has = chunks >= k
        written = first + flush * k * per_token
        seen = np.where(has, seen + seen_after(np.maximum(written - seen, 0.0)), seen)
    last_seen = seen + seen_after(np.maximum(finish - seen, 0.0))
    return first_seen, last_seen


def _with(result: WorkersResult, **changes: Any) -> WorkersResult:
    import dataclasses

    return dataclasses.replace(result, **changes)


def worker_bill(
    result: WorkersResult, served_new_tokens: np.ndarray, spec: WorkerSpec, prices: WorkerPrices
) -> dict[str, float]:
    """The bill of a simulated period by item (`ground.stream`'s billing), and its split
    between input and output tokens.

    Items: the workers' duration (memory x busy and idle seconds), their Lambda requests, the
    INIT cold starts bill, the remote experts' calls (per decode step at its batch size, per
    prompt token), the queue's requests (SendMessage, DeleteMessage, the workers'
    ReceiveMessages as `ground.stream.poll_requests` counts them), the bucket's (chunk and
    final PUTs, the HEAD before admission, priced as a GET, and the client's reads: one GET
    per object written, a client that polls at the chunk interval).

    Split: prefill time and the remote prefill calls are the input's; decode steps and their
    remote calls, and the result chunks, the output's; what the workers cost beside (idle
    time, requests, cold starts, the queue) is shared in proportion to prefill and decode
    seconds. `per_million_output_all_in_usd` puts the whole bill on the output tokens.
    """
    gb = prices.memory_mb / prices.billing_mb_per_gb
    rate = prices.gb_second_usd * gb
    usage = request_usage(served_new_tokens.tolist(), spec.flush_tokens)
    receives = poll_requests(result.busy_s, result.idle_s, spec.poll_s, prices.sqs_long_poll_s)
    remote_steps = float(
        np.dot(result.steps_at[1:], np.asarray(prices.remote_step_usd, dtype=float))
    )
    remote_prefill = result.input_tokens * prices.remote_prefill_token_usd
    bill = {
        "worker_prefill_usd": result.prefill_s * rate,
        "worker_decode_usd": result.decode_s * rate,
        "worker_idle_usd": result.idle_s * rate,
        "lambda_requests_usd": result.invocations * prices.request_usd,
        "init_usd": result.cold_starts * prices.init_billed_s * rate,
        "remote_prefill_usd": remote_prefill,
        "remote_decode_usd": remote_steps,
        "sqs_usd": (usage["sqs_send"] + usage["sqs_delete"] + receives) * prices.sqs_request_usd,
        "s3_results_usd": usage["s3_put"] * (prices.s3_put_usd + prices.s3_get_usd),
        "s3_head_usd": usage["s3_head"] * prices.s3_get_usd,
    }
    total = sum(bill.values())
    busy = result.busy_s
    share = result.prefill_s / busy if busy > 0 else 0.0
    shared = total - sum(
        bill[k]
        for k in (
            "worker_prefill_usd",
            "worker_decode_usd",
            "remote_prefill_usd",
            "remote_decode_usd",
            "s3_results_usd",
        )
    )
    input_usd = bill["worker_prefill_usd"] + remote_prefill + share * shared
    output_usd = total - input_usd
    out, inp = result.output_tokens, result.input_tokens
    return bill | {
        "total_usd": total,
        "input_usd": input_usd,
        "output_usd": output_usd,
        "per_million_input_usd": input_usd / inp * 1e6 if inp else 0.0,
        "per_million_output_usd": output_usd / out * 1e6 if out else 0.0,
        "per_million_output_all_in_usd": total / out * 1e6 if out else 0.0,
    }


@njit(cache=True)
def _run_workers(  # type: ignore[no-untyped-def]  # noqa: PLR0912, PLR0915
    times,
    prompt,
    gen,
    n_workers,
    slots,
    step_s,
    prefill_token_s,
    chunk,
    idle_exit_s,
    poll_s,
    admit_window,
    cold_s,
    warm_s,
    reclaim_s,
    receive_max,
):
    """The event loop of the module docstring: (first token time, finish time, steps per
    batch size, (prefill s, decode s, idle s, invocations, cold starts, peak workers))."""
    n = times.size
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    steps_at = np.zeros(slots + 1, np.int64)
    state = np.zeros(n_workers, np.int64)  # 0 off, 1 busy, 2 idle in its long poll
    t = np.zeros(n_workers)  # busy: its next iteration boundary; idle: its exit
    t0 = np.zeros(n_workers)
    admit_until = np.zeros(n_workers)
    idle_since = np.zeros(n_workers)
    last_poll = np.zeros(n_workers)
    env_of = np.zeros(n_workers, np.int64)
    held = np.zeros(n_workers, np.int64)
    rid = np.full((n_workers, slots), -1, np.int64)
    rem = np.zeros((n_workers, slots), np.int64)  # prompt tokens still to prefill
    left = np.zeros((n_workers, slots), np.int64)  # tokens still to generate after the first
    order = np.zeros((n_workers, slots), np.int64)  # admission order: the oldest newcomer
    env_busy = np.zeros(n_workers, np.bool_)
    env_free = np.full(n_workers, -np.inf)
    admitted = 0
    running = 0
    peak = 0
    invocations = 0
    cold = 0
    prefill_s = 0.0
    decode_s = 0.0
    idle_s = 0.0
    qhead = 0
    now = -np.inf
    while True:
        wb = -1
        tb = np.inf
        idle_w = -1
        for w in range(n_workers):
            if state[w] != 0 and t[w] < tb:
                tb = t[w]
                wb = w
            if state[w] == 2 and (idle_w < 0 or idle_since[w] > idle_since[idle_w]):
                idle_w = w
        if qhead < n and (idle_w >= 0 or running < n_workers):
            te = max(times[qhead], now)
            if te <= tb:
                now = te
                if idle_w >= 0:  # a worker waiting in its long poll gets it
                    w = idle_w
                    idle_s += te - idle_since[w]
                    state[w] = 1
                    t[w] = te
                    last_poll[w] = te
                else:  # the event source mapping starts a worker with it
                    w = 0
                    while state[w] != 0:
                        w += 1
                    best = -1
                    for e in range(n_workers):
                        if (
                            not env_busy[e]
                            and env_free[e] > -np.inf
                            and env_free[e] >= te - reclaim_s
                        ):
                            if best < 0 or env_free[e] > env_free[best]:
                                best = e
                    delay = warm_s
                    if best < 0:
                        delay = cold_s
                        cold += 1
                        best = 0
                        while env_busy[best]:
                            best += 1
                    env_busy[best] = True
                    env_of[w] = best
                    t0[w] = te + delay
                    t[w] = t0[w]
                    admit_until[w] = t0[w] + admit_window
                    last_poll[w] = t0[w]
                    state[w] = 1
                    invocations += 1
                    running += 1
                    peak = max(peak, running)
                s = 0
                while rid[w, s] >= 0:
                    s += 1
                rid[w, s] = qhead
                rem[w, s] = prompt[qhead]
                left[w, s] = gen[qhead] - 1
                order[w, s] = admitted
                admitted += 1
                held[w] += 1
                qhead += 1
                continue
        if wb < 0:
            break
        w = wb
        tt = t[w]
        now = tt
        if state[w] == 2:  # idle until its exit
            idle_s += tt - idle_since[w]
            state[w] = 0
            running -= 1
            env_busy[env_of[w]] = False
            env_free[env_of[w]] = tt
            continue
        admitting = tt <= admit_until[w]
        if admitting and held[w] < slots and tt - last_poll[w] >= poll_s * (1.0 - 1e-9):
            got = 0
            while qhead < n and times[qhead] <= tt and held[w] < slots and got < receive_max:
                s = 0
                while rid[w, s] >= 0:
                    s += 1
                rid[w, s] = qhead
                rem[w, s] = prompt[qhead]
                left[w, s] = gen[qhead] - 1
                order[w, s] = admitted
                admitted += 1
                held[w] += 1
                qhead += 1
                got += 1
            last_poll[w] = tt
        if held[w] == 0:
            if admitting:
                state[w] = 2
                idle_since[w] = tt
                t[w] = min(tt + idle_exit_s, admit_until[w])
            else:
                state[w] = 0
                running -= 1
                env_busy[env_of[w]] = False
                env_free[env_of[w]] = tt
            continue
        k = -1
        for s in range(slots):
            if rid[w, s] >= 0 and rem[w, s] > 0 and (k < 0 or order[w, s] < order[w, k]):
                k = s
        if k >= 0:
            c = min(chunk, rem[w, k])
            dt = c * prefill_token_s
            tt += dt
            prefill_s += dt
            rem[w, k] -= c
            if rem[w, k] == 0:
                first[rid[w, k]] = tt
                if left[w, k] == 0:
                    finish[rid[w, k]] = tt
                    rid[w, k] = -1
                    held[w] -= 1
        b = 0
        for s in range(slots):
            if rid[w, s] >= 0 and rem[w, s] == 0:
                b += 1
        if b > 0:
            dt = step_s[b - 1]
            tt += dt
            decode_s += dt
            steps_at[b] += 1
            for s in range(slots):
                if rid[w, s] >= 0 and rem[w, s] == 0:
                    left[w, s] -= 1
                    if left[w, s] == 0:
                        finish[rid[w, s]] = tt
                        rid[w, s] = -1
                        held[w] -= 1
        t[w] = tt
    totals = (prefill_s, decode_s, idle_s, float(invocations), float(cold), float(peak))
    return first, finish, steps_at, totals
