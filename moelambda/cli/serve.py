"""`moelambda run-local`: the synthesised workflow of a plan on moto, real handlers in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ground.errors import UsageError
from moelambda.cli import _render_serve
from moelambda.cli._app import (
    JsonOpt,
    app,
    check_file_out,
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
            "s3-slowdown=0.05,expert-crash=0.02,duplicate=0.05' (runs are then not metered; "
            "expert-crash needs expert functions: refused on a one-function plan)."
        ),
    ] = None,
    metrics_out: Annotated[
        Path | None,
        typer.Option(
            help="Append the gates' routing metrics (CloudWatch EMF, one JSON line per gate "
            "call) to this file, as a deployed gate prints them: `moelambda replan` reads it."
        ),
    ] = None,
    front_door: Annotated[
        int | None,
        typer.Option(
            "--front-door",
            help="Send the batch as this many requests (whole windows each) through the plan's "
            "SQS queue and batcher, which start the executions by the plan's batch policy (a "
            "plan made with --traffic); checks every request's output and the front door's "
            "billed requests against the planned ones.",
        ),
    ] = None,
    traffic: Annotated[
        str | None,
        typer.Option(
            help="Replay this request stream instead (a CSV, 'azure-conv', 'poisson:RATE', "
            "'diurnal:PEAK,TROUGH'), compressed, with every execution environment a real "
            "process, against the traffic simulator's prediction for the same arrivals.",
            rich_help_panel="Traffic replay",
        ),
    ] = None,
    scale: Annotated[
        float,
        typer.Option(
            help="With --traffic: multiply the arrival rate (a trace's times are divided by it).",
            rich_help_panel="Traffic replay",
        ),
    ] = 1.0,
    hours: Annotated[
        float | None,
        typer.Option(
            help="With --traffic: the period, in hours.", rich_help_panel="Traffic replay"
        ),
    ] = None,
    minutes: Annotated[
        float | None,
        typer.Option(
            help="With --traffic: the period, in minutes. Default: 10 (neither given).",
            rich_help_panel="Traffic replay",
        ),
    ] = None,
    compress: Annotated[
        float,
        typer.Option(
            help="With --traffic: divide the arrival times and the idle time by this (INIT and "
            "compute run in real time).",
            rich_help_panel="Traffic replay",
        ),
    ] = 10.0,
    idle_s: Annotated[
        float | None,
        typer.Option(
            help="With --traffic: idle seconds before an environment is reclaimed, before "
            "compression. Default: the calibration's assumption (600 s).",
            rich_help_panel="Traffic replay",
        ),
    ] = None,
    max_environments: Annotated[
        int,
        typer.Option(
            help="With --traffic: the most live environment processes (memory).",
            rich_help_panel="Traffic replay",
        ),
    ] = 40,
    start_concurrency: Annotated[
        int,
        typer.Option(
            help="With --traffic: environments started at once before the trace (one per "
            "function; their INIT is what the simulator is given).",
            rich_help_panel="Traffic replay",
        ),
    ] = 1,
    start_limit: Annotated[
        int | None,
        typer.Option(
            help="With --traffic: the most environments starting at once during the trace "
            "(default: no bound, as on Lambda; a bound makes starts wait, which the simulator "
            "does not model).",
            rich_help_panel="Traffic replay",
        ),
    ] = None,
    on_device: Annotated[
        bool,
        typer.Option(
            "--on-device",
            help="Run a GPU-backed plan's GPU functions on this machine's GPU at their planned "
            "placement (scripts/gpu-check does); without it they run on the CPU at float32.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the plan's Step Functions workflow on moto, handlers in-process, and check the result.

    The state machine and every function's environment come from the template `moelambda synth`
    would produce; the output is compared with the monolithic MoE forward of the same input. One
    execution is metered (functions warm, as the plan prices them): its billed requests,
    transitions and GB-seconds are set against the plan's, and both are priced.

    With --traffic, a compressed request stream runs through the same workflow with every
    Lambda execution environment a real process (real imports, weights loaded from moto S3,
    reclaimed after the compressed idle time), and its measured cold starts and latencies are
    set beside the traffic simulator's for the same arrivals (`runtime.traffic_replay`).
    """
    from ground.plan import Plan
    from pipeline.faults import Faults

    if traffic is not None and front_door is not None:
        raise UsageError(
            "--front-door sends one batch as requests through the plan's queue; --traffic "
            "replays a whole request stream (through the same front door, for a plan made with "
            "--traffic): they are two different runs.",
            "pass --front-door N (with --tokens, --corpus or --text), or --traffic SPEC (with "
            "--scale, --minutes or --hours, --compress), not both.",
        )
    if traffic is not None:
        _replay(
            plan,
            traffic,
            scale,
            hours,
            minutes,
            compress,
            idle_s,
            max_environments,
            start_concurrency,
            start_limit,
            seed,
            as_json,
            given={
                "--text": text is not None,
                "--tokens": tokens is not None,
                "--corpus": corpus is not None,
                "--requests": requests != 1,
                "--faults": faults is not None,
                "--metrics-out": metrics_out is not None,
            },
        )
        return
    for flag, value in (("--hours", hours), ("--minutes", minutes), ("--idle-s", idle_s)):
        if value is not None:
            raise UsageError(f"{flag} needs --traffic.", f"pass --traffic SPEC, or drop {flag}.")
    if front_door is not None:
        _front_door(
            plan,
            front_door,
            text,
            tokens,
            corpus,
            seed,
            max_tokens,
            as_json,
            given={
                "--requests": requests != 1,
                "--faults": faults is not None,
                "--metrics-out": metrics_out is not None,
            },
        )
        return
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
    _check_corpus(corpus)
    if metrics_out is not None:  # appended to: an existing file is kept
        check_file_out(metrics_out, True, "--metrics-out")
        if metrics_out.exists() and not os.access(metrics_out, os.W_OK):
            raise UsageError(
                f"--metrics-out '{metrics_out}' cannot be appended to: it is not writable.",
                "pass a --metrics-out you can write to.",
            )
    document = Plan.load(plan)
    injected.check_plan(document)  # a fault the plan's shape cannot take, before any work
    ref = document.model
    if ref.model_type.startswith("shape:"):
        raise UsageError(
            f"'{plan}' plans the model shape {ref.model}, which has no weights to run.",
            "run-local runs real weights: plan a model you have (--traces or --counts); "
            "`moelambda synth` works for shapes.",
        )
    # Every argument is checked: only now start the model, moto and (through the CDK) Node.
    from runtime.local import run_plan_locally

    model = load_with_status(
        ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy, ref.weights
    )
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
            on_planned_device=on_device,
        )
    failed = summary["failed"]
    if as_json:
        print(json.dumps(summary))
    else:
        _render_serve.run_local(stdout(), summary)
    if failed:
        raise typer.Exit(1)


def _check_corpus(corpus: str | None) -> None:
    """Read --corpus once before the model loads, so a missing or unreadable file fails fast."""
    if corpus is not None:
        from moe import load_corpus

        load_corpus(corpus)


def _refuse_clash(given: dict[str, bool], mode: str, problem: str) -> None:
    """Refuse the options `given` that `mode` does not use (`problem` names them as {flags})."""
    clash = ", ".join(flag for flag, used in given.items() if used)
    if clash:
        raise UsageError(problem.format(flags=clash), f"drop {clash}, or leave {mode} out.")


def _front_door(
    plan: Path,
    count: int,
    text: str | None,
    tokens: int | None,
    corpus: str | None,
    seed: int,
    max_tokens: int,
    as_json: bool,
    given: dict[str, bool],
) -> None:
    """`run-local --front-door N`: check the arguments, cut the batch into N requests, run."""
    import numpy as np

    from runtime.front_door import front_door_plan, run_front_door_locally

    _refuse_clash(
        given,
        "--front-door",
        "--front-door sends one batch as requests through the queue; {flags} apply to direct "
        "executions.",
    )
    for flag, value, least in (
        ("--front-door", count, 1),
        ("--tokens", 1 if tokens is None else tokens, 1),
        ("--max-tokens", max_tokens, 2),
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
    _check_corpus(corpus)
    document = front_door_plan(plan)
    ref = document.model
    model = load_with_status(
        ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy, ref.weights
    )
    ids = _batch(model.tokenizer, text, tokens or WINDOW * count, corpus, seed, max_tokens)
    if count > ids.shape[0]:
        raise UsageError(
            f"--front-door {count} needs {count} windows; the batch has {ids.shape[0]}.",
            f"pass --tokens {WINDOW * count} or more, or fewer requests.",
        )
    requests = [np.ascontiguousarray(part) for part in np.array_split(ids, count)]
    with err.status("sending the requests through the front door") as status:
        summary = run_front_door_locally(plan, model, requests, progress=status.update)
    if as_json:
        print(json.dumps(summary))
    else:
        _render_serve.front_door(stdout(), summary)
    if summary["status"] != "SUCCEEDED" or not summary["metered_equals_planned"]:
        raise typer.Exit(1)


def _replay(
    plan: Path,
    spec: str,
    scale: float,
    hours: float | None,
    minutes: float | None,
    compress: float,
    idle_s: float | None,
    max_environments: int,
    start_concurrency: int,
    start_limit: int | None,
    seed: int,
    as_json: bool,
    given: dict[str, bool],
) -> None:
    """`run-local --traffic`: check every argument, then replay (see `replay_traffic`)."""
    from ground.plan import Plan
    from runtime.traffic_replay import replay_arrivals

    _refuse_clash(
        given, "--traffic", "--traffic replays a request stream; {flags} shape one batch."
    )
    arrivals = replay_arrivals(
        spec,
        scale=scale,
        hours=hours,
        minutes=minutes,
        compress=compress,
        idle_s=idle_s,
        max_environments=max_environments,
        start_concurrency=start_concurrency,
        start_limit=start_limit,
        seed=seed,
    )
    document = Plan.load(plan)
    ref = document.model
    if ref.model_type.startswith("shape:"):
        raise UsageError(
            f"'{plan}' plans the model shape {ref.model}, which has no weights to run.",
            "run-local runs real weights: plan a model you have (--traces or --counts).",
        )
    # Every argument is checked: only now start the model, moto, the CDK and the processes.
    from runtime.traffic_replay import replay_traffic

    model = load_with_status(
        ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy, ref.weights
    )
    with err.status("replaying the traffic") as status:
        summary = replay_traffic(
            plan,
            model,
            arrivals,
            compress=compress,
            idle_s=idle_s,
            max_environments=max_environments,
            prewarm_concurrency=start_concurrency,
            start_limit=start_limit,
            seed=seed,
            progress=status.update,
        )
    if as_json:
        print(json.dumps(summary))
    else:
        _render_serve.replay(stdout(), summary)
    if summary["measured"]["failed_batches"]:
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
