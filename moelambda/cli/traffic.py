"""Commands on traffic: simulate a plan over a request stream, and its benchmark.

`moelambda traffic` replays a traffic spec through a plan (`planner.traffic.simulate_plan`);
`moelambda calibrate --cold` (`calibrate_cold` here) measures the handlers' INIT;
`moelambda plan --traffic` (`plan_for_traffic` here) plans for a stream;
`moelambda bench traffic` compares the steady-state plan with the traffic-aware one.
"""

from __future__ import annotations

import json
import tempfile
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, bench_app, err, user_errors

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
SeedOpt = Annotated[int, typer.Option(help="Seeds synthetic arrivals.")]


def calibrate_cold(source: Path, target: Path, repeats: int, as_json: bool) -> None:
    """`moelambda calibrate --cold`: measure every handler's INIT and write it into `target`."""
    from moelambda.coldstart import measure_cold, reference_export, summarise
    from planner import compute
    from planner.calibration import ColdStartReference
    from planner.traffic.platform import calibrated_cold_document

    if repeats < 1:
        raise UsageError(f"--cold-repeats {repeats} measures nothing.", "pass 1 or more.")
    if target.is_dir():
        raise UsageError(f"--out '{target}' is a directory.", "pass a calibration file name.")
    document = compute.read_document(source)
    compute.load_calibration(source)
    with tempfile.TemporaryDirectory(prefix="moelambda-cold-") as tmp:
        with err.status("exporting the reference model") as status:
            root = reference_export(Path(tmp) / "weights", progress=status.update)
            before = compute.cpu_times()
            samples = measure_cold(root, repeats, progress=status.update)
            busy = compute.background_cpus(before, compute.cpu_times())
    import torch

    reference = ColdStartReference(
        **summarise(samples), torch_version=torch.__version__, cpu_model=compute.cpu_model()
    )
    if busy is not None and busy > 0.25:
        err.print(
            f"[yellow]warning:[/] other processes kept {busy:.2f} CPUs busy while measuring; "
            "imports and loads are likely slower than on an idle machine.",
            highlight=False,
        )
    written = compute.write_calibration(
        calibrated_cold_document(document, reference, date.today()), target
    )
    assert written.cold_start_reference is not None
    summary = {
        "file": str(target),
        "background_cpus": busy,
        **written.cold_start_reference.model_dump(),
    }
    if as_json:
        print(json.dumps(summary))
        return
    table = Table(title=f"Handler INIT on this machine, written to {target}")
    for column in ("role", "stage MB", "import s", "download s", "build s"):
        table.add_column(column, justify="right")
    for row in summary["samples"]:
        table.add_row(
            str(row["role"]),
            f"{int(row['stage_bytes']) / 1e6:.2f}",
            f"{float(row['import_s']):.2f}",
            f"{float(row['download_s']):.3f}",
            f"{float(row['build_s']):.2f}",
        )
    out = Console()
    out.print(table)
    out.print(
        f"Interpreter start {summary['python_start_s']:.3f} s; load = "
        f"{summary['load_fixed_s']:.3f} s + {summary['load_s_per_byte'] * 1e9:.2f} s/GB "
        f"(median of {summary['repeats']} fresh processes per role).",
        highlight=False,
    )


def _print_traffic(summary: dict[str, Any]) -> None:
    out = Console()
    lat, bill = summary["latency_s"], summary["bill_usd"]

    def fmt(value: float | None) -> str:
        return "refused" if value is None else f"{value:.3f}"

    out.print(
        f"{summary['requests']:,} requests in {summary['batches']:,} batches over "
        f"{summary['period_s'] / 3600:.2f} h ({summary['traffic']['rate_per_s']:.4g} req/s): "
        f"latency p50 {fmt(lat['p50'])} s, p95 {fmt(lat['p95'])} s, p99 {fmt(lat['p99'])} s, "
        f"max {fmt(lat['max'])} s; {summary['cold_starts']['count']:,} cold starts.",
        highlight=False,
    )
    if summary["slo_s"] is not None:
        out.print(
            f"SLO {summary['slo_s']:.3f} s met by {summary['slo_attainment']:.2%} of requests.",
            highlight=False,
        )
    for note in summary["notes"]:
        out.print(f"note: {note}.", highlight=False)
    table = Table(title="Bill of the period (USD)")
    table.add_column("item")
    table.add_column("USD", justify="right")
    for name, value in bill.items():
        table.add_row(name, f"{value:.6f}")
    out.print(table)


@app.command()
@user_errors
def traffic(
    plan: Annotated[Path, typer.Option(help="Plan JSON from `moelambda plan`.")] = Path(
        "out/plan.json"
    ),
    traffic: TrafficOpt = "azure-conv",
    scale: ScaleOpt = 1.0,
    hours: HoursOpt = None,
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
    one execution per arriving request with no capacity policy.
    """
    from ground.plan import Plan
    from planner.traffic import load_arrivals, simulate_plan

    document = Plan.load(plan)
    arrivals = load_arrivals(traffic, scale=scale, hours=hours, seed=seed)
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
    else:
        _print_traffic(summary)


def plan_with_traffic(
    *,
    traffic: str,
    scale: float,
    hours: float | None,
    seed: int,
    slo_p99: float,
    idle_s: float | None,
    manifest: Any,
    counts: Any,
    tokens: int,
    dist: Any,
    confidence: float,
    calibration: Any,
    options: dict[str, Any],
    solver: str,
    methods: tuple[Any, ...],
    pack: str,
    source: dict[str, Any],
    out: Path,
    force: bool,
    concurrency_quota: int,
    as_json: bool,
) -> None:
    """`moelambda plan --traffic`: batch policy, MoE plan and capacity for a request stream."""
    from planner.traffic import load_arrivals
    from planner.traffic.planning import moe_plan_at, plan_for_traffic
    from planner.traffic.platform import init_model

    if not slo_p99 > 0:
        raise UsageError(f"--slo-p99 {slo_p99} is not positive.", "pass e.g. --slo-p99 10.")
    init_model(calibration)  # fail on missing traffic parameters before any planning
    arrivals = load_arrivals(traffic, scale=scale, hours=hours, seed=seed)
    if arrivals.requests == 0:
        raise UsageError(
            f"--traffic {traffic} gives no request in the period.",
            "raise --scale or --hours.",
        )
    plan_at = moe_plan_at(
        manifest,
        counts,
        tokens,
        calibration,
        arch=options["arch"],
        workflow=options["workflow"],
        objective=options["objective"],
        solver=solver,
        methods=methods,
        pack=pack,
        dist=dist,
        confidence=confidence,
        counts_source=source,
    )
    with err.status("planning for traffic") as status:
        choice = plan_for_traffic(
            plan_at,
            arrivals,
            slo_p99,
            calibration,
            options["arch"],
            idle_s=idle_s,
            progress=status.update,
        )
    choice.plan.check_concurrency_quota(concurrency_quota)
    choice.plan.save(out, force=force)
    t = choice.plan.traffic
    assert t is not None
    summary = {
        "plan": str(out),
        "traffic": arrivals.describe(),
        "slo_p99_s": slo_p99,
        "max_batch_tokens": t.max_batch_tokens,
        "max_wait_s": t.max_wait_s,
        "capacity": t.simulated["capacity"],
        "capacity_per_function": [c.model_dump() for c in t.capacity if c.policy != "none"],
        "latency_s": t.simulated["latency_s"],
        "slo_attainment": t.simulated["slo_attainment"],
        "bill_usd": t.simulated["bill_usd"],
        "tokens_per_batch_planned": choice.plan.totals.tokens,
        "batch_latency_s": choice.plan.totals.latency_s,
        "candidates": len(choice.candidates),
        "seconds": round(choice.seconds, 3),
    }
    if as_json:
        print(json.dumps(summary))
        return
    out_console = Console()
    bill = summary["bill_usd"]
    out_console.print(
        f"For {arrivals.requests:,} requests ({arrivals.describe()['rate_per_s']:.4g}/s) with "
        f"p99 <= {slo_p99:g} s: batches of at most {t.max_batch_tokens:,} tokens, waiting at "
        f"most {t.max_wait_s:g} s; capacity: {summary['capacity']}. Simulated p99 "
        f"{summary['latency_s']['p99']:.3f} s, bill ${bill['total_usd']:.4f} "
        f"(${bill['per_million_tokens_usd']:.4f} per million tokens), best of "
        f"{summary['candidates']} candidates in {summary['seconds']:.1f} s. Wrote {out}.",
        highlight=False,
    )


def _plot(path: Path, report: dict[str, Any], force: bool) -> str:
    """Latency distributions (steady vs traffic-aware, per rate and SLO) and the bills."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ground.files import write_file_atomically

    runs = report["runs"]
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(4.2 * (len(runs) + 1), 3.8))
    for ax, run in zip(axes, runs, strict=False):
        key = f"{run['rate_per_s']:g}/s, p99 {run['slo_p99_s']:g} s"
        for label, name, colour, style in (
            ("steady", "today's plan", "tab:red", "-"),
            ("unreserved", "today's, no reserved concurrency", "tab:orange", "--"),
            ("traffic", "traffic-aware", "tab:blue", "-"),
        ):
            lat = np.sort(report["latencies"][key][label])  # inf: refused or failed
            slower = 1.0 - np.arange(lat.size) / max(lat.size, 1)
            finite = np.isfinite(lat)
            ax.plot(lat[finite], slower[finite], label=name, color=colour, linestyle=style)
        ax.axvline(run["slo_p99_s"], color="grey", linestyle="--", linewidth=1)
        ax.axhline(0.01, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 1.0)
        ax.set_xlabel("request latency (s)")
        ax.set_ylabel("share of requests slower")
        ax.set_title(f"{run['rate_per_s']:g} req/s, p99 SLO {run['slo_p99_s']:g} s", fontsize=10)
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(alpha=0.3)
    ax = axes[-1]
    labels = [f"{r['rate_per_s']:g}/s\n{r['slo_p99_s']:g} s" for r in runs]
    x = np.arange(len(runs))
    ax.bar(x - 0.2, [r["steady"]["per_million_tokens_usd"] for r in runs], 0.4,
           label="today's plan", color="tab:red")  # fmt: skip
    ax.bar(x + 0.2, [r["traffic_aware"]["per_million_tokens_usd"] for r in runs], 0.4,
           label="traffic-aware", color="tab:blue")  # fmt: skip
    ax.set_ylim(0, 1.3 * max(r["steady"]["per_million_tokens_usd"] for r in runs))
    ax.set_xticks(x, labels)
    ax.set_ylabel("bill per million tokens (USD)")
    ax.set_title("bill over the simulated day", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        write_file_atomically(
            path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), force=force
        )
    finally:
        plt.close(fig)
    return str(path)


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
    from moe import describe_model
    from moelambda.cli._app import load_with_status
    from moelambda.cli.plan import _counts
    from planner import load_calibration
    from planner.traffic.bench import compare
    from planner.traffic.planning import fastest_latency, moe_plan_at
    from planner.traffic.platform import init_model

    slos = tuple(slo_p99 or [10.0])
    chosen_rates = tuple(rates or [1 / 60, 10.0])
    if any(not s > 0 for s in slos) or any(not r > 0 for r in chosen_rates):
        raise UsageError("--slo-p99 and --rates must be positive.", "pass positive numbers.")
    if plot.exists() and not force:
        raise UsageError(f"'{plot}' already exists.", "pick another --plot or pass --force.")
    cal = load_calibration()
    init_model(cal)
    tokens = 10240
    predicted, model, source, dist = _counts(None, counts, tokens, 0)
    manifest = describe_model(
        load_with_status(
            model["model"], model["experts"], model["top_k"], model["seed"], True, model["moefy"]
        )
    )
    plan_at = moe_plan_at(
        manifest,
        predicted,
        tokens,
        cal,
        dist=dist,
        confidence=0.99 if dist is not None else 0.0,
        counts_source=source,
    )
    with err.status("comparing plans") as status:
        report = compare(
            plan_at,
            fastest_latency(manifest, predicted, tokens, cal),
            cal,
            "x86_64",
            rates_per_s=chosen_rates,
            slos_s=slos,
            plan_hours=lambda rate: 72.0 if rate < 1.0 else 1.0,
            progress=status.update,
        )
    report["plot"] = _plot(plot, report, force)
    for run in report["runs"]:
        run.pop("plan")
        run.pop("steady_plan")
    report.pop("latencies")
    if as_json:
        print(json.dumps(report))
        return
    table = Table(title="Today's steady-state plan vs the traffic-aware plan (simulated day)")
    for column in ("rate /s", "p99 SLO s", "plan", "p99 s", "meets", "USD / M tokens", "policy"):
        table.add_column(column, justify="right" if column != "policy" else "left")
    for run in report["runs"]:
        for name, row in (
            ("today", run["steady"]),
            ("today, unreserved", run["steady_unreserved"]),
            ("traffic", run["traffic_aware"]),
        ):
            p99 = row["latency_s"]["p99"]
            policy = (
                f"{row['max_batch_tokens']:,} tokens, wait {row['max_wait_s']:g} s, "
                f"{row['capacity']}"
                if name == "traffic"
                else f"{run['steady']['tokens_per_batch']:,}-token plan, one execution per request"
            )
            table.add_row(
                f"{run['rate_per_s']:.4g}",
                f"{run['slo_p99_s']:g}",
                name,
                "unbounded" if p99 is None else f"{p99:.2f}",
                "yes" if row["meets_p99"] else "no",
                f"{row['per_million_tokens_usd']:.4f}",
                policy,
            )
    out = Console()
    out.print(table)
    for row in report["infeasible"]:
        out.print(
            f"{row['rate_per_s']:.4g} req/s, p99 {row['slo_p99_s']:g} s: {row['reason']}",
            highlight=False,
        )
    day = report["day"]
    out.print(
        f"A simulated day at the trace's own rate ({day['requests']:,} requests): "
        f"{day['wall_s']:.2f} s (target <= {day['target_s']:g} s). Plot: {report['plot']}.",
        highlight=False,
    )
