"""Commands on planning: the cheapest deployment meeting an SLO, and the planner benchmark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from moelambda.cli import _render
from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    app,
    bench_app,
    check_file_out,
    check_positive,
    err,
    manifest_of_counts,
    stdout,
    user_errors,
)
from moelambda.cli.traffic import plan_stream, stream_request

DEFAULT_TOKENS = 10240


@app.command()
@user_errors
def plan(
    out: Annotated[Path, typer.Option(help="Plan JSON to write.")] = Path("out/plan.json"),
    traces: Annotated[
        Path | None,
        typer.Option(
            help="Trace directory: counts from the default predictor on a held-out batch."
        ),
    ] = None,
    counts: Annotated[
        Path | None, typer.Option(help="Counts file from `moelambda predict --counts-out`.")
    ] = None,
    shape: Annotated[
        str | None,
        typer.Option(
            help="Plan a model by its architecture alone, without weights: a built-in shape "
            "(olmoe, mixtral, qwen-moe, deepseek-v2-lite) or a Hugging Face config.json."
        ),
    ] = None,
    popularity: Annotated[
        str,
        typer.Option(
            help="With --shape: expert popularity, 'uniform', 'zipf:S' or 'trace' (mapped from "
            "the --traces of a smaller model). Labelled synthetic in the plan."
        ),
    ] = "zipf:1.0",
    weights: Annotated[
        str | None,
        typer.Option(
            help="With --shape: the precision of the served weights, which sizes every stage, "
            "the hidden states on the wire and the compute: fp32, bf16 (GPU-backed functions; "
            "CPU Lambda is not known to compute it), int8 (CPU functions: weight-only, one "
            "scale per output channel), or per stage kind, e.g. stack=bf16,experts=int8. "
            "Default: the shape's published precision (bf16 for the built-ins). A measured "
            "model's precision is the one it was profiled at."
        ),
    ] = None,
    tokens: Annotated[
        int | None,
        typer.Option(
            help="Tokens per batch to plan for (default 10,240); not with --traffic, whose "
            "batching decides the batch size."
        ),
    ] = None,
    slo: Annotated[float | None, typer.Option(help="Latency SLO of one batch, seconds.")] = None,
    throughput: Annotated[
        float | None, typer.Option(help="Required tokens/s instead of --slo (SLO = tokens/it).")
    ] = None,
    solver: Annotated[str, typer.Option(help="exact (default), ods or milp.")] = "exact",
    method: Annotated[
        str | None, typer.Option(help="Force one method on every layer: pipelined, s3, direct.")
    ] = None,
    arch: Annotated[str, typer.Option(help="Lambda architecture: x86_64 or arm64.")] = "x86_64",
    calibration: Annotated[
        Path | None, typer.Option(help="Calibration JSON (default: the packaged one).")
    ] = None,
    pareto: Annotated[
        Path | None, typer.Option(help="Also write the cost-vs-SLO curve: CSV here, PNG beside.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the held-out batch drawn from --traces.")] = 0,
    workflow: Annotated[
        str | None,
        typer.Option(
            help="Step Functions type: express (synchronous, up to 5 minutes) or standard. "
            "Default: express when the plan's latency fits, else standard."
        ),
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            help="full: minimise the whole bill (Lambda, S3 requests, workflow); experts: the "
            "paper's objective, the expert functions alone."
        ),
    ] = "full",
    confidence: Annotated[
        float | None,
        typer.Option(
            help="Plan to meet the SLO (and fit every expert's real tokens) with this "
            "probability under the counts' predictive distribution; 0 plans for the predicted "
            "counts alone. Default: 0.99 when the counts file has a distribution, else 0."
        ),
    ] = None,
    pack: Annotated[
        str,
        typer.Option(
            help="Experts per function: 'auto' plans every number that divides the layer's "
            "experts (groups balanced by predicted tokens) and keeps the cheapest, 1 gives "
            "each expert its own function, K packs K experts of a layer into each."
        ),
    ] = "auto",
    concurrency_quota: Annotated[
        int,
        typer.Option(
            help="The account's Lambda concurrency quota: refuse a plan whose reserved "
            "concurrency (every expert's max_replicas) would not leave Lambda's unreserved "
            "minimum of it."
        ),
    ] = 1000,
    deployment: Annotated[
        str,
        typer.Option(
            help="Deployment shape: auto plans one function holding the whole model "
            "(monolithic), a driver running the non-MoE stack and its local experts and "
            "invoking the rest (driver), and the fan-out Step Functions workflow (workflow), "
            "lists them all and deploys the cheapest that meets the SLO. With --traffic, "
            "another than auto needs --hardware cpu (GPU-backed candidates have shapes of "
            "their own)."
        ),
    ] = "auto",
    hardware: Annotated[
        str,
        typer.Option(
            help="Where functions run: cpu (Lambda's CPU functions only), gpu (GPU-backed "
            "functions on Lambda Managed Instances with accelerators: a GPU function holding "
            "the model, or a GPU driver with CPU experts, gpu+cpu), or auto (both, side by "
            "side; the cheapest one meeting --slo-p99 that can run is written). A GPU pool is "
            "billed by the hour, so GPU candidates are planned with --traffic. GPU expert groups "
            "and layer stages are priced and reported, not chosen: they have no handler yet."
        ),
    ] = "auto",
    traffic: Annotated[
        str | None,
        typer.Option(
            help="Plan for a request stream (a CSV, azure-conv, poisson:RATE, "
            "diurnal:PEAK,TROUGH): choose the batch and capacity policies too, under --slo-p99; "
            "with --slo-ttft/--slo-tpot, a decoder's generation for the stream's p99 prompt and "
            "generation lengths, then simulated over it."
        ),
    ] = None,
    slo_p99: Annotated[
        float | None, typer.Option(help="With --traffic: p99 latency per request, seconds.")
    ] = None,
    scale: Annotated[float, typer.Option(help="With --traffic: multiply the arrival rate.")] = 1.0,
    hours: Annotated[
        float | None, typer.Option(help="With --traffic: hours of traffic to plan on.")
    ] = None,
    minutes: Annotated[
        float | None, typer.Option(help="With --traffic: or minutes of traffic to plan on.")
    ] = None,
    idle_s: Annotated[
        float | None, typer.Option(help="With --traffic: idle seconds before reclaim.")
    ] = None,
    slo_ttft: Annotated[
        float | None,
        typer.Option(
            help="Plan a decoder's generation: time to first token (the prompts' prefill), "
            "seconds. Any generation option plans a driver or one function for --batch-"
            "sequences x --prompt-tokens prompts generating --new-tokens each; --tokens then "
            "only sizes the sample the routing shares are read from."
        ),
    ] = None,
    slo_tpot: Annotated[
        float | None, typer.Option(help="Generation: time per output token, seconds.")
    ] = None,
    batch_sequences: Annotated[
        int | None,
        typer.Option(help="Generation: sequences decoded together (default 1)."),
    ] = None,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(
            help="Generation: prompt tokens per sequence (default 1,020, the Azure "
            "conversation trace's median)."
        ),
    ] = None,
    new_tokens: Annotated[
        int | None,
        typer.Option(
            help="Generation: tokens generated per sequence (default 129, the trace's median)."
        ),
    ] = None,
    per_request: Annotated[
        bool,
        typer.Option(
            "--per-request",
            help="With --traffic and --slo-ttft/--slo-tpot: serve each request in its own "
            "driver invocation (one sequence), as before workers existed, instead of "
            "continuously batching workers over a queue.",
        ),
    ] = False,
    slots: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --traffic and --slo-ttft/--slo-tpot: the workers' slots (sequences "
            "batched at once), instead of the cheapest of 1 to 32; memory, workers and idle "
            "exit are still searched.",
        ),
    ] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Plan the cheapest deployment that meets the SLO (no SLO: the cheapest plan).

    Weighs one function holding the whole model, a driver with local and remote experts, and
    the fan-out workflow (per MoE layer a scatter-gather method and pipeline degree, per expert
    a Lambda memory size and replica count), for a batch of --tokens tokens with the predicted
    expert popularity, and writes the cheapest that meets the SLO. With --slo-ttft/--slo-tpot
    (a decoder), plans a generating driver or one function instead and reports the time to
    first token, per output token and the bill per million input and output tokens.
    """
    from ground.errors import UsageError
    from ground.precision import parse_weights
    from planner import load_calibration
    from planner.api import (
        PlanOptions,
        check_plan_command,
        counts_for_plan,
        plan_confidence,
        shape_counts_for_plan,
    )

    if weights is not None and shape is None:
        raise UsageError(
            "--weights sets the precision of a model planned by its --shape; a measured "
            "model's is the one its traces were profiled at.",
            "drop --weights, or profile the model at that precision (`moelambda profile "
            "--weights SPEC`) and plan its traces.",
        )
    precision = None if weights is None else parse_weights(weights)

    options = PlanOptions(
        solver=solver,
        method=method,
        arch=arch,
        workflow=workflow,
        objective=objective,
        confidence=confidence,
        pack=pack,
        concurrency_quota=concurrency_quota,
        deployment=deployment,
        slo_ttft_s=slo_ttft,
        slo_tpot_s=slo_tpot,
        batch_sequences=batch_sequences,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
    )
    slo_s = check_plan_command(
        options,
        tokens=tokens,
        default_tokens=DEFAULT_TOKENS,
        hardware=hardware,
        traffic=traffic,
        slo_s=slo,
        throughput=throughput,
        slo_p99_s=slo_p99,
        stream_flags={
            "--hours": hours is not None,
            "--minutes": minutes is not None,
            "--idle-s": idle_s is not None,
            "--scale": scale != 1.0,
        },
    )
    check_positive(
        ("--slo-p99", slo_p99),
        ("--slo-ttft", slo_ttft),
        ("--slo-tpot", slo_tpot),
        ("--batch-sequences", batch_sequences),
        ("--prompt-tokens", prompt_tokens),
        ("--new-tokens", new_tokens),
    )
    check_file_out(out, force, "--out")
    check_file_out(pareto, force, "--pareto")
    check_file_out(None if pareto is None else pareto.with_suffix(".png"), force, "--pareto")
    stream = None
    if traffic is not None:  # the stream, read and bounded before the model loads
        stream = stream_request(traffic, scale, hours, minutes, seed, idle_s, slo_p99, options)
    cal = load_calibration(calibration)
    batch = DEFAULT_TOKENS if tokens is None else tokens
    if shape is not None:
        planning = shape_counts_for_plan(
            shape,
            popularity,
            traces=traces,
            counts=counts,
            tokens=batch,
            seed=seed,
            weights=precision,
        )
    else:
        planning = counts_for_plan(traces=traces, counts=counts, tokens=batch, seed=seed)
    plan_confidence(confidence, planning)
    manifest = planning.manifest or manifest_of_counts(planning)
    files = {"out": out, "force": force, "as_json": as_json}
    if slots is not None and (stream is None or not options.generating or per_request):
        raise UsageError(
            "--slots sets the stream workers' batch, and this plan has no workers.",
            "pass it with --traffic, --slo-ttft and --slo-tpot (and without --per-request).",
        )
    if stream is not None and options.generating and not per_request:
        _plan_workers(manifest, planning, cal, options, stream=stream, slots=slots, **files)
        return
    if stream is not None:
        plan_stream(manifest, planning, cal, options, hardware=hardware, **files, **stream)
        return
    _plan_batch(manifest, planning, cal, options, slo_s=slo_s, pareto=pareto, **files)


def _plan_workers(
    manifest: Any,
    planning: Any,
    cal: Any,
    options: Any,
    *,
    stream: dict[str, Any],
    slots: int | None,
    out: Path,
    force: bool,
    as_json: bool,
) -> None:
    """`moelambda plan --traffic --slo-ttft --slo-tpot`: continuously batching workers for the
    stream (`planner.stream.plan_stream`; `--slots` pins theirs), saved and rendered."""
    from moelambda.cli import _render_traffic
    from planner.stream import StreamOptions
    from planner.stream import plan_stream as plan_workers

    made, summary = plan_workers(
        manifest,
        planning,
        cal,
        traffic=stream["traffic"],
        options=options,
        scale=stream["scale"],
        hours=stream["hours"],
        seed=stream["seed"],
        stream=None if slots is None else StreamOptions(slots=(slots,)),
        status=err.status,
    )
    made.save(out, force=force)
    summary = {"plan": str(out), **summary}
    if as_json:
        print(json.dumps(summary))
        return
    _render_traffic.stream_plan(stdout(), summary)


def _plan_batch(
    manifest: Any,
    planning: Any,
    cal: Any,
    options: Any,
    *,
    slo_s: float | None,
    pareto: Path | None,
    out: Path,
    force: bool,
    as_json: bool,
) -> None:
    """`moelambda plan` for one batch: every shape weighed, the cheapest saved and rendered."""
    from planner.api import plan_deployment, write_pareto

    with err.status("planning") as status:
        planned = plan_deployment(
            manifest,
            planning,
            cal,
            slo_s=slo_s,
            whole_curve=pareto is not None,
            options=options,
            progress=status.update,
        )
    planned.plan.save(out, force=force)
    summary: dict[str, Any] = {"plan": str(out), **planned.summary}
    if pareto is not None:
        summary["pareto"] = write_pareto(pareto, planned, force=force)
    if as_json:
        print(json.dumps(summary))
        return
    _render.plan(stdout(), summary)


@bench_app.command("planner")
@user_errors
def bench_planner(
    traces: Annotated[
        Path | None, typer.Option(help="A 16-expert trace for the popularity (default: profile).")
    ] = None,
    tokens: Annotated[int, typer.Option(help="Tokens per batch.")] = 10240,
    time_limit: Annotated[float, typer.Option(help="Seconds per MILP solve.")] = 60.0,
    layers: Annotated[
        int, typer.Option(min=1, max=12, help="MoE layers (12: the paper's scale; fewer: quick).")
    ] = 12,
    shape: Annotated[
        str | None,
        typer.Option(
            help="Bench a real-scale model shape instead (olmoe, mixtral, qwen-moe, "
            "deepseek-v2-lite, or a config.json), with the exact solver only."
        ),
    ] = None,
    popularity: Annotated[
        str, typer.Option(help="With --shape: uniform or zipf:S (synthetic).")
    ] = "zipf:1.0",
    as_json: JsonOpt = False,
) -> None:
    """Solve a paper-scale instance at a loose, a medium and a tight SLO with every solver.

    Targets: the exact solver <= 0.25 s for all three SLOs together, each solved from scratch,
    >= 20x faster than ODS in the same run, never costlier than ODS, and equal to the MILP
    wherever the MILP proves optimality. Paper: ODS 2.27 s. With --shape: the exact solver
    alone (ODS and the MILP take minutes at that size), target <= 5 s for the three SLOs.
    """
    from moelambda.cli.model import bench_trace
    from planner.bench import bench_planner as run_bench
    from planner.bench import paper_instance, shape_instance

    if shape is not None:
        inst, facts = shape_instance(shape, popularity, tokens)
    else:
        inst, facts = paper_instance(bench_trace(traces, experts=16), tokens, layers)
    summary = run_bench(
        inst, facts, time_limit_s=time_limit, exact_only=shape is not None, status=err.status
    )
    if as_json:
        print(json.dumps(summary))
    else:
        _render.bench_planner(stdout(), summary)


@bench_app.command("shapes")
@user_errors
def bench_shapes(
    models: Annotated[
        str,
        typer.Option(
            help="Comma-separated: minilm (the demo's option), smollm2 (both MoEfied, their "
            "real routing), olmoe, qwen-moe, mixtral (shapes, Zipf popularity)."
        ),
    ] = "minilm,smollm2,olmoe,qwen-moe,mixtral",
    plot: Annotated[
        Path | None, typer.Option(help="PNG of the bill against the model's size.")
    ] = Path("out/shapes.png"),
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Every deployment shape (one function, a driver, the workflow) of every model: the bill
    and latency of a 10,240-token batch, and a day at one request a minute on the Azure
    conversation trace; which shape wins for which model."""
    from planner.shape_bench import bench_shapes as run_bench
    from planner.shape_bench import plot_shapes

    names = [m.strip() for m in models.split(",") if m.strip()]
    check_file_out(plot, force, "--plot")
    with err.status("bench shapes") as status:
        report = run_bench(names, progress=status.update)
    if plot is not None:
        report["plot"] = plot_shapes(plot, report, force=force)
    if as_json:
        print(json.dumps(report))
        return
    _render.bench_shapes(stdout(), report)
