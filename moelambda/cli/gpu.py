"""GPU backend commands: gpu-plan, run-gpu, compare, `bench gpu` and `bench generate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ground.errors import UsageError
from moelambda.cli import _render_gpu as render
from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    TracesOpt,
    app,
    bench_app,
    check_file_out,
    err,
    manifest_of_counts,
    manifest_of_trace,
    stdout,
    user_errors,
)

ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        help='Cluster JSON, e.g. {"gpus": [{"type": "a100", "count": 8}]} (types from '
        'planner/data/gpu_catalogue.json or the file\'s own "types"). Default: --gpus of the '
        "catalogue's default type."
    ),
]


@app.command("gpu-plan")
@user_errors
def gpu_plan(
    gpus: Annotated[int, typer.Option(help="GPUs (ranks) to plan for.")],
    traces: TracesOpt = Path("out/profile"),
    cluster: ClusterOpt = None,
    scheduler: Annotated[
        str,
        typer.Option(help="aurora (one expert per GPU), lina (popularity packing) or vanilla."),
    ] = "aurora",
    colocate: Annotated[
        Path | None,
        typer.Option(
            help="A second model's trace (same experts): Aurora colocates one expert of each "
            "model per GPU and reports the pairing and the two-model cycle time."
        ),
    ] = None,
    lina_batches: Annotated[
        int,
        typer.Option(
            min=1, help="Held-out batches Lina's phase-2 re-scheduling rate is measured on."
        ),
    ] = 20,
    out: Annotated[Path, typer.Option(help="GPU plan JSON to write.")] = Path("out/gpu-plan.json"),
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Place the experts of every MoE layer on GPUs and order its all-to-alls.

    The batch of the trace is split data-parallel over the GPUs (whole requests each); times come
    from FLOPs at the catalogue's GPU speeds and from the all-to-all order on the network (Aurora:
    contention-free rounds at Theorem 4.2's bound; rank order: fluid network simulation).
    """
    from gpu.api import check_gpu_plan, plan_deployment
    from predictor import RoutingTrace

    check_file_out(out, force, "--out")
    trace = RoutingTrace.load(traces)
    check_gpu_plan(trace, gpus=gpus, scheduler=scheduler, cluster=cluster)
    second = None if colocate is None else RoutingTrace.load(colocate)
    manifest = manifest_of_trace(trace)
    with err.status(f"planning {trace.num_layers} MoE layers on {gpus} GPUs ({scheduler})"):
        plan, summary = plan_deployment(
            trace,
            manifest,
            gpus=gpus,
            cluster=cluster,
            scheduler=scheduler,
            colocate=second,
            lina_batches=lina_batches,
        )
    plan.save(out, force=force)
    summary["plan"] = str(out)
    if as_json:
        print(json.dumps(summary))
        return
    render.gpu_plan(stdout(), summary)


@app.command("run-gpu")
@user_errors
def run_gpu(
    plan: Annotated[Path, typer.Option(help="GPU plan from `moelambda gpu-plan`.")],
    tokens: Annotated[int, typer.Option(help="Tokens of real text to run.")] = 1024,
    seed: Annotated[int, typer.Option(help="Seeds the choice of text windows.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run the plan for real: one process per planned GPU on torch.distributed (gloo on CPU,
    nccl on CUDA), tokens moved in the planned rounds and by all_to_all_single as a baseline,
    the output compared with the monolithic model."""
    from gpu.plan import GpuPlan
    from gpu.run import run_plan

    if tokens < 1:
        raise UsageError(f"--tokens {tokens} is not positive.", "pass --tokens 1 or more.")
    document = GpuPlan.load(plan)
    with err.status(f"running {tokens:,} tokens on {document.gpus} ranks"):
        result = run_plan(document, tokens=tokens, seed=seed)
    if as_json:
        print(json.dumps(result))
    else:
        render.run_gpu(stdout(), result)
    if result["status"] != "SUCCEEDED":
        raise typer.Exit(1)


@app.command("compare")
@user_errors
def compare(
    rps: Annotated[
        float, typer.Option(help="Requests (batches of the counts' tokens) per second.")
    ],
    counts: Annotated[
        Path | None, typer.Option(help="Counts file from `moelambda predict --counts-out`.")
    ] = None,
    slo: Annotated[
        float | None, typer.Option(help="Latency SLO of one request (batch), seconds.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="PNG of cost per million tokens against the rate.")
    ] = None,
    confidence: Annotated[
        float | None,
        typer.Option(
            help="Plan Lambda to meet the SLO with this probability under the counts' "
            "distribution (default 0.99 when the file has one, else 0), as `plan` does."
        ),
    ] = None,
    shape: Annotated[
        str | None,
        typer.Option(
            help="With --slo-ttft/--slo-tpot: a decoder known by its architecture alone (a "
            "built-in shape: olmoe, mixtral, qwen-moe, deepseek-v2-lite), Zipf(1) popularity."
        ),
    ] = None,
    slo_ttft: Annotated[
        float | None,
        typer.Option(
            help="Compare a decoder's generation: time to first token, seconds (as `plan "
            "--slo-ttft`); reports dollars per million output tokens on Lambda, on GPUs and at "
            "a managed API's list price."
        ),
    ] = None,
    slo_tpot: Annotated[
        float | None, typer.Option(help="Generation: time per output token, seconds.")
    ] = None,
    prompt_tokens: Annotated[
        int | None, typer.Option(help="Generation: prompt tokens per request (default 1,020).")
    ] = None,
    new_tokens: Annotated[
        int | None, typer.Option(help="Generation: tokens generated per request (default 129).")
    ] = None,
    concurrency_quota: Annotated[
        int,
        typer.Option(help="Generation: the account's Lambda concurrency quota, as `plan`'s."),
    ] = 1000,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Cost per million tokens on Lambda (cheapest plan of any shape, full bill; every shape
    listed) and on GPUs at a request rate, and the rate at which the GPUs break even.

    With --slo-ttft/--slo-tpot (a decoder, from --counts or --shape): dollars per million input
    and output tokens of its generating Lambda plan, of the cheapest GPU deployment at the rate
    (continuous batching), and of a managed API's list price where the calibration has one.
    """
    if any(v is not None for v in (slo_ttft, slo_tpot, prompt_tokens, new_tokens)):
        _compare_generation(
            rps,
            counts,
            shape,
            slo_ttft,
            slo_tpot,
            prompt_tokens,
            new_tokens,
            concurrency_quota,
            refused={"--slo": slo, "--plot": plot, "--confidence": confidence},
            as_json=as_json,
        )
        return
    from gpu.api import compare_serverless_gpu
    from planner import load_calibration
    from planner.api import counts_for_plan, serverless_best
    from predictor import PredictedCounts

    if counts is None or slo is None or shape is not None:
        raise UsageError(
            "comparing a batch needs --counts and --slo (--shape plans a decoder's generation).",
            "pass --counts FILE --slo SECONDS, or --slo-ttft/--slo-tpot for a decoder.",
        )
    if rps <= 0 or slo <= 0:
        raise UsageError("--rps and --slo must be positive.", "pass e.g. --rps 1 --slo 30.")
    if confidence is not None and not 0 <= confidence < 1:
        raise UsageError(f"--confidence {confidence} is not in [0, 1).", "pass e.g. 0.99 or 0.")
    check_file_out(plot, force, "--plot")
    doc = PredictedCounts.load(counts)
    predicted = doc.array()
    with err.status("the cheapest Lambda plan"):
        planning = counts_for_plan(counts=counts, tokens=doc.tokens)
        manifest = manifest_of_counts(planning)
        best = serverless_best(manifest, planning, load_calibration(None), slo, confidence)
    totals, tokens = best.plan.totals, doc.tokens
    comparison = compare_serverless_gpu(
        predicted,
        manifest,
        lambda_cost_usd=totals.bill_usd["total_usd"],
        lambda_latency_s=totals.latency_s,
        tokens=tokens,
        slo_s=slo,
        rps=rps,
        lambda_deployment=best.summary["deployment"],
        lambda_candidates=best.summary["candidates"],
    )
    summary = comparison.summary
    if plot is not None:
        summary["plot"] = comparison.plot(plot, force=force)
    if as_json:
        print(json.dumps(summary))
        return
    render.compare(stdout(), summary)


def _compare_generation(
    rps: float,
    counts: Path | None,
    shape: str | None,
    slo_ttft: float | None,
    slo_tpot: float | None,
    prompt_tokens: int | None,
    new_tokens: int | None,
    concurrency_quota: int,
    *,
    refused: dict[str, object],
    as_json: bool,
) -> None:
    """`moelambda compare --slo-ttft/--slo-tpot`: `gpu.generation_compare.compare_generation`."""
    from gpu.generation_compare import compare_generation
    from planner import load_calibration
    from planner.api import PlanOptions, counts_for_plan, shape_counts_for_plan

    given = [flag for flag, value in refused.items() if value is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)} belong to a batch comparison, not a decoder's generation.",
            f"drop {', '.join(given)}.",
        )
    if (counts is None) == (shape is None):
        raise UsageError(
            "a decoder to compare comes from --counts or --shape, one of them.",
            "pass --counts FILE (a measured decoder) or --shape NAME.",
        )
    tokens = 10240  # the sample the routing shares are read from, as `plan` reads it
    if shape is not None:
        planning = shape_counts_for_plan(shape, "zipf:1.0", tokens=tokens)
    else:
        planning = counts_for_plan(counts=counts, tokens=tokens)
    manifest = planning.manifest or manifest_of_counts(planning)
    options = PlanOptions(
        concurrency_quota=concurrency_quota,
        slo_ttft_s=slo_ttft,
        slo_tpot_s=slo_tpot,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        confidence=0.0,
    )
    with err.status("Lambda, GPUs and the managed API"):
        summary = compare_generation(
            manifest, planning, load_calibration(None), rps=rps, options=options
        )
    if as_json:
        print(json.dumps(summary))
        return
    render.compare_generation(stdout(), summary)


@bench_app.command("gpu")
@user_errors
def bench_gpu(
    traces: Annotated[
        Path | None, typer.Option(help="A 16-expert trace for the traffic (default: profile).")
    ] = None,
    samples: Annotated[int, typer.Option(help="Random matrices for the BvN check.")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """Aurora's checks: BvN makespan = Theorem 4.2's bound on random matrices; the colocation
    heuristic against brute force; SJF, RCS, rank order and Aurora on one real layer's traffic."""
    from gpu.api import bench_aurora
    from moelambda.cli.model import bench_trace

    trace = bench_trace(traces, experts=16)
    manifest = manifest_of_trace(trace)
    with err.status("Aurora's checks") as status:
        summary = bench_aurora(trace, manifest, samples=samples, progress=status.update)
    if as_json:
        print(json.dumps(summary))
        return
    render.bench_gpu(stdout(), summary)


@bench_app.command("generate")
@user_errors
def bench_generate(
    models: Annotated[
        str,
        typer.Option(
            help="Comma-separated: smollm2 (a MoEfied SmolLM2, from --smollm2-counts), and "
            "built-in shapes (olmoe, mixtral, gpt-oss-20b, qwen3-30b-a3b, qwen-moe, "
            "deepseek-v2-lite; Zipf(1) popularity)."
        ),
    ] = "smollm2,olmoe,mixtral,gpt-oss-20b,qwen3-30b-a3b",
    smollm2_counts: Annotated[
        Path | None,
        typer.Option(
            help="Counts of a MoEfied SmolLM2 (`moelambda predict --counts-out` on a `profile "
            "--model smollm2` trace): SmolLM2 has no built-in shape."
        ),
    ] = None,
    slo_ttft: Annotated[
        float, typer.Option(help="Time to first token SLO of every plan, seconds.")
    ] = 300.0,
    slo_tpot: Annotated[float, typer.Option(help="Time per output token SLO, seconds.")] = 5.0,
    concurrency_quota: Annotated[
        int, typer.Option(help="The account's Lambda concurrency quota the plans must fit.")
    ] = 100_000,
    workers: Annotated[
        bool,
        typer.Option(
            help="Plan the continuously batching workers on Lambda for each stream "
            "(planner.stream: minutes at 10/s); --no-workers leaves them out."
        ),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """TTFT p99, TPOT p99 and dollars per million output tokens on the Azure conversation
    trace at one request a minute (a day), one a second (an hour) and ten a second (a quarter
    hour), per model: on Lambda, a driver per request (`plan --traffic azure-conv --slo-ttft
    --slo-tpot`, simulated with cold starts; expert functions without reserved concurrency)
    and workers batching over a queue (planner.stream, simulated); on GPU instances at the
    same rate; on a GPU platform billed per second (Modal's L4 and L40S list prices, the same
    arrivals simulated); and at a managed API's list price. Every number is predicted
    (simulated or modelled) or a list price: `basis` says which."""
    from gpu.generation_compare import GenerationModel, bench_generate, shape_model
    from planner import load_calibration
    from planner.api import PlanOptions, counts_for_plan

    names = [m.strip() for m in models.split(",") if m.strip()]
    if "smollm2" in names and smollm2_counts is None:
        raise UsageError(
            "smollm2 has no built-in shape: its counts come from a MoEfied model.",
            "pass --smollm2-counts FILE (`moelambda profile --model smollm2 --experts 8 "
            "--top-k 4 --correction`, then `moelambda predict --counts-out FILE`), or drop "
            "smollm2 from --models.",
        )
    entries = []
    with err.status("bench generate") as status:
        for name in names:
            status.update(f"{name}: its counts")
            if name == "smollm2":
                planning = counts_for_plan(counts=smollm2_counts, tokens=10240)
                manifest = manifest_of_counts(planning)
                label = f"SmolLM2-135M (E{manifest.experts} k{manifest.top_k})"
                entries.append(GenerationModel(name, label, manifest, planning))
            else:
                entries.append(shape_model(name))
        options = PlanOptions(
            concurrency_quota=concurrency_quota,
            slo_ttft_s=slo_ttft,
            slo_tpot_s=slo_tpot,
            confidence=0.0,
        )
        report = bench_generate(
            entries,
            load_calibration(None),
            options=options,
            workers=workers,
            progress=status.update,
        )
    if as_json:
        print(json.dumps(report))
        return
    render.bench_generate(stdout(), report)


@bench_app.command("gpu-lambda")
@user_errors
def bench_gpu_lambda(
    models: Annotated[
        str, typer.Option(help="Comma-separated built-in shapes (Zipf(1) popularity).")
    ] = "mixtral,olmoe",
    slo_p99: Annotated[float, typer.Option(help="p99 latency SLO per request, seconds.")] = 30.0,
    prompt_tokens: Annotated[int, typer.Option(help="Tokens of every request's prompt.")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """CPU-only, GPU-only and mixed Lambda plans on the Azure conversation trace at one request
    a minute, one a second and ten a second, each the cheapest meeting the p99 SLO, with its
    bill per million prompt tokens beside the managed API's list price (GPU timings predicted
    by the GPU backend's model)."""
    from planner.hardware.gpu_bench import bench_gpu_lambda as bench

    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise UsageError("--models is empty.", "pass e.g. --models mixtral,olmoe.")
    if not slo_p99 > 0 or prompt_tokens < 1:
        raise UsageError(
            "--slo-p99 and --prompt-tokens must be positive.", "pass e.g. --slo-p99 30."
        )
    with err.status("GPU-backed Lambda against CPU functions") as status:
        report = bench(names, slo_s=slo_p99, prompt_tokens=prompt_tokens, progress=status.update)
    if as_json:
        print(json.dumps(report))
        return
    render.bench_gpu_lambda(stdout(), report)
