"""Commands on traffic: simulate a plan over a request stream, and its benchmark.

`moelambda traffic` replays a traffic spec through a plan (`planner.traffic.simulate_plan`);
`moelambda calibrate --cold` (`calibrate_cold` here) measures the handlers' INIT
(`runtime.coldstart.calibrate_cold`); `moelambda plan --traffic` (`plan_stream` here)
plans for a stream (`planner.traffic.api.plan_traffic`; a decoder's generation,
`planner.traffic.api.plan_generation_traffic`); `moelambda bench
traffic` compares the steady-state plan with the traffic-aware one
(`planner.traffic.api.bench_traffic`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from moelambda.cli import _render_traffic as render
from moelambda.cli._app import (
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

TrafficOpt = Annotated[
    str,
    typer.Option(
        help="The request stream: a CSV of timestamps and tokens (the Azure trace's format), "
        "'azure-conv' (the shipped Azure conversation trace), 'poisson:RATE' or "
        "'diurnal:PEAK,TROUGH' (requests per second)."
    ),
]
ScaleOpt = Annotated[
    float,
    typer.Option(help="Multiply the arrival rate (0.01: the same pattern 100 times sparser)."),
]
HoursOpt = Annotated[
    float | None,
    typer.Option(help="Hours to simulate (a trace repeats to fill them). Default: the trace's."),
]
MinutesOpt = Annotated[
    float | None, typer.Option(help="Or the period in minutes (as run-local --traffic takes it).")
]
SeedOpt = Annotated[int, typer.Option(help="Seeds synthetic arrivals.")]


def calibrate_cold(source: Path, target: Path, repeats: int, as_json: bool) -> None:
    """`moelambda calibrate --cold`: `runtime.coldstart.calibrate_cold`, rendered."""
    from runtime.coldstart import calibrate_cold as measure

    summary = measure(source, target, repeats, status=err.status)
    busy = summary["background_cpus"]
    if busy is not None and busy > 0.25:
        err.print(
            f"[yellow]warning:[/] other processes kept {busy:.2f} CPUs busy while measuring; "
            "imports and loads are likely slower than on an idle machine.",
            highlight=False,
        )
    if as_json:
        print(json.dumps(summary))
    else:
        render.calibrate_cold(stdout(), summary)


@app.command()
@user_errors
def traffic(
    plan: Annotated[Path, typer.Option(help="Plan JSON from `moelambda plan`.")] = Path(
        "out/plan.json"
    ),
    traffic: TrafficOpt = "azure-conv",
    scale: ScaleOpt = 1.0,
    hours: HoursOpt = None,
    minutes: MinutesOpt = None,
    seed: SeedOpt = 0,
    slo: Annotated[
        float | None,
        typer.Option(help="Latency SLO per request, s. Default: the plan's p99 SLO, else its."),
    ] = None,
    idle_s: Annotated[
        float | None,
        typer.Option(help="Idle seconds before an environment is reclaimed (an assumption)."),
    ] = None,
    max_batch_tokens: Annotated[
        int | None, typer.Option(help="Override the front door's most tokens per batch.")
    ] = None,
    max_wait: Annotated[
        float | None, typer.Option(help="Override the front door's longest wait, s.")
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="Calibration for traffic parameters the plan lacks (default: packaged)."
        ),
    ] = None,
    reserve_concurrency: Annotated[
        bool,
        typer.Option(
            help="Simulate the stack as `synth` emits it: each expert function reserving its "
            "max_replicas of concurrency (--no-reserve-concurrency: as synth's option)."
        ),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a plan over a request stream: batching, cold starts, latency and the bill.

    Every execution environment of every function is simulated (busy, idle, reclaimed after the
    idle time; provisioned and warmed ones as the plan's capacity policy says); each batch's
    workflow is the plan's cost model at the batch's size. A plan made without --traffic runs
    one execution per arriving request with no capacity policy. A generating plan (--slo-ttft/
    --slo-tpot) serves each request's prefill and decode steps in one driver invocation and
    reports TTFT, TPOT and the bill per million input and output tokens.
    """
    from ground.plan import Plan
    from planner.traffic import load_arrivals, period_hours, simulate_plan

    check_positive(("--slo", slo))
    document = Plan.load(plan)
    arrivals = load_arrivals(traffic, scale=scale, hours=period_hours(hours, minutes), seed=seed)
    cal = None
    if calibration is not None:
        from planner import load_calibration

        cal = load_calibration(calibration)
    with err.status(f"simulating {arrivals.requests:,} requests"):
        summary = simulate_plan(
            document,
            arrivals,
            slo_s=slo,
            idle_s=idle_s,
            max_batch_tokens=max_batch_tokens,
            max_wait_s=max_wait,
            calibration=cal,
            reserve=reserve_concurrency,
        )
    if as_json:
        print(json.dumps(summary))
    elif "slots" in summary:  # a stream plan's workers
        render.stream_traffic(stdout(), summary)
    elif "planned_for" in summary:
        render.generation_traffic(stdout(), summary)
    else:
        render.traffic(stdout(), summary)


def stream_request(
    traffic: str,
    scale: float,
    hours: float | None,
    minutes: float | None,
    seed: int,
    idle_s: float | None,
    slo_p99_s: float | None,
    options: Any,
) -> dict[str, Any]:
    """`moelambda plan --traffic`'s stream, read and bounded now (before the model loads, so a
    bad trace fails fast), as the stream planners take it: a batch plan meets a p99 SLO over
    the stream, a generating one its TTFT and TPOT SLOs."""
    from planner.traffic import load_arrivals, period_hours

    period = period_hours(hours, minutes)
    load_arrivals(traffic, scale=scale, hours=period, seed=seed)
    p99 = {} if options.generating else {"slo_p99_s": float(slo_p99_s)}  # type: ignore[arg-type]
    return {
        "traffic": traffic,
        "scale": scale,
        "hours": period,
        "seed": seed,
        "idle_s": idle_s,
        **p99,
    }


def plan_stream(
    manifest: Any,
    counts: Any,
    calibration: Any,
    options: Any,
    *,
    hardware: str,
    out: Path,
    force: bool,
    as_json: bool,
    **stream: Any,
) -> None:
    """`moelambda plan --traffic`, saved and rendered: on CPU functions
    `planner.traffic.api.plan_traffic` (a decoder's generation: `plan_generation_traffic`);
    with GPU-backed candidates (`--hardware gpu|auto`, batches only)
    `planner.hardware.gpu_plan.plan_traffic_on_hardware`, with every candidate."""
    from moelambda.cli import _render
    from planner.hardware.gpu_plan import plan_traffic_on_hardware
    from planner.traffic.api import plan_generation_traffic, plan_traffic

    generating = options.generating
    on_gpus = hardware != "cpu" and not generating
    if on_gpus:
        plan, summary = plan_traffic_on_hardware(
            manifest, counts, calibration, hardware=hardware, options=options,
            status=err.status, **stream,
        )  # fmt: skip
    else:
        planner = plan_generation_traffic if generating else plan_traffic
        made, summary = planner(
            manifest, counts, calibration, options=options, status=err.status, **stream
        )
        plan = made if generating else made.plan
    plan.save(out, force=force)
    summary = {"plan": str(out), **summary}
    if as_json:
        print(json.dumps(summary))
    elif generating:
        _render.plan(stdout(), summary)
        render.generation_traffic(stdout(), summary["traffic"])
    else:
        render.plan_traffic(stdout(), summary)
        if on_gpus:
            render.hardware(stdout(), summary)


@bench_app.command("traffic")
@user_errors
def bench_traffic(
    counts: Annotated[
        Path, typer.Option(help="Counts file from `moelambda predict --counts-out`.")
    ] = Path("out/counts.json"),
    slo_p99: Annotated[
        list[float] | None,
        typer.Option(help="p99 SLOs to compare at, seconds (repeat the option). Default 10."),
    ] = None,
    rates: Annotated[
        list[float] | None,
        typer.Option(
            help="Mean arrival rates, requests per second (repeat). Default: 1/60 and 10."
        ),
    ] = None,
    plot: Annotated[Path, typer.Option(help="PNG of latencies and bills.")] = Path(
        "out/traffic.png"
    ),
    force: Annotated[bool, typer.Option(help="Replace an existing --plot.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Today's steady-state plan against the traffic-aware plan on the Azure conversation trace.

    At each rate (the trace's --scale giving it) and p99 SLO: both plans simulated over a day;
    p99 and the bill per million tokens of each. Also times a simulated day at the trace's own
    rate (target <= 10 s). Plans are made on 72 h of traffic below 1 request/s (and judged on the
    day after), on 1 h above.
    """
    from planner import load_calibration
    from planner.api import counts_for_plan
    from planner.traffic.api import BENCH_TOKENS
    from planner.traffic.api import bench_traffic as run_bench
    from planner.traffic.bench import plot_comparison

    check_file_out(plot, force, "--plot")
    check_positive(
        *(("--slo-p99", s) for s in slo_p99 or []), *(("--rates", r) for r in rates or [])
    )
    cal = load_calibration()
    planning = counts_for_plan(counts=counts, tokens=BENCH_TOKENS)
    report = run_bench(
        manifest_of_counts(planning),
        planning,
        cal,
        rates_per_s=tuple(rates or [1 / 60, 10.0]),
        slos_s=tuple(slo_p99 or [10.0]),
        status=err.status,
    )
    report["plot"] = plot_comparison(plot, report, force=force)
    report.pop("latencies")
    if as_json:
        print(json.dumps(report))
    else:
        render.bench_traffic(stdout(), report)
