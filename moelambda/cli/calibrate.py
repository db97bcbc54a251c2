"""`moelambda calibrate`: measure U_j, the expert compute time per token, and store it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, check_file_out, err, stdout, user_errors

# The calibration entries each form of the command measures (their `command` in the file).
COMPUTE_ENTRIES = ("expert_token_compute_s", "expert_compute_reference")
COLD_ENTRIES = ("cold_start_reference",)
WEIGHTS_ENTRIES = ("weights_speed",)
DECODE_ENTRIES = ("decode_step_table",)


def _dry_run(entries: tuple[str, ...], source: Path, target: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"dry_run": True, "entries": list(entries), "file": str(target)}))
        return
    stdout().print(
        f"dry run: would measure {', '.join(entries)} and write them to {target} (from "
        f"{source}); nothing measured or written",
        highlight=False,
        soft_wrap=True,
    )


def _print_table(summary: dict[str, Any]) -> None:
    console = stdout()
    console.print(
        f"Reference expert: hidden {summary['hidden']}, width {summary['width']}, "
        f"{summary['flops_per_token']:,} FLOP/token, batch {summary['batch_tokens']} tokens, "
        f"{summary['cpu_model']}, torch {summary['torch_version']}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"t1 = {summary['t1_s_per_token'] * 1e6:.3f} us/token (1 thread), "
        f"t2 = {summary['t2_s_per_token'] * 1e6:.3f} us/token (2 threads), "
        f"efficiency t1/(2 t2) = {summary['threads_efficiency']:.3f}",
        highlight=False,
        soft_wrap=True,
    )
    table = Table(title=f"U_j written to {summary['file']}")
    for column in ("memory (MB)", "vCPUs", "U_j (us/token)"):
        table.add_column(column, justify="right")
    for row in summary["options"]:
        table.add_row(
            str(row["memory_mb"]),
            f"{row['vcpus']:.3f}",
            f"{row['expert_token_compute_s'] * 1e6:.3f}",
        )
    console.print(table)


def _decode_table(source: Path, target: Path, as_json: bool) -> None:
    """`calibrate --decode-table`: `planner.calibrate.calibrate_decode_table`, rendered."""
    from planner.calibrate import calibrate_decode_table

    with err.status("measuring decode steps") as status:
        report = calibrate_decode_table(source, target, progress=status.update)
    if as_json:
        print(json.dumps(report))
        return
    table = Table(title=f"decode_step_table[{report['model']}] written to {report['file']}")
    for column in ("sequences", "step (ms)", "tokens/s"):
        table.add_column(column, justify="right")
    for b, step, rate in zip(
        report["batches"], report["step_s"], report["tokens_per_s"], strict=True
    ):
        table.add_row(str(b), f"{step * 1e3:.1f}", f"{rate:.1f}")
    stdout().print(table)


@app.command()
@user_errors
def calibrate(
    calibration: Annotated[
        Path | None,
        typer.Option(help="Calibration JSON to start from (default: the packaged one)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Where to write the updated calibration (default: --calibration)."),
    ] = None,
    tokens: Annotated[int, typer.Option(help="Tokens per timed expert call.")] = 1024,
    repeats: Annotated[int, typer.Option(help="Timed calls per thread count (median).")] = 50,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold",
            help="Measure each handler's INIT instead (fresh processes: imports, then the "
            "stage's weights from moto S3) and store it as cold_start_reference.",
        ),
    ] = False,
    cold_repeats: Annotated[
        int, typer.Option(help="With --cold: fresh processes per handler role (median).")
    ] = 3,
    weights: Annotated[
        bool,
        typer.Option(
            "--weights",
            help="Measure each weight precision's speed against float32 instead (bf16, int8: "
            "the reference expert and a SmolLM2 MoE decode step, `bench precision`) and store "
            "it as weights_speed.",
        ),
    ] = False,
    decode_table: Annotated[
        bool,
        typer.Option(
            "--decode-table",
            help="Measure the SmolLM2 MoE's decode step at 1, 2, 4, 8 and 16 sequences "
            "instead (one torch thread, the thread's CPU seconds; and its wall time on two "
            "threads over one, the serial share) and store it as decode_step_table, which "
            "stream plans use for that model's workers. Needs two idle CPUs.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Name the calibration entries this would measure and the file it would "
            "write, and exit without measuring or writing.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure U_j, the seconds per token of one expert at each memory size, and store it.

    Times the default model's expert FFN with torch on 1 and 2 threads, scales by the CPU share
    Lambda gives each memory option, and writes expert_token_compute_s and
    expert_compute_reference into the calibration file. Run it on an idle machine. With
    --cold, measures the handlers' INIT instead (`runtime.coldstart.calibrate_cold`); with
    --weights, each precision's speed (`planner.calibrate.calibrate_weights`); with
    --decode-table, the SmolLM2 MoE's decode step per batch size
    (`planner.calibrate.calibrate_decode_table`).
    """
    from planner import default_calibration_path

    source = calibration or default_calibration_path()
    target = out or source
    if cold + weights + decode_table > 1:
        raise UsageError(
            "--cold, --weights and --decode-table measure different entries.",
            "pass one of them.",
        )
    if dry_run:
        entries = (
            COLD_ENTRIES
            if cold
            else WEIGHTS_ENTRIES
            if weights
            else DECODE_ENTRIES
            if decode_table
            else COMPUTE_ENTRIES
        )
        _dry_run(entries, source, target, as_json)
        return
    check_file_out(target, True, "--out" if out is not None else "--calibration")
    if decode_table:
        _decode_table(source, target, as_json)
        return
    if cold:
        from moelambda.cli.traffic import calibrate_cold

        calibrate_cold(source, target, cold_repeats, as_json)
        return
    if weights:
        from planner.calibrate import calibrate_weights

        with err.status("measuring the precisions") as status:
            report = calibrate_weights(source, target, progress=status.update)
        if as_json:
            print(json.dumps(report))
            return
        from moelambda.cli.precision import print_report

        print_report(report)
        stdout().print(f"weights_speed written to {target}", highlight=False)
        return
    from planner.calibrate import BUSY_CPUS, calibrate_compute, check_calibrate

    check_calibrate(tokens, repeats, target)
    with err.status("loading the reference expert") as status:
        summary = calibrate_compute(
            source, target, tokens=tokens, repeats=repeats, progress=status.update
        )
    busy = summary["background_cpus"]
    if busy is not None and busy > BUSY_CPUS:
        err.print(
            f"[yellow]warning:[/] other processes kept {busy:.2f} CPUs busy while measuring; "
            "the times are likely too slow. Re-run on an idle machine.",
            highlight=False,
        )
    if as_json:
        print(json.dumps(summary))
    else:
        _print_table(summary)
