"""`moelambda run-local`: the synthesised workflow of a plan on moto, real handlers in-process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, err, load_with_status, user_errors


@app.command("run-local")
@user_errors
def run_local(
    plan: Annotated[Path, typer.Option(help="Plan JSON from `moelambda plan`.")] = Path(
        "out/plan.json"
    ),
    text: Annotated[str, typer.Option(help="Request text (one window).")] = (
        "Serverless functions bill by the millisecond, so idle experts cost nothing."
    ),
    requests: Annotated[int, typer.Option(help="Concurrent executions of the same text.")] = 1,
    max_tokens: Annotated[
        int, typer.Option(help="Truncate the request to this many tokens.")
    ] = 128,
    as_json: JsonOpt = False,
) -> None:
    """Run the plan's Step Functions workflow on moto, handlers in-process, and check the result.

    The state machine and every function's environment come from the template `moelambda synth`
    would produce; the output is compared with the monolithic MoE forward of the same text.
    """
    import numpy as np
    import torch

    from cdk.app import build_app
    from moe import export_model
    from pipeline.local import run_workflow
    from planner import Plan, choice_of, evaluate, function_seconds, instance_of

    if requests < 1 or max_tokens < 2 or not text.strip():
        raise UsageError(
            "--requests must be >= 1, --max-tokens >= 2 and --text non-empty.",
            "pass sensible values.",
        )
    document = Plan.load(plan)
    ref = document.model
    model = load_with_status(ref.model, ref.experts, ref.top_k, ref.seed, True)
    with tempfile.TemporaryDirectory(prefix="moelambda-local-") as tmp:
        root = Path(tmp)
        with err.status("exporting weights and synthesising the stack"):
            manifest = export_model(model, root / "weights")
            template = build_app(plan, root / "cdk.out").stacks[0].template
        ids = model.tokenizer([text], return_tensors="pt", truncation=True, max_length=max_tokens)[
            "input_ids"
        ].numpy()
        with err.status(f"running {requests} execution(s) on moto"):
            result = run_workflow(template, root / "weights", [ids] * requests)
    routing: list = []
    reference = model.forward(torch.from_numpy(ids), reference=True, routing=routing).numpy()
    counts = np.stack([np.bincount(r.experts.reshape(-1), minlength=ref.experts) for r in routing])
    inst = instance_of(document, manifest, counts.astype(float), int(ids.size))
    choice = choice_of(document, inst)
    predicted = function_seconds(inst, choice)
    latency = evaluate(inst, choice).latency
    runs = result["requests"]
    diffs = [float(np.abs(r["output"] - reference).max()) for r in runs if "output" in r]
    failed = [r for r in runs if r["status"] != "SUCCEEDED"]
    summary: dict[str, Any] = {
        "status": "SUCCEEDED" if not failed else failed[0]["status"],
        "max_abs_diff_vs_monolithic": max(diffs) if diffs else None,
        "per_function_seconds": {
            name: round(sum(times), 4) for name, times in sorted(result["seconds"].items())
        },
        "predicted_vs_measured": _predicted_vs_measured(
            predicted, latency, result["seconds"], runs
        ),
        "requests": len(runs),
        "tokens": int(ids.size),
        "intermediates_left": sum(r.get("intermediates_left", 0) for r in runs),
        "errors": [{"error": r.get("error"), "cause": r.get("cause")} for r in failed],
    }
    if as_json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    if failed:
        raise typer.Exit(1)


def _predicted_vs_measured(
    predicted: dict[str, float],
    latency_s: float,
    measured: dict[str, list[float]],
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    """Per function the cost model's time of one call against the mean measured call.

    The prediction is for Lambda at the plan's memory size (warm start, weights read from S3);
    the measurement is this machine running every handler in-process on moto, concurrently.
    """
    functions = {}
    for name in sorted(predicted.keys() | measured.keys()):
        calls = measured.get(name, [])
        functions[name] = {
            "predicted_s": round(predicted[name], 5) if name in predicted else None,
            "measured_s": round(sum(calls) / len(calls), 5) if calls else None,
            "calls": len(calls),
        }
    durations = [r["seconds"] for r in runs if "seconds" in r]
    return {
        "functions": functions,
        "request": {
            "predicted_s": round(latency_s, 4),
            "measured_s": round(max(durations), 4) if durations else None,
        },
    }


def _print_summary(summary: dict[str, Any]) -> None:
    """The verdict, then per function predicted against measured seconds (slowest first)."""
    from rich.console import Console
    from rich.table import Table

    compared = summary["predicted_vs_measured"]
    table = Table(title="seconds per call: cost model (Lambda) vs measured (in-process, moto)")
    for column in ("function", "predicted", "measured", "calls"):
        table.add_column(column, justify="left" if column == "function" else "right")
    rows = sorted(compared["functions"].items(), key=lambda kv: -(kv[1]["measured_s"] or 0.0))
    for name, entry in rows:
        predicted = entry["predicted_s"]
        table.add_row(
            name,
            "-" if predicted is None else f"{predicted:.3f}",
            "-" if entry["measured_s"] is None else f"{entry['measured_s']:.3f}",
            str(entry["calls"]),
        )
    console = Console()
    console.print(table)
    request = compared["request"]
    diff = summary["max_abs_diff_vs_monolithic"]
    console.print(
        f"{summary['status']}: {summary['requests']} request(s) of {summary['tokens']} tokens; "
        f"max |output - monolithic| = {'-' if diff is None else f'{diff:.2g}'}; "
        f"intermediates left: {summary['intermediates_left']}; request latency predicted "
        f"{request['predicted_s']} s, measured {request['measured_s']} s."
    )
    for error in summary["errors"]:
        console.print(f"[red]{error['error']}[/red]: {error['cause']}")
