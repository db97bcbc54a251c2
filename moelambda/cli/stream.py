"""`moelambda serve`: an OpenAI-compatible endpoint in front of a stream plan on moto."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import (
    JsonOpt,
    app,
    bench_app,
    err,
    load_with_status,
    stdout,
    user_errors,
)


@app.command("serve")
@user_errors
def serve(
    plan: Annotated[
        Path,
        typer.Option(
            help="A stream plan (`moelambda plan --traffic SPEC --slo-ttft S --slo-tpot S`)."
        ),
    ] = Path("out/plan.json"),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one).")] = 8000,
) -> None:
    """Serve the plan's deployment, locally on moto with the real handlers, behind an
    OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models; `stream`
    as server-sent events) until Ctrl-C or SIGTERM, which let the requests in flight finish:
    the `openai` client and curl work against it."""
    from runtime.serve import LocalServer, stream_plan

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port.", "pass a port from 1 to 65535, or 0.")
    document = stream_plan(plan)  # before the model loads
    ref = document.model
    if ref.model_type.startswith("shape:"):
        raise UsageError(
            f"'{plan}' plans the model shape {ref.model}, which has no weights to run.",
            "plan a model you have (--traces) to serve it.",
        )
    model = load_with_status(
        ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy, ref.weights
    )

    def stop(*_: object) -> None:  # SIGTERM (a service manager, `kill`) stops as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with err.status("starting") as status:
        server = LocalServer(plan, model, host=host, port=port, progress=status.update)
        server.__enter__()
    try:
        console = stdout()
        stream = document.stream
        assert stream is not None
        console.print(
            f"serving [bold]{ref.model}[/] at [bold]{server.url}/v1[/] ({stream.workers} "
            f"worker(s) of {stream.slots} slots; Ctrl-C stops)"
        )
        console.print(
            f"  curl {server.url}/v1/completions -H 'Content-Type: application/json' "
            f'-d \'{{"prompt": "The capital of France is", "max_tokens": 16}}\'',
            highlight=False,
            markup=False,
        )
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        err.print("stopping: finishing the requests in flight")
    finally:
        server.__exit__(None, None, None)


@bench_app.command("stream")
@user_errors
def bench_stream(
    plan: Annotated[
        Path, typer.Option(help="A stream plan of a model with weights (SmolLM2's, say).")
    ] = Path("out/plan.json"),
    requests: Annotated[int, typer.Option(help="Requests to replay.")] = 24,
    rate: Annotated[float, typer.Option(help="Arrivals per second (Poisson).")] = 0.25,
    max_prompt: Annotated[
        int, typer.Option(help="Prompt tokens at most (the trace's lengths, clipped).")
    ] = 256,
    max_new: Annotated[
        int, typer.Option(help="Tokens generated at most (the trace's lengths, clipped).")
    ] = 64,
    seed: Annotated[int, typer.Option(help="Seeds the arrivals, lengths and prompts.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Serve the plan here (one worker, moto, the real handlers and weights), replay an arrival
    stream against it from a client process, and set the measured TTFT/TPOT p50/p99 and decode
    tokens per second against the planner's simulator for the same arrivals, and the metered
    requests against the plan's."""
    from runtime.serve import stream_plan
    from runtime.stream_bench import bench_stream as run

    document = stream_plan(plan)
    ref = document.model
    if ref.model_type.startswith("shape:"):
        raise UsageError(
            f"'{plan}' plans the model shape {ref.model}, which has no weights to run.",
            "plan a model you have (--traces) to bench it.",
        )
    model = load_with_status(
        ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy, ref.weights
    )
    with err.status("bench stream") as status:
        report = run(
            plan,
            model,
            requests=requests,
            rate=rate,
            seed=seed,
            max_prompt=max_prompt,
            max_new=max_new,
            progress=status.update,
        )
    if as_json:
        print(json.dumps(report))
        return
    _render(report)


def _render(report: dict[str, Any]) -> None:
    console = stdout()
    if report["status"] != "SUCCEEDED":
        console.print(f"[bold red]failed:[/] {report['errors']}")
        raise typer.Exit(1)
    table = Table(
        title=f"{report['model']}: {report['requests']} requests at "
        f"{report['rate_per_s']:g}/s, one worker of {report['slots']} slots"
    )
    for column in ("", "measured", "simulated", "measured/simulated - 1"):
        table.add_column(column, justify="right")
    m, s, d = report["measured"], report["simulated"], report["measured_over_simulated_minus_1"]
    for label, key, q in (
        ("TTFT p50 (s)", "ttft_s", "p50"),
        ("TTFT p99 (s)", "ttft_s", "p99"),
        ("TPOT p50 (s)", "tpot_s", "p50"),
        ("TPOT p99 (s)", "tpot_s", "p99"),
    ):
        gap = d.get(f"{key.split('_')[0]}_{q}")
        table.add_row(
            label, f"{m[key][q]:.3f}", f"{s[key][q]:.3f}", "" if gap is None else f"{gap:+.1%}"
        )
    table.add_row(
        "decode tokens/s",
        f"{m['decode_tokens_per_s']:.1f}",
        f"{s['decode_tokens_per_s']:.1f}",
        f"{d['decode_tokens_per_s']:+.1%}",
    )
    console.print(table)
    same = "equal" if report["metered_equals_planned"] else "DIFFER"
    console.print(
        f"requests metered {report['requests_metered']} vs planned "
        f"{report['requests_planned']}: {same}"
    )
