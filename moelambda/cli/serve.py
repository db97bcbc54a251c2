"""`moelambda run-local`: the synthesised workflow of a plan on moto, real handlers in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ground.errors import UsageError
from moelambda.cli._app import (
    JsonOpt,
    app,
    err,
    load_with_status,
    stdout,
    user_errors,
)

if TYPE_CHECKING:
    import numpy as np

WINDOW = 128  # tokens per window, as `moelambda profile` cuts them by default


@app.command("run-local")
@user_errors
def run_local(
    plan: Annotated[Path, typer.Option(help="Plan JSON from `moelambda plan`.")] = Path(
        "out/plan.json"
    ),
    tokens: Annotated[
        int | None,
        typer.Option(
            help="Tokens in the one request's batch, rounded up to whole 128-token windows of "
            "--corpus. Default: the plan's batch (totals.tokens)."
        ),
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option(help="'wiki' (embedded, the default) or a text/JSONL file for the batch."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the shuffle of the corpus windows.")] = 0,
    text: Annotated[
        str | None, typer.Option(help="Run one window of this text instead of a corpus batch.")
    ] = None,
    requests: Annotated[
        int, typer.Option(help="Concurrent executions of the same input (metered only if 1).")
    ] = 1,
    max_tokens: Annotated[
        int, typer.Option(help="With --text: truncate it to this many tokens.")
    ] = 128,
    faults: Annotated[
        str | None,
        typer.Option(
            help="Inject faults at these rates, seeded by --seed: e.g. 'throttle=0.1,"
            "s3-slowdown=0.05,expert-crash=0.02,duplicate=0.05' (runs are then not metered)."
        ),
    ] = None,
    metrics_out: Annotated[
        Path | None,
        typer.Option(
            help="Append the gates' routing metrics (CloudWatch EMF, one JSON line per gate "
            "call) to this file, as a deployed gate prints them: `moelambda replan` reads it."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the plan's Step Functions workflow on moto, handlers in-process, and check the result.

    The state machine and every function's environment come from the template `moelambda synth`
    would produce; the output is compared with the monolithic MoE forward of the same input. One
    execution is metered (functions warm, as the plan prices them): its billed requests,
    transitions and GB-seconds are set against the plan's, and both are priced.
    """
    from ground.plan import Plan
    from pipeline.faults import Faults

    for flag, value, least in (
        ("--requests", requests, 1),
        ("--max-tokens", max_tokens, 2),
        ("--tokens", 1 if tokens is None else tokens, 1),
    ):
        if value < least:
            raise UsageError(f"{flag} {value} is below {least}.", f"pass {flag} {least} or more.")
    if text is not None and (tokens is not None or corpus is not None):
        raise UsageError(
            "--text runs one window of your text; --tokens and --corpus make a corpus batch.",
            "pass either --text or --tokens/--corpus.",
        )
    if text is not None and not text.strip():
        raise UsageError("--text is empty.", "pass some text, or leave --text out.")
    injected = Faults.parse(faults, seed=seed)
    if metrics_out is not None and metrics_out.is_dir():
        raise UsageError(f"--metrics-out '{metrics_out}' is a directory.", "pass a file name.")
    document = Plan.load(plan)
    ref = document.model
    if ref.model_type.startswith("shape:"):
        raise UsageError(
            f"'{plan}' plans the model shape {ref.model}, which has no weights to run.",
            "run-local runs real weights: plan a model you have (--traces or --counts); "
            "`moelambda synth` works for shapes.",
        )
    # Every argument is checked: only now start the model, moto and (through the CDK) Node.
    from moelambda.local import run_plan_locally

    model = load_with_status(ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy)
    ids = _batch(model.tokenizer, text, tokens or document.totals.tokens, corpus, seed, max_tokens)
    with err.status("running the plan locally") as status:
        summary = run_plan_locally(
            plan,
            model,
            ids,
            requests=requests,
            faults=injected,
            metrics_file=metrics_out,
            progress=status.update,
        )
    failed = summary["failed"]
    if as_json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    if failed:
        raise typer.Exit(1)


def _batch(
    tokenizer: Any, text: str | None, tokens: int, corpus: str | None, seed: int, max_tokens: int
) -> np.ndarray:
    """The request's token ids, (windows, 128): `tokens` of the corpus, or one window of text.

    Whole windows after a seeded shuffle, as `moelambda profile` cuts them, so the batch looks
    like the traffic the counts were predicted for.
    """
    if text is not None:
        encoded = tokenizer([text], return_tensors="np", truncation=True, max_length=max_tokens)
        return encoded["input_ids"]
    from moe import load_corpus, make_windows

    with err.status("cutting the corpus into windows"):
        source = load_corpus(corpus or "wiki")
        return make_windows(source, tokenizer, tokens=tokens, window=WINDOW, seed=seed)


def _print_summary(summary: dict[str, Any]) -> None:
    """Per function predicted against measured seconds, metered against planned, the verdict."""
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
    console = stdout()
    console.print(table)
    if summary["metered"] is not None:
        # Polls and GB-seconds depend on timing (handlers here run slower than on Lambda); the
        # requests and transitions of a successful run do not.
        console.print(
            _side_by_side(
                "usage: metered on moto vs planned",
                ("metered", "planned"),
                (summary["metered"], summary["planned"]),
                _amount,
            )
        )
        bill = summary["bill"]
        console.print(
            _side_by_side(
                "bill in USD, at the plan's prices",
                ("planned", "metered"),
                (bill["planned"], bill["metered"]),
                lambda usd: f"{usd:.3g}",
            )
        )
    request = compared["request"]
    diff = summary["max_abs_diff_vs_monolithic"]
    console.print(
        f"{summary['status']}: {summary['succeeded']} of {summary['requests']} request(s) of "
        f"{summary['tokens']} tokens succeeded in {summary['wall_s']} s; "
        f"max |output - monolithic| = {'-' if diff is None else f'{diff:.2g}'}; "
        f"intermediates left: {summary['intermediates_left']}; request latency predicted "
        f"{request['predicted_s']} s, measured {request['measured_s']} s."
    )
    if summary["faults_injected"]:
        injected = ", ".join(f"{k} x{v}" for k, v in sorted(summary["faults_injected"].items()))
        console.print(f"Faults injected: {injected}.")
    denied = summary["access_denied"]
    console.print(
        "Every S3 request and Invoke was checked against its function's IAM policy: "
        + (
            "none refused."
            if not denied
            else f"[red]{len(denied)} refused[/red], e.g. {denied[0]}."
        )
    )
    if summary["metered"] is None:
        console.print("Metering needs one execution and no faults: --requests 1, no --faults.")
    for failure in summary["failed"]:
        console.print(f"[red]{failure['error']}[/red]: {failure['cause']}")


def _side_by_side(
    title: str, columns: tuple[str, str], values: tuple[dict, dict], fmt: Callable[[float], str]
) -> Any:
    """A table of two dicts by key (the first dict's order, then the second's other keys)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("item", *columns):
        table.add_column(column, justify="left" if column == "item" else "right")
    first, second = values
    for key in [*first, *(k for k in second if k not in first)]:
        cells = [first.get(key), second.get(key)]
        table.add_row(key, *("-" if v is None else fmt(v) for v in cells))
    return table


def _amount(value: float) -> str:
    """A count with thousands separators; a fractional amount (GB-s) to three decimals."""
    return f"{value:,.3f}" if value != int(value) else f"{int(value):,}"
