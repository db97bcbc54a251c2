"""`moelambda backtest`: plans from a profile, served on held-out batches (planner.backtest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.table import Table

from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    TracesOpt,
    app,
    check_file_out,
    manifest_of_trace,
    progress,
    stdout,
    user_errors,
)


@app.command()
@user_errors
def backtest(
    traces: TracesOpt = Path("out/profile"),
    slo: Annotated[
        float | None,
        typer.Option(
            help="Latency SLO of one batch, seconds (default: midway between the fastest and "
            "the cheapest deployment of the first batch's prediction)."
        ),
    ] = None,
    tokens: Annotated[int, typer.Option(help="Tokens per batch (whole windows).")] = 10240,
    batches: Annotated[int, typer.Option(help="Held-out batches to serve.")] = 50,
    confidence: Annotated[
        float, typer.Option(help="Q of the confidence policy (0: the point plan).")
    ] = 0.99,
    predictor: Annotated[
        str | None, typer.Option(help="Prediction method (default: the planner's).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the pool and the batches.")] = 0,
    calibration: Annotated[
        Path | None, typer.Option(help="Calibration JSON (default: the packaged one).")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="PNG of SLO attainment and cost against Q (runs every Q of the sweep)."),
    ] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Serve held-out batches on plans made from a profile: point, confidence, oracle, LambdaML.

    The trace is split once into a pool of held-out windows and the rest; the predictor is fitted
    on the rest, its model error measured on batches of the rest, and each of --batches batches
    drawn from the pool is planned by every policy and served on its real routing by the
    serving simulator. The oracle plans each batch from its real counts.
    """
    from planner import load_calibration
    from planner.backtest import backtest_plans, check_backtest, plot_backtest
    from predictor import RoutingTrace

    method = check_backtest(batches=batches, confidence=confidence, slo_s=slo, method=predictor)
    check_file_out(plot, force, "--plot")
    trace = RoutingTrace.load(traces)
    cal = load_calibration(calibration)
    manifest = manifest_of_trace(trace)
    with progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
    ) as bar:
        task = bar.add_task("serving held-out batches", total=batches)
        summary = backtest_plans(
            trace,
            manifest,
            cal,
            tokens=tokens,
            batches=batches,
            slo_s=slo,
            confidence=confidence,
            method=method,
            plot_sweep=plot is not None,
            seed=seed,
            on_batch=lambda done: bar.update(task, completed=done),
        )
    if plot is not None:
        summary["plot"] = str(plot_backtest(plot, summary, force=force))
    if as_json:
        print(json.dumps(summary))
        return
    _print(summary)


def _print(summary: dict[str, Any]) -> None:
    table = Table(
        title=f"Backtest: {summary['batches']} held-out batches of {summary['tokens']:,} tokens "
        f"(pool {summary['pool_tokens']:,} tokens), SLO {summary['slo_s']:.3f} s"
    )
    for column in ("policy", "SLO attained", "mean cost USD", "cost / oracle", "p99 latency s"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, row in summary["policies"].items():
        label = f"confidence {summary['confidence']:g}" if name == "confidence" else name
        table.add_row(
            label,
            f"{row['slo_attainment']:.1%}",
            "-" if row["mean_cost_usd"] is None else f"{row['mean_cost_usd']:.6f}",
            "-" if row["cost_vs_oracle"] is None else f"{row['cost_vs_oracle']:.3f}",
            "-" if row["p99_latency_s"] is None else f"{row['p99_latency_s']:.3f}",
        )
    stdout().print(table)
    if "plot" in summary:
        stdout().print(f"Wrote {summary['plot']}")
