"""`moelambda bench stream` as a call: a stream plan served on this machine, requests replayed
against it by a client process, measured against the planner's simulator for the same arrivals.

The server is `moelambda serve`'s (`runtime.serve.LocalServer`: the plan's stack on moto, the
real worker and endpoint handlers, the real model) with ONE worker: this machine has two cores,
one for the worker's torch thread and one for everything else (moto, the endpoint, the client).
The client (`runtime.stream_client`) is its own process and measures what a user measures: when
each request was sent, when its first piece and its last came.

The requests: arrival times of a Poisson stream at `rate`, each request's prompt and output
lengths drawn from the Azure conversation trace (clipped to what a two-core machine can serve
in minutes), the prompts cut from the embedded Wikipedia text, decoded greedily.

The simulator (`planner.traffic.workers.simulate_workers`) is given the same arrivals, the
requests' real prompt and output token counts, and the plan's own worker at this machine's size
(`planner.stream.worker_model` at the memory whose vCPU share is one core: the measured decode
step table of `calibrate --decode-table` unscaled, the planner's prefill rate there). Nothing in
it is fitted on this run. Decode tokens per second compare the run's sequences' tokens after
their first over the time between the first token and the last answer, measured and simulated.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import UsageError

if TYPE_CHECKING:
    from moe import MoEModel

__all__ = ["bench_stream"]

ONE_CORE_MB = 1769  # Lambda's memory with one vCPU's share (`ground.semantics.threads_for`)


def _requests(
    model: MoEModel, count: int, rate: float, seed: int, max_prompt: int, max_new: int
) -> list[dict[str, Any]]:
    from moe import load_corpus
    from planner.traffic import load_arrivals

    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, count))
    times -= times[0]
    trace = load_arrivals("azure-conv", scale=1.0)
    assert trace.generated is not None
    pick = rng.integers(0, trace.requests, count)
    prompts = np.clip(trace.tokens[pick], 1, max_prompt).astype(int)
    news = np.clip(trace.generated[pick], 1, max_new).astype(int)
    text = "\n\n".join(load_corpus("wiki").documents)
    ids = model.tokenizer(text[:200_000])["input_ids"]
    starts = rng.integers(0, len(ids) - max_prompt, count)
    return [
        {"at_s": float(t), "prompt": ids[s : s + p], "max_tokens": int(n)}
        for t, s, p, n in zip(times, starts, prompts, news, strict=True)
    ]


def _measured(records: list[dict[str, Any]]) -> dict[str, Any]:
    from planner.traffic.workers import quantiles

    ok = [r for r in records if r.get("status") == 200]
    ttft = np.array([r["first_s"] - r["sent_s"] for r in ok])
    tpot = np.array(
        [
            (r["done_s"] - r["first_s"]) / (r["completion_tokens"] - 1)
            for r in ok
            if r["completion_tokens"] > 1
        ]
    )
    decode = sum(r["completion_tokens"] - 1 for r in ok)
    span = max(r["done_s"] for r in ok) - min(r["first_s"] for r in ok) if ok else 0.0
    return {
        "requests": len(records),
        "answered": len(ok),
        "ttft_s": quantiles(ttft),
        "tpot_s": quantiles(tpot),
        "decode_tokens_per_s": decode / span if span > 0 else None,
    }


def _iterations(iterations: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """What the worker reported of its iterations: the median decode step at each batch size
    it ran (None where it ran none), its prefill seconds per token, and its mean batch."""
    steps = [i for i in iterations if i["batch"] > 0]
    by_batch = [
        float(np.median(ds)) if (ds := [i["decode_s"] for i in steps if i["batch"] == b]) else None
        for b in range(1, slots + 1)
    ]
    tokens = sum(i["prefill_tokens"] for i in iterations)
    return {
        "iterations": len(iterations),
        "decode_steps": len(steps),
        "step_s": by_batch,
        "steps_at": [sum(1 for i in steps if i["batch"] == b) for b in range(1, slots + 1)],
        "mean_decode_batch": float(np.mean([i["batch"] for i in steps])) if steps else 0.0,
        "prefill_token_s": sum(i["prefill_s"] for i in iterations) / tokens if tokens else None,
    }


def _one_core_worker(plan: Any) -> Any:
    """The plan's worker at one core (`planner.stream.WorkerModel`), made before the replay so
    a plan this moelambda cannot price stops the bench at once, not after minutes of replay."""
    from planner import load_calibration
    from planner.stream import worker_model
    from planner.traffic.workflow import manifest_of_plan

    return worker_model(
        plan,
        manifest_of_plan(plan),
        load_calibration(None),
        slots=plan.stream.slots,
        memory_mb=ONE_CORE_MB,
        prefill_chunk_tokens=plan.stream.prefill_chunk_tokens,
    )


def _simulated(plan: Any, model: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    from planner.traffic.workers import WorkerSpec, quantiles, simulate_workers

    stream = plan.stream
    spec = WorkerSpec(
        workers=1,
        slots=stream.slots,
        step_s=model.step_s,
        prefill_token_s=model.prefill_token_s,
        prefill_chunk_tokens=stream.prefill_chunk_tokens,
        idle_exit_s=stream.idle_exit_s,
        poll_s=stream.poll_s,
        timeout_s=900.0,
        max_prompt_tokens=stream.max_prompt_tokens,
        max_new_tokens=stream.max_new_tokens,
        flush_tokens=stream.flush_tokens,
        reader_polls=True,
    )
    times = np.array([r["sent_s"] for r in records])
    order = np.argsort(times, kind="stable")
    result = simulate_workers(
        times[order],
        np.array([records[i]["prompt_tokens"] for i in order]),
        np.array([records[i]["completion_tokens"] for i in order]),
        spec,
    )
    summary = result.summary()
    first = result.ttft_s + times[order]
    done = result.e2e_s + times[order]
    decode = int(sum(records[i]["completion_tokens"] - 1 for i in order))
    span = float(np.nanmax(done) - np.nanmin(first))
    return {
        "ttft_s": quantiles(result.ttft_s),
        "tpot_s": quantiles(result.tpot_s),
        "decode_tokens_per_s": decode / span if span > 0 else None,
        "mean_decode_batch": summary["mean_decode_batch"],
        "step_s": list(model.step_s),
        "step_source": model.step_source,
        "prefill_token_s": model.prefill_token_s,
    }


def _within(measured: float | None, simulated: float | None) -> float | None:
    if measured is None or not simulated:
        return None
    return round(measured / simulated - 1.0, 4)


def bench_stream(
    plan_path: Path,
    model: MoEModel,
    *,
    requests: int = 24,
    rate: float = 0.25,
    seed: int = 0,
    max_prompt: int = 256,
    max_new: int = 64,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay `requests` arrivals at `rate` per second against the plan served here (module
    docstring); the measured and simulated TTFT/TPOT quantiles and decode tokens per second,
    and the requests metered against the plan's per-answer ones.

    Raises:
        UsageError: Not a stream plan, or a non-positive count or rate.
    """
    from ground.stream import request_usage
    from runtime.serve import LocalServer, stream_plan

    if requests < 1 or rate <= 0 or max_prompt < 1 or max_new < 1:
        raise UsageError(
            "--requests, --rate, --max-prompt and --max-new must be positive.",
            "pass e.g. --requests 24 --rate 0.25.",
        )
    say = progress or (lambda _: None)
    document = stream_plan(plan_path)
    stream = document.stream
    assert stream is not None
    max_prompt = min(max_prompt, stream.max_prompt_tokens)
    max_new = min(max_new, stream.max_new_tokens)
    worker = _one_core_worker(document)
    sent = _requests(model, requests, rate, seed, max_prompt, max_new)
    with tempfile.TemporaryDirectory(prefix="moelambda-bench-stream-") as tmp:
        given, out = Path(tmp) / "requests.json", Path(tmp) / "records.json"
        timings = Path(tmp) / "metrics.jsonl"
        given.write_text(json.dumps(sent))
        timings.touch()
        with LocalServer(
            plan_path, model, port=0, max_workers=1, metrics_file=timings, progress=say
        ) as server:
            say(f"replaying {requests} requests at {rate:g}/s from a client process")
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "runtime.stream_client", server.url, str(given), str(out)],
                check=True,
            )
            wall = time.perf_counter() - started
            assert server.stack is not None
            server.stack.idle(120)
            metered = server.stack.meter.snapshot()
            invocations = list(server.stack.invocations)
        records = json.loads(out.read_text())
        iterations = [
            r
            for line in timings.read_text().splitlines()
            if (r := json.loads(line)).get("kind") == "worker_iteration"
        ]
    failed = [r["status"] for r in records if r.get("status") != 200]
    if failed:
        return {"status": "FAILED", "errors": failed}
    measured = _measured(records) | {"worker": _iterations(iterations, stream.slots)}
    simulated = _simulated(document, worker, records)
    planned = request_usage([r["completion_tokens"] for r in records], stream.flush_tokens)
    got = {
        "sqs_send": int(metered.get("sqs_SendMessage", 0)),
        "sqs_delete": int(metered.get("sqs_DeleteMessage", 0)),
        "s3_put": int(metered.get("s3_PutObject", 0)),
        "s3_head": int(metered.get("s3_HeadObject_missing", 0)),
    }
    return {
        "status": "SUCCEEDED",
        "model": document.model.model,
        "slots": stream.slots,
        "workers": 1,
        "requests": requests,
        "rate_per_s": rate,
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
        "wall_s": round(wall, 2),
        "measured": measured,
        "simulated": simulated,
        "measured_over_simulated_minus_1": {
            "ttft_p99": _within(measured["ttft_s"]["p99"], simulated["ttft_s"]["p99"]),
            "tpot_p99": _within(measured["tpot_s"]["p99"], simulated["tpot_s"]["p99"]),
            "decode_tokens_per_s": _within(
                measured["decode_tokens_per_s"], simulated["decode_tokens_per_s"]
            ),
        },
        "requests_metered": got,
        "requests_planned": planned,
        "metered_equals_planned": got == planned,
        "polls_metered": {
            "sqs_receive": int(metered.get("sqs_ReceiveMessage", 0)),
            "s3_get_missing": int(metered.get("s3_GetObject_missing", 0)),
        },
        "worker_invocations": len(invocations),
        "worker_gb_s": round(float(metered.get("worker_gb_s", 0.0)), 3),
    }
