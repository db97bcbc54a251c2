"""GPU backend commands: gpu-plan, run-gpu, compare, and `bench gpu`."""

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
        'gpu/data/catalogue.json or the file\'s own "types"). Default: --gpus of the '
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

    if out.exists() and not force:
        raise UsageError(f"'{out}' already exists.", "pick another --out or pass --force.")
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
    counts: Annotated[
        Path, typer.Option(help="Counts file from `moelambda predict --counts-out`.")
    ],
    slo: Annotated[float, typer.Option(help="Latency SLO of one request (batch), seconds.")],
    rps: Annotated[
        float, typer.Option(help="Requests (batches of the counts' tokens) per second.")
    ],
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
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Cost per million tokens on Lambda (cheapest plan of any shape, full bill; every shape
    listed) and on GPUs at a request rate, and the rate at which the GPUs break even."""
    from gpu.api import compare_serverless_gpu
    from planner import load_calibration
    from planner.api import counts_for_plan, serverless_best
    from predictor import PredictedCounts

    if rps <= 0 or slo <= 0:
        raise UsageError("--rps and --slo must be positive.", "pass e.g. --rps 1 --slo 30.")
    if confidence is not None and not 0 <= confidence < 1:
        raise UsageError(f"--confidence {confidence} is not in [0, 1).", "pass e.g. 0.99 or 0.")
    if plot is not None and plot.exists() and not force:
        raise UsageError(f"'{plot}' already exists.", "pick another --plot or pass --force.")
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
