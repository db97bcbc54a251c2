"""`moelambda replan`: today's plan against the routing the gates observed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, check_file_out, user_errors


@app.command()
@user_errors
def replan(
    plan: Annotated[Path, typer.Option(help="Plan JSON from `moelambda plan`.")] = Path(
        "out/plan.json"
    ),
    metrics: Annotated[
        Path | None,
        typer.Option(
            help="The gates' routing metrics: CloudWatch EMF lines (`run-local --metrics-out`, "
            "or the gates' log lines)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the new plan here (only if one meets the SLO).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare observed with planned expert popularity, and say whether a new plan would save
    money or restore the SLO (`planner.drift.replan`); write it with --out."""
    from ground.plan import Plan
    from planner.drift import read_metrics
    from planner.drift import replan as compare

    if metrics is None:
        raise UsageError(
            "--metrics is required.", "pass the file `run-local --metrics-out` wrote."
        )
    check_file_out(out, force, "--out")
    document = Plan.load(plan)
    if document.stream is not None:
        raise UsageError(
            "replan re-sizes a batch plan from its gates' routing; this plan serves a stream "
            "of generations with workers.",
            "plan the stream again with `moelambda plan --traffic ... --slo-ttft --slo-tpot`.",
        )
    observed, records = read_metrics(metrics, document.model.num_layers, document.model.experts)
    report, new_plan = compare(document, observed)
    report["records_per_layer"] = records.tolist()
    if out is not None and new_plan is not None:
        new_plan.save(out, force=force)
        report["written"] = str(out)
    if as_json:
        print(json.dumps(report))
        return
    current, new = report["current"], report["new"]
    console = Console()
    console.print(
        f"Largest drift of a layer's expert shares from the plan's: {report['max_drift']:.1%} "
        f"({int(records.sum())} gate records).",
        highlight=False,
    )
    if current["refused"]:
        console.print(f"Today's plan refuses such a batch: {current['reason']}", highlight=False)
    else:
        console.print(
            f"Today's plan on the observed routing: {current['latency_s']:.3f} s, "
            f"${current['cost_usd']:.6f} per batch.",
            highlight=False,
        )
    if new["feasible"]:
        console.print(
            f"A new plan: {new['latency_s']:.3f} s, ${new['cost_usd']:.6f} per batch.",
            highlight=False,
        )
    console.print(f"Advice: {report['advice']}.", highlight=False)
    if report["refit"] is not None:
        console.print(f"[yellow]Also: {report['refit']['advice']}.", highlight=False)
