"""`moelambda run-local` as a call: a plan's synthesised workflow run on moto with the real
handlers in this process, its output checked against the monolithic model.

This module sits beside the command line, above cdk/, functions/, pipeline/ and planner/, whose
work it puts together; the command line only checks its arguments, loads the model, cuts the
batch and renders.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

    from ground.placement import Placement
    from ground.plan import Plan
    from moe import MoEModel
    from pipeline.faults import Faults

__all__ = ["metering", "run_plan_locally"]

CHUNK_WINDOWS = 32  # windows per monolithic forward pass (bounds a large batch's memory)


def run_plan_locally(
    plan: Path,
    model: MoEModel,
    ids: np.ndarray,
    *,
    requests: int = 1,
    faults: Faults | None = None,
    metrics_file: Path | None = None,
    progress: Callable[[str], None] | None = None,
    on_planned_device: bool = False,
) -> dict[str, Any]:
    """Run the plan's Step Functions workflow on moto, handlers in-process, and check it.

    The state machine and every function's environment come from the template `moelambda
    synth` would produce; the output is compared with the monolithic MoE forward of the same
    input. One execution without faults is metered (functions warm, as the plan prices them):
    its billed requests, transitions and GB-seconds are set against the plan's, and priced.
    The requests must equal the plan's exactly; the GB-seconds are this machine's (every
    handler in-process on moto, sharing its cores), not Lambda's, so the metered bill's
    duration items are not a prediction of Lambda's: `metering` says so, with the measured
    over predicted seconds of each function.

    Args:
        plan: The plan JSON (`moelambda plan`).
        model: The plan's model, loaded (`moe.load_model` with the plan's model reference).
        ids: The request's token ids, (windows, tokens per window).
        requests: Concurrent executions of the same input. Defaults to 1 (metered).
        faults: Faults to inject (`pipeline.faults.Faults`). Defaults to None (none).
        metrics_file: Where the gates append their routing metrics (EMF, one JSON line per
            gate call), as a deployed gate prints them. Defaults to None (not written).
        progress: Called with a message as each step starts. Defaults to None.
        on_planned_device: Run a GPU-backed plan's GPU functions on their planned device
            (`ground.placement.GPU`: a GPU of this machine, bfloat16) instead of its CPU at
            float32. Defaults to False; `placement` in the result says where each ran.

    Returns:
        The status, the largest difference from the monolithic output, per function the
        seconds (predicted against measured), the failed requests, the faults injected, what
        the functions' IAM policies refused, and for a metered run its usage and bill against
        the plan's with what they mean (`metering`): what `moelambda run-local --json` prints.

    Raises:
        UsageError: `requests` is below 1, or a fault the plan's shape cannot take
            (`Faults.check_plan`: expert-crash on a one-function plan); see also
            `planner.instance_of` (a batch the plan cannot serve is refused before the run).
    """
    from cdk.app import DEFAULT_STACK, build_app
    from functions.local import run_workflow
    from ground.plan import Plan
    from moe import export_model
    from pipeline.faults import Faults
    from pipeline.stacks import flat_template
    from planner import evaluate_plan, price_usage
    from runtime.serve import refuse_stream

    say = progress or (lambda _: None)
    document = Plan.load(plan)
    refuse_stream(document, "run-local")
    injected = faults or Faults()
    if requests < 1:
        raise UsageError(f"--requests {requests} is below 1.", "pass --requests 1 or more.")
    injected.check_plan(document)
    say(f"running the monolithic model on {ids.size:,} tokens")
    reference, counts = _reference(model, ids, document.model.experts)
    metered = requests == 1 and not injected.any
    with tempfile.TemporaryDirectory(prefix="moelambda-local-") as tmp:
        root = Path(tmp)
        say("exporting weights and synthesising the stack")
        manifest = export_model(model, root / "weights")
        # A traffic plan's capacity (provisioned aliases, warmer schedules) keeps a stream's
        # environments warm; one local batch runs the same workflow without it.
        source = plan
        if getattr(document, "traffic", None) is not None:
            source = document.model_copy(update={"traffic": None}).save(root / "plan.json")
        build_app(source, root / "cdk.out", stack_name=DEFAULT_STACK)
        template = flat_template(root / "cdk.out", DEFAULT_STACK)
        # Before the run: a batch the plan cannot serve (more tokens than an expert's replicas
        # can take) is refused here, as its gate would refuse it.
        planned = evaluate_plan(document, manifest, counts, int(ids.size))
        say(f"running {requests} execution(s) on moto")
        records = metrics_file or root / "metrics.jsonl"
        started = time.perf_counter()
        result = run_workflow(
            template,
            root / "weights",
            [ids] * requests,
            metered=metered,
            faults=injected,
            metrics_file=records,
            on_planned_device=on_planned_device,
            placements=_placements(document),
        )
        wall_s = time.perf_counter() - started
        ids_run = {r["request_id"] for r in result["requests"]}
        layers = _driver_layers(records, ids_run)
    runs = result["requests"]
    diffs = [float(abs(r["output"] - reference).max()) for r in runs if "output" in r]
    failed = [r for r in runs if r["status"] != "SUCCEEDED"]
    summary: dict[str, Any] = {
        "status": "SUCCEEDED" if not failed else failed[0]["status"],
        "max_abs_diff_vs_monolithic": max(diffs) if diffs else None,
        "max_abs_monolithic": float(abs(reference).max()),  # the output's scale
        "per_function_seconds": {
            name: round(sum(times), 4) for name, times in sorted(result["seconds"].items())
        },
        "predicted_vs_measured": _predicted_vs_measured(
            planned.seconds, planned.latency_s, result["seconds"], runs
        ),
        "requests": len(runs),
        "succeeded": len(runs) - len(failed),
        "failed": [
            {"request": r["request_id"], "error": r.get("error"), "cause": r.get("cause")}
            for r in failed
        ],
        "wall_s": round(wall_s, 3),
        "driver_layers": layers,
        "faults_injected": result["faults"],
        "tokens": int(ids.size),
        "intermediates_left": sum(r.get("intermediates_left", 0) for r in runs),
        # Requests the functions' own IAM policies (from the template) refused: none, or a bug.
        "access_denied": [
            {"function": who, "action": action, "resource": resource}
            for who, action, resource in result["denied"]
        ],
        "metered": None,
        "planned": None,
        "bill": None,
        "metering": None,
        "deployment": document.deployment,
        # the shapes `plan` weighed beside this one, as it priced them for its batch
        "candidates": document.candidates,
        "gpu_backed": _gpu_backed(document),
        # GPU-backed functions run on this machine's CPU at float32 unless on_planned_device
        "placement": {
            name: {"planned": planned_at, "ran": "cpu float32"}
            for name, planned_at in result["placement"].items()
        },
        "gpu_memory_peak_gib": _gpu_peak_gib() if on_planned_device else None,
        # this process's peak resident memory, the monolithic reference's included
        "host_peak_mb": _host_peak_mb() if on_planned_device else None,
    }
    if metered:
        (run,) = runs
        usage = result["usage"]
        summary["metered"] = usage
        summary["planned"] = planned.usage
        summary["bill"] = {
            "planned": planned.bill,
            "metered": price_usage(document, usage, run.get("seconds", 0.0)),
        }
        summary["metering"] = metering(
            usage, planned.usage, summary["bill"], summary["predicted_vs_measured"]
        )
    return summary


def _gpu_peak_gib() -> float | None:
    """The most GPU memory torch held at once in this process (None: no GPU here)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _host_peak_mb() -> float:
    """This process's peak resident memory, MB (Linux reports it in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1)


def _placements(document: Plan) -> dict[str, Placement]:
    """The plan's GPU-backed functions' placement by name (`ground.placement.GPU`), which the
    template synthesised without the plan's capacity does not carry."""
    from ground.placement import GPU

    traffic = document.traffic
    if traffic is None:
        return {}
    return {c.function: GPU for c in traffic.capacity if c.accelerator_memory_gib is not None}


def _gpu_backed(document: Plan) -> dict[str, Any] | None:
    """A GPU-backed plan's functions and pool (None: CPU functions only). Its handlers ran on
    this machine's CPU like any other, so its GPU timings and its pool's bill stay the GPU
    model's predictions (`planner.hardware.gpu_plan`); the per-batch bill above is Lambda's CPU
    pricing of the same requests."""
    traffic = document.traffic
    if traffic is None or not traffic.accelerated:
        return None
    return {
        "instance_type": traffic.managed_instance_type,
        "instances": traffic.managed_instances,
        "accelerator_gib": {
            c.function: c.accelerator_memory_gib
            for c in traffic.capacity
            if c.accelerator_memory_gib is not None
        },
        "predicted_request_s": document.totals.latency_s,
        "planned_bill": traffic.simulated,
    }


def metering(
    metered: dict[str, float],
    planned: dict[str, float],
    bill: dict[str, dict[str, float]],
    compared: dict[str, Any],
) -> dict[str, Any]:
    """What a metered local run's usage and bill say, against the plan's.

    The requests and transitions (`pipeline.meter.EXACT_KEYS`) must equal the plan's exactly.
    The GB-seconds are this machine's: every handler ran in-process on moto, the functions
    sharing this machine's cores, where the plan predicts each on Lambda at its own memory
    size; so the metered bill's duration items price this machine's seconds, and the measured
    over predicted seconds of each function (`compared`, `_predicted_vs_measured`) say where
    they differ.

    Returns:
        "requests_equal_planned", the requests that differ ("requests_differing"), the
        GB-seconds measured here and predicted for Lambda with their ratio, both bills' totals,
        the functions' ratios, and "lines": the sentences `run-local` prints.
    """
    from pipeline.meter import EXACT_KEYS

    differing = {
        key: {"metered": metered[key], "planned": planned[key]}
        for key in EXACT_KEYS
        if metered[key] != planned[key]
    }
    measured_gb_s, predicted_gb_s = float(metered["gb_s"]), float(planned["gb_s"])
    gb_ratio = measured_gb_s / predicted_gb_s if predicted_gb_s else None
    ratios = {
        name: entry["measured_over_predicted"]
        for name, entry in compared["functions"].items()
        if entry.get("measured_over_predicted") is not None
    }
    s3 = sum(int(metered[k]) for k in EXACT_KEYS if k.startswith("s3_"))
    if differing:
        requests = "requests metered != planned: " + ", ".join(
            f"{key} {v['metered']:g} against {v['planned']:g} planned"
            for key, v in differing.items()
        )
    else:
        requests = (
            f"requests metered = planned (exact): {int(metered['lambda_requests'])} Lambda "
            f"requests, {s3} S3 requests, {int(metered['transitions'])} state transitions"
        )
    polls = (metered["s3_get_poll"], planned["s3_get_poll"])
    if any(polls):
        requests += f"; S3 polls, which depend on timing: {polls[0]:g}, planned {polls[1]:g}"
    spread = (
        f" (from {min(ratios.values()):.2g} x to {max(ratios.values()):.2g} x per function)"
        if ratios
        else ""
    )
    seconds = (
        f"GB-seconds measured on this machine {measured_gb_s:.1f} against "
        f"{predicted_gb_s:.1f} predicted for Lambda"
        + ("" if gb_ratio is None else f" ({gb_ratio:.2f} x)")
        + ": every handler ran in-process on moto, sharing this machine's cores, not on "
        "Lambda at the plan's memory sizes, so these durations are this machine's, not "
        f"Lambda's; measured over predicted seconds per function in the table{spread}"
    )
    total = (
        f"bill at the plan's prices: ${bill['planned']['total_usd']:.6f} planned, "
        f"${bill['metered']['total_usd']:.6f} metered with this machine's seconds: the "
        "requests' share is exact, the duration's (GB-seconds, an Express workflow's "
        "duration) is not Lambda's"
    )
    return {
        "requests_equal_planned": not differing,
        "requests_differing": differing,
        "gb_s": {
            "measured_here": round(measured_gb_s, 3),
            "predicted_lambda": round(predicted_gb_s, 3),
            "measured_over_predicted": None if gb_ratio is None else round(gb_ratio, 3),
        },
        "bill_total_usd": {
            "planned": bill["planned"]["total_usd"],
            "metered_with_this_machines_seconds": bill["metered"]["total_usd"],
        },
        "measured_over_predicted_s": ratios,
        "lines": [requests, seconds, total],
    }


def _reference(model: Any, ids: np.ndarray, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """The monolithic forward's output and its routing counts (layers, experts) for the batch.

    In chunks of `CHUNK_WINDOWS` windows, which bounds the memory of a large batch.
    """
    import numpy as np
    import torch

    outputs, counts = [], []
    for start in range(0, ids.shape[0], CHUNK_WINDOWS):
        routing: list = []
        chunk = torch.from_numpy(ids[start : start + CHUNK_WINDOWS])
        outputs.append(model.forward(chunk, reference=True, routing=routing).numpy())
        counts.append(
            [np.bincount(r.experts.reshape(-1), minlength=experts + 1)[:experts] for r in routing]
        )
    return np.concatenate(outputs), np.sum(counts, axis=0)


def _driver_layers(records: Path, request_ids: set[str]) -> dict[str, Any] | None:
    """The driver's layers with remote experts in this run's requests, as measured against how
    the model prices a layer (`ground.driver.layer_seconds`: the longer of its local experts and
    its remote calls, which run at once) and against running the two one after the other; None
    without any."""
    import numpy as np

    from ground.driver import layer_seconds

    rows = [
        (r["local_s"], r["remote_s"], r["layer_s"])
        for line in (records.read_text(encoding="utf-8").splitlines() if records.exists() else [])
        if (r := json.loads(line)).get("kind") == "driver_layer" and r["request_id"] in request_ids
    ]
    if not rows:
        return None
    local, remote, measured = (np.array(column) for column in zip(*rows, strict=True))
    priced = float(np.sum(layer_seconds(local, remote)))
    return {
        "layers": len(rows),
        "measured_s": round(float(measured.sum()), 4),
        "priced_s": round(priced, 4),
        "sequential_s": round(float((local + remote).sum()), 4),
        "measured_over_priced": round(float(measured.sum()) / priced, 3) if priced else None,
    }


def _predicted_vs_measured(
    predicted: dict[str, float],
    latency_s: float,
    measured: dict[str, list[float]],
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    """Per function the cost model's time of one call against the mean measured call.

    The prediction is for a warm Lambda function at the plan's memory size; the measurement is
    this machine running every handler in-process on moto, concurrently. Their ratio
    ("measured_over_predicted", None where either is missing) is how much slower this machine
    ran each function than the plan expects Lambda to.
    """
    functions = {}
    for name in sorted(predicted.keys() | measured.keys()):
        calls = measured.get(name, [])
        mean = sum(calls) / len(calls) if calls else None
        expected = predicted.get(name)
        functions[name] = {
            "predicted_s": round(expected, 5) if expected is not None else None,
            "measured_s": round(mean, 5) if mean is not None else None,
            "measured_over_predicted": (
                round(mean / expected, 3) if mean is not None and expected else None
            ),
            "calls": len(calls),
        }
    durations = [r["seconds"] for r in runs if "seconds" in r]
    measured_s = max(durations) if durations else None
    return {
        "functions": functions,
        "request": {
            "predicted_s": round(latency_s, 4),
            "measured_s": round(measured_s, 4) if measured_s is not None else None,
            "measured_over_predicted": (
                round(measured_s / latency_s, 3) if measured_s is not None and latency_s else None
            ),
        },
    }
