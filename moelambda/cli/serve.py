"""`moelambda run-local`: the synthesised workflow of a plan on moto, real handlers in-process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from moelambda.cli._app import JsonOpt, app, err, load_with_status, user_errors
from moelambda.exceptions import UsageError


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
    from planner import Plan

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
            export_model(model, root / "weights")
            template = build_app(plan, root / "cdk.out").stacks[0].template
        ids = model.tokenizer([text], return_tensors="pt", truncation=True, max_length=max_tokens)[
            "input_ids"
        ].numpy()
        with err.status(f"running {requests} execution(s) on moto"):
            result = run_workflow(template, root / "weights", [ids] * requests)
    reference = model.forward(torch.from_numpy(ids), reference=True).numpy()
    runs = result["requests"]
    diffs = [float(np.abs(r["output"] - reference).max()) for r in runs if "output" in r]
    failed = [r for r in runs if r["status"] != "SUCCEEDED"]
    summary: dict[str, Any] = {
        "status": "SUCCEEDED" if not failed else failed[0]["status"],
        "max_abs_diff_vs_monolithic": max(diffs) if diffs else None,
        "per_function_seconds": {
            name: round(sum(times), 4) for name, times in sorted(result["seconds"].items())
        },
        "requests": len(runs),
        "tokens": int(ids.size),
        "intermediates_left": sum(r.get("intermediates_left", 0) for r in runs),
        "errors": [{"error": r.get("error"), "cause": r.get("cause")} for r in failed],
    }
    if as_json:
        print(json.dumps(summary))
    else:
        typer.echo(json.dumps(summary, indent=1))
    if failed:
        raise typer.Exit(1)
