"""A decoder's dollars per output token on Lambda, on GPUs and at a managed API's list price:
what `moelambda compare --slo-ttft/--slo-tpot` and `moelambda bench generate` report.

Each number has one home, read here, not re-derived: Lambda's bill per token is the plan's
(`planner.generation` through `planner.api.plan_deployment`), or over a stream the traffic
simulator's (`planner.traffic.api.plan_generation_traffic`: cold starts, refusals); the GPU's is
the GPU backend's per-token model (`gpu.generation`, its prices and speeds in
planner/data/gpu_catalogue.json); a GPU platform billed per second (Modal's L4 and L40S) is
`gpu.serverless`, simulated over the same arrivals; the continuously batching workers on
Lambda are `planner.stream.plan_stream`'s plan and simulation; the managed API's is the list
price in the calibration file (`planner.generation.managed_api_quote`, "no list price" where
it has none). Every block of `bench generate`'s JSON says in `basis` whether its numbers are
predicted (a model or a simulation) or a list price; none is measured here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import InfeasibleError, UsageError

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.api import PlanningCounts, PlanOptions
    from planner.calibration import Calibration

__all__ = [
    "BENCH_RATES",
    "GenerationModel",
    "bench_generate",
    "compare_generation",
    "shape_model",
]

# (requests per second, hours simulated): a day at one request a minute, an hour at one a
# second, a quarter of an hour at ten a second (about 1,240, 3,100 and 9,000 requests of the
# Azure conversation trace; the quarter hour keeps the workers' search to minutes).
BENCH_RATES = ((1 / 60, 24.0), (1.0, 1.0), (10.0, 0.25))

_PER_REQUEST = "predicted: simulated (planner.traffic.generation: one driver invocation a request)"
_WORKERS = "predicted: simulated (planner.traffic.workers: workers batching over a queue)"
_GPU_MODEL = "predicted: the GPU backend's model (gpu.generation), EC2 on-demand prices"


@dataclass(frozen=True, eq=False)
class GenerationModel:
    """A decoder to compare: its manifest, predicted counts and a label for reports."""

    name: str
    label: str
    manifest: Manifest
    counts: PlanningCounts


def shape_model(name: str, *, tokens: int = 10240) -> GenerationModel:
    """A built-in shape (`planner.shapes`) with Zipf(1) popularity, labelled synthetic."""
    from planner.api import shape_counts_for_plan

    counts = shape_counts_for_plan(name, "zipf:1.0", tokens=tokens)
    assert counts.manifest is not None
    return GenerationModel(name, counts.manifest.model, counts.manifest, counts)


def _gpu_kv_bytes(counts: PlanningCounts) -> float | None:
    """One token's keys and values in bf16 on GPUs: a shape's exact ones, else None (the
    GPU model's multi-head bound)."""
    from ground.precision import parse_weights
    from planner.shapes import load_shape

    shape = counts.source.get("shape")
    if shape is None:
        return None
    return load_shape(shape).kv_bytes_per_token(parse_weights("bf16"))


def compare_generation(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    rps: float,
    options: PlanOptions,
) -> dict[str, Any]:
    """A decoder's TTFT, TPOT and bill per million input and output tokens on Lambda (its
    generating plan, per request whatever the rate), on GPUs at `rps` requests per second
    (the cheapest deployment of the catalogue within the SLOs) and at a managed API's list
    price: the JSON of `moelambda compare --slo-ttft/--slo-tpot`.

    Example::

        planning = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=10240)
        options = PlanOptions(slo_ttft_s=300, slo_tpot_s=5, concurrency_quota=100_000)
        rows = compare_generation(planning.manifest, planning, load_calibration(), rps=1,
                                  options=options)["rows"]

    Raises:
        UsageError: A rate that is not positive, options that do not plan generation, or no
            GPU deployment within the SLOs.
        InfeasibleError: No Lambda plan meets the SLOs.
    """
    from gpu.cluster import load_catalogue
    from gpu.generation import gpu_generation
    from planner.api import plan_deployment
    from planner.generation import managed_api_quote

    if not rps > 0:
        raise UsageError(f"--rps {rps} is not positive.", "pass e.g. --rps 1.")
    if not options.generating:
        raise UsageError(
            "comparing generation needs its options.", "pass --slo-ttft and --slo-tpot."
        )
    planned = plan_deployment(manifest, counts, calibration, options=options)
    gen = planned.plan.generation
    assert gen is not None
    gpu = gpu_generation(
        counts.counts / counts.tokens,
        manifest,
        load_catalogue(),
        rps=rps,
        prompt_tokens=gen.prompt_tokens,
        new_tokens=gen.new_tokens,
        slo_ttft_s=options.slo_ttft_s,
        slo_tpot_s=options.slo_tpot_s,
        kv_bytes_per_token=_gpu_kv_bytes(counts),
    )
    quote = managed_api_quote(calibration, manifest.model)
    rows = [
        {
            "backend": "lambda",
            "deployment": f"{planned.summary['deployment']}, "
            f"{planned.plan.nonmoe_memory_mb:,} MB driver",
            "ttft_s": gen.ttft_s,
            "tpot_s": gen.tpot_s,
            "per_million_input_usd": gen.bill_per_million_input_usd,
            "per_million_output_usd": gen.bill_per_million_output_usd,
            "source": "the generating plan (planner.generation): per request at any rate, "
            "warm; `moelambda traffic` adds cold starts",
        },
        {
            "backend": "gpu",
            "deployment": f"{gpu.copies} x {gpu.gpus} {gpu.gpu_type}",
            "ttft_s": gpu.ttft_s,
            "tpot_s": gpu.tpot_s,
            "per_million_input_usd": gpu.per_million_input_usd,
            "per_million_output_usd": gpu.per_million_output_usd,
            "source": f"gpu.generation at {rps:g} requests/s; {gpu.source}",
        },
        {
            "backend": "managed api",
            "deployment": quote["model_id"] or "-",
            "ttft_s": None,
            "tpot_s": None,
            "per_million_input_usd": quote["per_million_input_usd"],
            "per_million_output_usd": quote["per_million_output_usd"],
            "source": f"{quote['provider']}: {quote['source']}"
            if quote["list_price"]
            else quote["source"],
        },
    ]
    return {
        "model": manifest.model,
        "rps": rps,
        "prompt_tokens": gen.prompt_tokens,
        "new_tokens": gen.new_tokens,
        "batch_sequences": gen.batch_sequences,
        "slo_ttft_s": options.slo_ttft_s,
        "slo_tpot_s": options.slo_tpot_s,
        "rows": rows,
        "gpu": gpu.as_dict(),
        "managed_api": quote,
    }


def _stream_run(
    model: GenerationModel,
    calibration: Calibration,
    options: PlanOptions,
    rate: float,
    hours: float,
    reserve: bool,
    workers: bool,
) -> dict[str, Any]:
    """One model at one rate: `plan --traffic azure-conv` (a generating plan for the stream,
    simulated), the workers' stream plan on CPU Lambda (`workers`), the GPU deployment at the
    same rate for the stream's mean request, and the per-second GPU platform over the same
    arrivals."""
    from gpu.cluster import load_catalogue
    from gpu.generation import gpu_generation, prefill_s
    from gpu.serverless import load_platform, serverless_generation
    from planner.traffic import load_arrivals
    from planner.traffic.api import plan_generation_traffic
    from planner.traffic.bench import scale_for

    scale = scale_for(rate)
    try:
        plan, summary = plan_generation_traffic(
            model.manifest,
            model.counts,
            calibration,
            traffic="azure-conv",
            options=options,
            scale=scale,
            hours=hours,
            reserve=reserve,
        )
    except InfeasibleError as err:  # the other platforms still price the stream
        plan, summary = None, {"error": str(err)}
    arrivals = load_arrivals("azure-conv", scale=scale, hours=hours)
    assert arrivals.generated is not None
    share = model.counts.counts / model.counts.tokens
    catalogue = load_catalogue()
    gpu = gpu_generation(
        share,
        model.manifest,
        catalogue,
        rps=arrivals.requests / arrivals.period_s,
        prompt_tokens=round(float(arrivals.tokens.mean())),
        new_tokens=round(float(arrivals.generated.mean())),
        slo_ttft_s=options.slo_ttft_s,
        slo_tpot_s=options.slo_tpot_s,
        kv_bytes_per_token=_gpu_kv_bytes(model.counts),
    )
    longest = int(np.quantile(arrivals.tokens, 0.99, method="inverted_cdf"))
    platform = serverless_generation(
        share,
        model.manifest,
        arrivals,
        catalogue,
        load_platform(),
        runtime_gib=calibration.gpu_runtime_gib or 1.0,
        kv_bytes_per_token=_gpu_kv_bytes(model.counts),
        slo_tpot_s=options.slo_tpot_s,
    )
    return {
        "rate_per_s": rate,
        "hours": hours,
        "requests": arrivals.requests,
        "planned_for": _planned_for(plan),
        "lambda": _per_request(summary),
        "worker_cpu": _worker_run(model, calibration, options, scale, hours)
        if workers
        else {"status": "skipped", "reason": "--no-workers"},
        "worker_gpu": {
            "status": "not built",
            "reason": "planner.stream plans workers on CPU functions only: GPU-backed Lambda "
            "refuses a decoder's generation (planner.options: --hardware gpu)",
        },
        "gpu": gpu.as_dict()
        | {
            "ttft_p99_s": prefill_s(share, model.manifest, catalogue, gpu, longest),
            "tpot_p99_s": gpu.tpot_s,
            "basis": _GPU_MODEL,
        },
        "gpu_serverless": platform,
    }


def _planned_for(plan: Plan | None) -> dict[str, Any] | None:
    """What the per-request plan was sized for (None: no plan)."""
    if plan is None:
        return None
    assert plan.generation is not None
    return {
        "prompt_tokens": plan.generation.prompt_tokens,
        "new_tokens": plan.generation.new_tokens,
        "deployment": plan.deployment,
        "driver_memory_mb": plan.nonmoe_memory_mb,
        "local_per_layer": len(plan.driver.local[0]) if plan.driver else None,
        "workflow": plan.workflow,
    }


def _per_request(summary: dict[str, Any]) -> dict[str, Any]:
    """The per-request driver's stream block, or why no plan generates the stream's p99
    request (e.g. past Lambda's 900 s)."""
    if "error" in summary:
        return {"status": "infeasible", "reason": summary["error"], "basis": _PER_REQUEST}
    stream = summary["traffic"]
    bill = stream["bill_usd"]
    return {
        "status": "planned",
        "ttft_p99_s": stream["ttft_s"]["p99"],
        "tpot_p99_s": stream["tpot_s"]["p99"],
        "e2e_p99_s": stream["e2e_s"]["p99"],
        "per_million_input_usd": bill["per_million_input_usd"],
        "per_million_output_usd": bill["per_million_output_usd"],
        "total_usd": bill["total_usd"],
        "served": stream["served"],
        "refused": stream["refused"],
        "refused_fraction": stream["refused_fraction"],
        "failed": stream["failed"],
        "cold_starts": stream["cold_starts"]["count"],
        "basis": _PER_REQUEST,
    }


def _worker_run(
    model: GenerationModel,
    calibration: Calibration,
    options: PlanOptions,
    scale: float,
    hours: float,
) -> dict[str, Any]:
    """The workers' stream plan on CPU Lambda for the same stream (`planner.stream`), or why
    there is none (no candidate meets the SLOs)."""
    from planner.stream import plan_stream

    try:
        plan, summary = plan_stream(
            model.manifest,
            model.counts,
            calibration,
            traffic="azure-conv",
            options=options,
            scale=scale,
            hours=hours,
        )
    except InfeasibleError as err:
        return {"status": "infeasible", "reason": str(err), "basis": _WORKERS}
    bill = summary["bill_usd"]
    return {
        "status": "planned",
        "deployment": plan.deployment,
        "memory_mb": plan.nonmoe_memory_mb,
        "slots": summary["stream"]["slots"],
        "workers": summary["stream"]["workers"],
        "idle_exit_s": summary["stream"]["idle_exit_s"],
        "step_source": summary["step_source"],
        "ttft_p99_s": summary["ttft_s"]["p99"],
        "tpot_p99_s": summary["tpot_s"]["p99"],
        "e2e_p99_s": summary["e2e_s"]["p99"],
        "per_million_input_usd": bill["per_million_input_usd"],
        "per_million_output_usd": bill["per_million_output_usd"],
        "total_usd": bill["total_usd"],
        "served": summary["served"],
        "refused": summary["refused"],
        "cold_starts": summary["cold_starts"],
        "peak_workers": summary["peak_workers"],
        "basis": _WORKERS,
    }


def bench_generate(
    models: list[GenerationModel],
    calibration: Calibration,
    *,
    options: PlanOptions,
    rates: tuple[tuple[float, float], ...] = BENCH_RATES,
    reserve: bool = False,
    workers: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """TTFT p99, TPOT p99 and dollars per million output tokens of each model on the Azure
    conversation trace at each (rate, hours), on Lambda (`plan --traffic azure-conv` with the
    generation options, simulated), on GPUs at the same rate, and at a managed API's list
    price: the JSON of `moelambda bench generate`.

    Args:
        models: The decoders (`shape_model`, or a measured model's manifest and counts).
        calibration: The calibration to plan with.
        options: The generation options (SLOs; the lengths default to the stream's p99).
        rates: (requests per second, hours simulated) pairs. Defaults to `BENCH_RATES`.
        reserve: Whether the stack reserves each expert's `max_replicas` of concurrency, as
            `synth` does by default. Defaults to False (`synth --no-reserve-concurrency`):
            the plan's reservations are sized for one request, not a stream.
        workers: Whether to plan the workers' stream (`planner.stream`; minutes at 10/s).
        progress: Called with a message per step.
    """
    from gpu.serverless import load_platform
    from planner.generation import managed_api_quote

    say = progress or (lambda _: None)
    started = time.perf_counter()
    rows = []
    for model in models:
        runs = []
        for rate, hours in rates:
            say(f"{model.name}: {rate:.4g} requests/s for {hours:g} h")
            runs.append(_stream_run(model, calibration, options, rate, hours, reserve, workers))
        quote = managed_api_quote(calibration, model.manifest.model)
        rows.append(
            {
                "model": model.name,
                "label": model.label,
                "counts": model.counts.source,
                "managed_api": quote | {"basis": "list price" if quote["list_price"] else "-"},
                "runs": runs,
            }
        )
    return {
        "trace": "azure-conv",
        "slo_ttft_s": options.slo_ttft_s,
        "slo_tpot_s": options.slo_tpot_s,
        "reserved_concurrency": reserve,
        "rates": [{"rate_per_s": r, "hours": h} for r, h in rates],
        "gpu_serverless_platform": load_platform().model_dump(),
        "models": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }
