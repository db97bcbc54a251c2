"""Planning a stream of generation requests served by continuously batching workers.

The worker (`ground.stream`) is one more workload on the deployment a generating plan already
is: the plan's driver or one function, its memory, hardware and remote experts. What the worker
adds is a batch of up to `slots` sequences per decode step, so its model is:

* the decode step table, `step_s[b - 1]` for b = 1..slots sequences: measured where the
  calibration has a table for this model at these weights (`decode_step_table`, measured by
  `moelambda calibrate --decode-table` on one thread, i.e. one vCPU) for a plan with no remote
  expert, scaled to the function's vCPUs by Amdahl's law with the serial share measured beside
  it (`DecodeStepTable.serial_fraction`: a decode step is mostly one thread dispatching small
  operations, which more vCPUs do not shorten); otherwise the model's step
  (`planner.generation.plan_decode` at B = b);
* prefill seconds per prompt token: the plan's prefill model (`planner.generation.plan_timing`)
  of one chunk of `prefill_chunk_tokens`, over its tokens;
* the memory: the driver's stages and local experts, one chunk's activations and the KV cache
  of `slots` sequences of the longest admissible request (`max_prompt_tokens +
  max_new_tokens`);
* the bill (`planner.traffic.workers.WorkerPrices`): memory x the invocation's seconds, one
  Lambda request per invocation, the remote experts' calls per step and per prompt token, and
  the queue's and the bucket's requests (`ground.stream.request_usage`, `poll_requests`),
  every price from the calibration.

`plan_stream` then searches slots, the worker's memory, the workers N (the event source
mapping's maximum concurrency) and the idle exit, simulates each candidate over the stream
(`planner.traffic.workers.simulate_workers`) and keeps the cheapest whose TTFT and TPOT p99 meet
the SLOs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import InfeasibleError, UsageError
from ground.plan import GenerationPlan, Plan, StreamPlan
from ground.progress import Status, quiet
from planner.traffic.workers import WorkerPrices, WorkerSpec, WorkersResult, simulate_workers

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.api import PlanningCounts, PlanOptions
    from planner.calibration import Calibration
    from planner.traffic.spec import Arrivals

__all__ = [
    "DECODE_TABLE_ENTRY",
    "StreamOptions",
    "WorkerModel",
    "decode_table_key",
    "plan_stream",
    "simulate_stream_plan",
    "worker_model",
]

DECODE_TABLE_ENTRY = "decode_step_table"  # the calibration entry `calibrate --decode-table` fills
LENGTH_QUANTILE = 0.99  # the longest admissible request: the stream's 99th percentiles
DEADLINE_MARGIN_S = 1.0  # what a worker keeps before its deadline beyond the longest request:
# the last chunk's PUT, the final PUT and the DeleteMessage (three S3/SQS requests, ~20 ms each),
# with room for a slow one; a planning choice, not a platform fact
VISIBILITY_MARGIN_S = 30  # the queue's visibility timeout beyond the function's timeout


@dataclass(frozen=True)
class StreamOptions:
    """What `plan_stream` searches and the worker settings it does not search, with the
    defaults the issue asks for: a chunk of 256 prompt tokens keeps a running step's stall to
    one chunk; 16 tokens per result chunk keep the PUTs to one per 16 tokens; a 0.25 s poll
    admits a waiting request within about a step or two."""

    slots: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    idle_exit_s: tuple[float, ...] = (2.0, 30.0)
    prefill_chunk_tokens: int = 256
    flush_tokens: int = 16
    poll_s: float = 0.25
    max_workers: int = 512
    memories: int = 6  # memory options tried per slots value, the smallest that hold it first


@dataclass(frozen=True)
class WorkerModel:
    """A worker of `slots` slots at `memory_mb`: its step table, prefill speed and prices."""

    memory_mb: float
    slots: int
    step_s: tuple[float, ...]
    prefill_token_s: float
    step_source: str  # "measured: ..." or "model: ..."
    prices: WorkerPrices
    invokes_per_step: float  # remote Invokes of a full step (0 for one function)


def decode_table_key(manifest: Manifest) -> str:
    """The calibration's name for a model's measured step table: the model, its experts, its
    top-k and its weights (a table measured at fp32 says nothing of int8's)."""
    return f"{manifest.model} E{manifest.experts} k{manifest.top_k} {manifest.precision.label()}"


def _measured_table(
    plan: Plan, manifest: Manifest, calibration: Calibration, slots: int
) -> tuple[np.ndarray, str] | None:
    """The calibration's measured step table for this model at this plan's memory, 1..slots
    (None: none measured, or the plan calls remote experts, which the table did not).

    The table is one vCPU's (`entry.memory_mb`). Below one vCPU a step takes longer by the
    CPU share; above it, by Amdahl's law with the serial share measured per batch
    (`DecodeStepTable.serial_fraction`): x (s + (1 - s) / vCPUs)."""
    tables = getattr(calibration, DECODE_TABLE_ENTRY, None) or {}
    entry = tables.get(decode_table_key(manifest))
    if entry is None or _calls_remote(plan):  # a driver's remote experts: the model's step
        return None
    batches = np.asarray(entry.batches, dtype=float)
    b = np.arange(1, slots + 1, dtype=float)
    table = _along(b, batches, np.asarray(entry.step_s, dtype=float))
    serial = np.clip(_along(b, batches, np.asarray(entry.serial_fraction)), 0.0, 1.0)

    def time_factor(vcpus: float) -> np.ndarray:
        if vcpus <= 1.0:
            return np.full_like(serial, 1.0 / vcpus)
        return serial + (1.0 - serial) / vcpus

    measured, here = (
        calibration.vcpus_at(entry.memory_mb),
        calibration.vcpus_at(plan.nonmoe_memory_mb),
    )
    factor = time_factor(here) / time_factor(measured)
    source = (
        f"measured: calibration {DECODE_TABLE_ENTRY} at {entry.memory_mb:g} MB (one thread), "
        f"x {float(factor[0]):.3f}..{float(factor[-1]):.3f} for {plan.nonmoe_memory_mb} MB "
        f"({here:.2f} vCPUs; serial share {float(serial[0]):.2f}..{float(serial[-1]):.2f})"
    )
    return table * factor, source


def _along(b: np.ndarray, batches: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` measured at `batches`, at every batch `b`: interpolated between them, and
    past the last along the last segment (as `ground.stream` extends a step table)."""
    out = np.interp(b, batches, values)
    if b[-1] > batches[-1] and batches.size > 1:
        slope = (values[-1] - values[-2]) / (batches[-1] - batches[-2])
        out = np.where(b > batches[-1], values[-1] + slope * (b - batches[-1]), out)
    return out


def worker_model(
    plan: Plan,
    manifest: Manifest,
    calibration: Calibration,
    *,
    slots: int,
    memory_mb: float,
    prefill_chunk_tokens: int,
) -> WorkerModel:
    """The worker of generating `plan` at `memory_mb` with `slots` slots (module docstring).

    `plan` is a driver or one function (`plan.generation` set); its other decisions (local and
    remote experts, their memories) are kept, only the worker's memory changes. The worker is
    started by the queue's event source mapping, not a workflow: no Express duration is billed.

    Raises:
        CalibrationError: A price or a generation parameter is missing (named).
    """
    from planner.generation import plan_decode, plan_timing

    at = plan.model_copy(update={"nonmoe_memory_mb": int(memory_mb), "workflow": "standard"})
    price = calibration.price(plan.arch)
    mb_s_usd = price.gb_second_usd / calibration.billing_mb_per_gb
    steps, remote, invokes = [], [], 0.0
    for b in range(1, slots + 1):
        tpot, step_usd, invokes = plan_decode(at, manifest, b)
        steps.append(tpot)
        remote.append(max(step_usd - tpot * memory_mb * mb_s_usd, 0.0))
    table, source = np.asarray(steps), "model: planner.generation.decode_step at B = 1..slots"
    measured = _measured_table(at, manifest, calibration, slots)
    if measured is not None:
        table, source = measured
    ttft, _ = plan_timing(at, manifest, [prefill_chunk_tokens], 1)
    prefill_token_s = ttft / prefill_chunk_tokens
    gen = plan.generation
    assert gen is not None
    remote_prefill = 0.0
    if _calls_remote(plan):  # the prefill's remote calls: its bill per token beside the driver's
        driver_usd = gen.ttft_s / gen.prompt_tokens * plan.nonmoe_memory_mb * mb_s_usd
        remote_prefill = max(gen.bill_per_million_input_usd / 1e6 - driver_usd, 0.0)
    cold = _cold_start(plan, calibration)
    prices = WorkerPrices(
        memory_mb=float(memory_mb),
        gb_second_usd=price.gb_second_usd,
        request_usd=price.request_usd,
        billing_mb_per_gb=calibration.billing_mb_per_gb,
        init_billed_s=cold[1],
        sqs_request_usd=float(calibration.required("sqs_request_usd", "pricing stream workers")),
        sqs_long_poll_s=float(calibration.required("sqs_long_poll_s", "pricing stream workers")),
        s3_put_usd=calibration.s3_put_request_usd,
        s3_get_usd=calibration.s3_get_request_usd,
        remote_step_usd=tuple(float(r) for r in remote),
        remote_prefill_token_usd=remote_prefill,
    )
    return WorkerModel(
        memory_mb=float(memory_mb),
        slots=slots,
        step_s=tuple(float(s) for s in table),
        prefill_token_s=float(prefill_token_s),
        step_source=source,
        prices=prices,
        invokes_per_step=float(invokes),
    )


def _calls_remote(plan: Plan) -> bool:
    """Whether the worker invokes remote experts (a driver), or holds every expert."""
    return any(layer.experts for layer in plan.layers)


def _cold_start(plan: Plan, calibration: Calibration) -> tuple[float, float]:
    """(seconds a new worker environment waits, seconds it bills) before its first iteration:
    the driver's INIT and weight load, as the traffic simulator models every function's."""
    from ground.driver import remote_table_bytes
    from planner.traffic.platform import platform_for
    from planner.traffic.workflow import workflow_model

    model = workflow_model(plan, 1)
    platform = platform_for(
        calibration, model.functions, plan.arch, static_bytes=remote_table_bytes(plan)
    )
    wait, billed = platform.cold_s()
    driver = model.functions.role.index("driver")
    return float(wait[driver]), float(billed[driver]) if platform.init_billed else 0.0


def _worker_memory_mb(plan: Plan, slots: int, chunk: int, longest: int) -> float:
    """What a worker of `slots` slots holds: the driver's stages and local experts, one
    chunk's activations, and the KV cache of `slots` requests of `longest` tokens."""
    from planner.traffic.generation import generation_limits

    _, fixed, activations, kv = generation_limits(plan)
    return fixed + activations * chunk + kv * slots * longest


def _spec(
    model: WorkerModel,
    *,
    workers: int,
    idle_exit_s: float,
    options: StreamOptions,
    timeout_s: float,
    max_prompt: int,
    max_new: int,
    cold_s: float,
    calibration: Calibration,
) -> WorkerSpec:
    idle = calibration.required("idle_reclaim_s", "simulating stream workers")
    return WorkerSpec(
        workers=workers,
        slots=model.slots,
        step_s=model.step_s,
        prefill_token_s=model.prefill_token_s,
        prefill_chunk_tokens=options.prefill_chunk_tokens,
        idle_exit_s=idle_exit_s,
        poll_s=options.poll_s,
        timeout_s=timeout_s,
        max_prompt_tokens=max_prompt,
        max_new_tokens=max_new,
        flush_tokens=options.flush_tokens,
        margin_s=DEADLINE_MARGIN_S,
        cold_start_s=cold_s,
        warm_start_s=calibration.warm_start_s,
        reclaim_s=idle.assumed_s,
        receive_max=int(calibration.required("sqs_receive_max_messages", "stream workers")),
        reader_polls=True,  # the SLOs are the client's, through the endpoint's reads
    )


@dataclass(frozen=True, eq=False)
class _Candidate:
    model: WorkerModel
    spec: WorkerSpec
    result: WorkersResult

    @property
    def total_usd(self) -> float:
        assert self.result.bill_usd is not None
        return self.result.bill_usd["total_usd"]

    def p99(self) -> tuple[float, float]:
        s = self.result.summary()
        ttft, tpot = s["ttft_s"]["p99"], s["tpot_s"]["p99"]
        return (math.inf if ttft is None else ttft, 0.0 if tpot is None else tpot)


def _search_workers(
    simulate: Any, slo_ttft_s: float, slo_tpot_s: float, max_workers: int
) -> tuple[_Candidate | None, _Candidate]:
    """(the cheapest N meeting both SLOs, or None; the best TTFT seen) for one worker model:
    the fewest workers whose TTFT p99 meets the SLO (more workers only shorten the queue, so
    TTFT falls with N), by doubling then bisection, then N + 1 and N + 2 (fewer workers batch
    more sequences, so TPOT may rise; a slightly larger N can be cheaper)."""
    seen: dict[int, _Candidate] = {}

    def run(n: int) -> _Candidate:
        if n not in seen:
            seen[n] = simulate(n)
        return seen[n]

    def ok(c: _Candidate) -> bool:
        ttft, tpot = c.p99()
        return ttft <= slo_ttft_s and tpot <= slo_tpot_s

    def ttft_ok(c: _Candidate) -> bool:
        return c.p99()[0] <= slo_ttft_s

    n = 1
    while not ttft_ok(run(n)) and n < max_workers:
        n = min(2 * n, max_workers)
    if ttft_ok(run(n)):
        low = n // 2 + 1 if n > 1 else 1
        high = n
        while low < high:
            mid = (low + high) // 2
            if ttft_ok(run(mid)):
                high = mid
            else:
                low = mid + 1
        for extra in (high, high + 1, high + 2):
            if extra <= max_workers:
                run(extra)
    fastest = min(seen.values(), key=lambda c: c.p99())
    feasible = [c for c in seen.values() if ok(c)]
    return (min(feasible, key=lambda c: c.total_usd) if feasible else None), fastest


def plan_stream(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    traffic: str,
    options: PlanOptions,
    scale: float = 1.0,
    hours: float | None = None,
    seed: int = 0,
    stream: StreamOptions | None = None,
    status: Status = quiet,
) -> tuple[Plan, dict[str, Any]]:
    """The cheapest stream plan (workers over a queue) meeting TTFT and TPOT p99 SLOs.

    The worker's structure (one function, or a driver and which experts it calls) is
    `moelambda plan --slo-tpot`'s for one sequence (`planner.api.plan_deployment`, a prompt of
    one chunk generating the stream's longest admitted request): a step of one sequence must
    meet the TPOT SLO at least. Then for every slots value and the smallest `stream.memories`
    memory options that hold its KV cache, the worker model (`worker_model`); for each, the
    fewest workers whose simulated TTFT p99 meets the SLO (and two more), at each idle exit,
    simulated over the stream (`planner.traffic.workers.simulate_workers`); the cheapest
    period's bill meeting both p99 SLOs is written (`Plan.stream`). The per-request path
    (each request its own invocation) stays `planner.traffic.api.plan_generation_traffic`.

    Example::

        options = PlanOptions(slo_ttft_s=10, slo_tpot_s=0.25)
        plan, summary = plan_stream(manifest, planning, load_calibration(),
                                    traffic="azure-conv", options=options, scale=0.18, hours=1)
        print(plan.stream.slots, plan.stream.workers, summary["bill_usd"])

    Args:
        manifest: The decoder's manifest.
        counts: Predicted counts (`planner.api.counts_for_plan`): the routing shares.
        calibration: With prices, traffic and queue parameters.
        traffic: A CSV with generated tokens, 'azure-conv', 'poisson:RATE' or
            'diurnal:PEAK,TROUGH'.
        options: The plan's options; `slo_ttft_s` and `slo_tpot_s` are the p99 SLOs;
            `prompt_tokens`/`new_tokens`, if given, are the longest admitted request.
        scale: Multiplies the stream's rate (`planner.traffic.load_arrivals`).
        hours: The period simulated. Defaults to None: the stream's own.
        seed: Seeds synthetic arrivals.
        stream: What is searched. Defaults to None: `StreamOptions()`.
        status: Wraps the search (a spinner in the CLI).

    Returns:
        The plan (with `generation` and `stream`) and the summary `plan --json` prints.

    Raises:
        UsageError: Missing SLOs, a stream without generated tokens, or --batch-sequences.
        InfeasibleError: No candidate meets the SLOs; names the smallest SLOs one meets.
    """
    from planner.api import plan_deployment
    from planner.traffic.platform import init_model
    from planner.traffic.spec import generation_arrivals

    started = time.perf_counter()
    so = stream or StreamOptions()
    slo_ttft, slo_tpot = options.slo_ttft_s, options.slo_tpot_s
    if slo_ttft is None or slo_tpot is None:
        raise UsageError(
            "a stream of generation is planned for a TTFT and a TPOT p99 SLO.",
            "pass both --slo-ttft and --slo-tpot (e.g. --slo-ttft 10 --slo-tpot 0.25).",
        )
    if options.batch_sequences not in (None, 1):
        raise UsageError(
            f"--batch-sequences {options.batch_sequences} with --traffic: the workers' batch is "
            "planned (their slots), not given.",
            "drop --batch-sequences.",
        )
    init_model(calibration)
    arrivals = generation_arrivals(traffic, scale=scale, hours=hours, seed=seed)
    max_prompt = options.prompt_tokens or _quantile(arrivals.tokens)
    max_new = options.new_tokens or _quantile(arrivals.generated)
    chunk = min(so.prefill_chunk_tokens, max_prompt)
    so = dataclasses.replace(so, prefill_chunk_tokens=chunk)
    sized = dataclasses.replace(
        options, batch_sequences=1, prompt_tokens=chunk, new_tokens=max_new, slo_ttft_s=None
    )
    with status("planning stream workers") as shown:
        base = plan_deployment(manifest, counts, calibration, options=sized).plan
        cold_s = _cold_start(base, calibration)[0]
        timeout = float(calibration.max_timeout_s)
        best, fastest, tried = _search(
            base, manifest, calibration, arrivals, so, slo_ttft, slo_tpot,
            max_prompt=max_prompt, max_new=max_new, timeout_s=timeout, cold_s=cold_s,
            progress=shown.update,
        )  # fmt: skip
    if best is None:
        raise _infeasible(fastest, slo_ttft, slo_tpot, tried)
    plan = _stream_plan(base, best, arrivals, so, slo_ttft, slo_tpot, max_prompt, max_new,
                        traffic=traffic, scale=scale, hours=hours, seed=seed)  # fmt: skip
    assert plan.stream is not None
    summary = {
        "deployment": plan.deployment,
        "memory_mb": plan.nonmoe_memory_mb,
        "stream": plan.stream.model_dump(exclude={"simulated"}),
        "step_source": best.model.step_source,
        "traffic": arrivals.describe() | {"generated_tokens": int(arrivals.generated.sum())},
        **plan.stream.simulated,
        "candidates": tried,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return plan, summary


def _quantile(values: np.ndarray) -> int:
    return int(np.quantile(values, LENGTH_QUANTILE, method="inverted_cdf"))


def _search(
    base: Plan,
    manifest: Manifest,
    calibration: Calibration,
    arrivals: Arrivals,
    so: StreamOptions,
    slo_ttft: float,
    slo_tpot: float,
    *,
    max_prompt: int,
    max_new: int,
    timeout_s: float,
    cold_s: float,
    progress: Any,
) -> tuple[_Candidate | None, _Candidate | None, int]:
    """(the cheapest candidate meeting both SLOs, the one with the best TTFT p99, how many
    were simulated) over slots x memory x idle exit x workers."""
    from planner.driver import driver_options_mb

    assert arrivals.generated is not None
    options = np.unique(np.r_[driver_options_mb(calibration), base.nonmoe_memory_mb])
    best: _Candidate | None = None
    fastest: _Candidate | None = None
    tried = 0
    for slots in so.slots:
        need = _worker_memory_mb(base, slots, so.prefill_chunk_tokens, max_prompt + max_new)
        memories = options[options >= need][: so.memories]
        for memory in memories:
            model = worker_model(
                base, manifest, calibration, slots=slots, memory_mb=float(memory),
                prefill_chunk_tokens=so.prefill_chunk_tokens,
            )  # fmt: skip
            if model.step_s[0] > slo_tpot:
                continue  # one sequence alone is too slow at this memory
            for idle in so.idle_exit_s:
                progress(f"{slots} slots, {memory:,.0f} MB, idle exit {idle:g} s")

                def simulate(n: int, model: WorkerModel = model, idle: float = idle) -> _Candidate:
                    spec = _spec(model, workers=n, idle_exit_s=idle, options=so,
                                 timeout_s=timeout_s, max_prompt=max_prompt, max_new=max_new,
                                 cold_s=cold_s, calibration=calibration)  # fmt: skip
                    result = simulate_workers(
                        arrivals.times_s, arrivals.tokens, arrivals.generated, spec,
                        model.prices, period_s=arrivals.period_s,
                    )  # fmt: skip
                    return _Candidate(model, spec, result)

                try:
                    found, quick = _search_workers(simulate, slo_ttft, slo_tpot, so.max_workers)
                except UsageError:
                    continue  # the longest request does not fit one invocation at this size
                tried += 1
                if fastest is None or quick.p99() < fastest.p99():
                    fastest = quick
                if found is not None and (best is None or found.total_usd < best.total_usd):
                    best = found
    return best, fastest, tried


def _infeasible(
    fastest: _Candidate | None, slo_ttft: float, slo_tpot: float, tried: int
) -> InfeasibleError:
    if fastest is None:
        return InfeasibleError(
            f"no worker meets the TPOT SLO of {slo_tpot:.3f} s with one sequence, or holds "
            "the longest request within one invocation.",
            "raise --slo-tpot, or admit shorter requests (--prompt-tokens, --new-tokens).",
        )
    ttft, tpot = fastest.p99()
    return InfeasibleError(
        f"no stream plan of the {tried} searched meets TTFT p99 {slo_ttft:.3f} s and TPOT p99 "
        f"{slo_tpot:.3f} s: the fastest reaches TTFT p99 {ttft:.3f} s with TPOT p99 "
        f"{tpot:.3f} s ({fastest.spec.slots} slots, {fastest.spec.workers} workers).",
        f"pass --slo-ttft {math.ceil(ttft * 1000) / 1000:.3f} --slo-tpot "
        f"{math.ceil(tpot * 1000) / 1000:.3f} or more.",
        smallest_slo_s=ttft,
    )


def _stream_plan(
    base: Plan,
    best: _Candidate,
    arrivals: Arrivals,
    so: StreamOptions,
    slo_ttft: float,
    slo_tpot: float,
    max_prompt: int,
    max_new: int,
    **traffic: Any,
) -> Plan:
    """The written plan: the base plan at the worker's memory, its generation block for the
    worker's full batch, and the stream block with what the simulation found."""
    from planner.traffic.generation import generation_limits

    model, spec, result = best.model, best.spec, best.result
    gen = base.generation
    assert gen is not None and result.bill_usd is not None
    *_, kv = generation_limits(base)
    bill = result.bill_usd
    generation = GenerationPlan(
        batch_sequences=spec.slots,
        prompt_tokens=max_prompt,
        new_tokens=max_new,
        slo_ttft_s=slo_ttft,
        slo_tpot_s=slo_tpot,
        ttft_s=max_prompt * model.prefill_token_s,
        tpot_s=model.step_s[-1],
        bill_per_million_input_usd=bill["per_million_input_usd"],
        bill_per_million_output_usd=bill["per_million_output_usd"],
        invokes_per_step=model.invokes_per_step,
        kv_cache_mb=kv * spec.slots * (max_prompt + max_new),
    )
    simulated = result.summary() | {"step_source": model.step_source}
    stream = StreamPlan(
        traffic=arrivals.describe() | traffic,
        slots=spec.slots,
        workers=spec.workers,
        idle_exit_s=spec.idle_exit_s,
        prefill_chunk_tokens=spec.prefill_chunk_tokens,
        flush_tokens=spec.flush_tokens,
        poll_s=spec.poll_s,
        max_prompt_tokens=max_prompt,
        max_new_tokens=max_new,
        visibility_timeout_s=int(math.ceil(spec.timeout_s)) + VISIBILITY_MARGIN_S,
        step_s=list(model.step_s),
        prefill_token_s=model.prefill_token_s,
        slo_ttft_s=slo_ttft,
        slo_tpot_s=slo_tpot,
        simulated=simulated,
    )
    document = base.model_dump() | {
        "nonmoe_memory_mb": int(model.memory_mb),
        "workflow": "standard",
        "generation": generation.model_dump(),
        "stream": stream.model_dump(),
    }
    return Plan.model_validate(document)


def simulate_stream_plan(
    plan: Plan, arrivals: Any, calibration: Calibration | None = None
) -> dict[str, Any]:
    """A stream plan's workers over another stream (`moelambda traffic --plan`): its own
    worker (slots, memory, workers, idle exit, limits) simulated as `plan_stream` simulated
    its candidates, on the plan's own calibration (what it lacks from `calibration`).

    Raises:
        UsageError: `plan` has no stream block, or the stream says nothing of what each
            request generates.
    """
    from planner.traffic.platform import traffic_calibration
    from planner.traffic.workflow import manifest_of_plan

    stream = plan.stream
    if stream is None:
        raise UsageError("this plan has no workers to simulate.", "pass a stream plan.")
    if arrivals.requests == 0 or arrivals.generated is None:
        raise UsageError(
            "the stream does not say what each request generates.",
            "pass a stream with GeneratedTokens (azure-conv).",
        )
    cal, _ = traffic_calibration(plan, calibration)  # the plan's, its gaps from `calibration`
    options = StreamOptions(
        prefill_chunk_tokens=stream.prefill_chunk_tokens,
        flush_tokens=stream.flush_tokens,
        poll_s=stream.poll_s,
    )
    model = worker_model(
        plan,
        manifest_of_plan(plan),
        cal,
        slots=stream.slots,
        memory_mb=float(plan.nonmoe_memory_mb),
        prefill_chunk_tokens=stream.prefill_chunk_tokens,
    )
    spec = _spec(
        model,
        workers=stream.workers,
        idle_exit_s=stream.idle_exit_s,
        options=options,
        timeout_s=float(cal.max_timeout_s),
        max_prompt=stream.max_prompt_tokens,
        max_new=stream.max_new_tokens,
        cold_s=_cold_start(plan, cal)[0],
        calibration=cal,
    )
    result = simulate_workers(
        arrivals.times_s,
        arrivals.tokens,
        arrivals.generated,
        spec,
        model.prices,
        period_s=arrivals.period_s,
    )
    return {"workers": stream.workers, "slots": stream.slots, **result.summary()}
