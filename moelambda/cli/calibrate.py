"""`moelambda calibrate`: measure U_j, the expert compute time per token, and store it."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, err, stdout, user_errors

if TYPE_CHECKING:
    from planner import Calibration
    from planner.calibration import ExpertComputeReference
    from planner.compute import ExpertTiming

BUSY_CPUS = 0.25  # other processes' CPU use above which the timings are flagged as inflated


def _check(tokens: int, repeats: int, out: Path) -> None:
    """Fail on bad arguments before loading the model or timing anything."""
    if tokens < 1:
        raise UsageError(
            f"--tokens {tokens} is not a batch size.", "pass --tokens 1 or more (default 1024)."
        )
    if repeats < 1:
        raise UsageError(f"--repeats {repeats} times nothing.", "pass --repeats 1 or more.")
    if out.is_dir():
        raise UsageError(f"--out '{out}' is a directory.", "pass a calibration file name.")


def _summary(
    path: Path,
    timing: ExpertTiming,
    reference: ExpertComputeReference,
    calibration: Calibration,
    busy: float | None,
    repeats: int,
) -> dict[str, Any]:
    """The JSON object `--json` prints: the measurement, and U_j as written to `path`."""
    return {
        "file": str(path),
        "batch_tokens": timing.batch_tokens,
        "repeats": repeats,
        "hidden": reference.hidden,
        "width": reference.width,
        "flops_per_token": reference.flops_per_token,
        "t1_s_per_token": timing.t1_s_per_token,
        "t2_s_per_token": timing.t2_s_per_token,
        "threads_efficiency": timing.threads_efficiency,
        "cpu_model": reference.cpu_model,
        "torch_version": reference.torch_version,
        "background_cpus": busy,
        "options": [
            {"memory_mb": m, "vcpus": calibration.vcpus_at(m), "expert_token_compute_s": u}
            for m, u in zip(
                calibration.memory_options_mb, calibration.expert_token_compute_s, strict=True
            )
        ],
    }


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
    as_json: JsonOpt = False,
) -> None:
    """Measure U_j, the seconds per token of one expert at each memory size, and store it.

    Times the default model's expert FFN with torch on 1 and 2 threads, scales by the CPU share
    Lambda gives each memory option, and writes expert_token_compute_s and
    expert_compute_reference into the calibration file. Run it on an idle machine. With
    --cold, measures the handlers' INIT instead (`moelambda.coldstart.calibrate_cold`).
    """
    from planner import compute, default_calibration_path, load_calibration

    source = calibration or default_calibration_path()
    target = out or source
    if cold:
        from moelambda.cli.traffic import calibrate_cold

        calibrate_cold(source, target, cold_repeats, as_json)
        return
    _check(tokens, repeats, target)
    start = load_calibration(source)
    document = compute.read_document(source)
    with err.status("loading the reference expert") as status:
        stage = compute.reference_expert(progress=status.update)
        before = compute.cpu_times()
        timing = compute.measure_expert(stage, tokens, repeats, progress=status.update)
        busy = compute.background_cpus(before, compute.cpu_times())
    if busy is not None and busy > BUSY_CPUS:
        err.print(
            f"[yellow]warning:[/] other processes kept {busy:.2f} CPUs busy while measuring; "
            "the times are likely too slow. Re-run on an idle machine.",
            highlight=False,
        )
    reference = compute.expert_reference(stage, timing)
    compute_s = compute.token_compute_s(start, timing.t1_s_per_token, timing.threads_efficiency)
    written = compute.write_calibration(
        compute.calibrated_document(document, compute_s, reference, date.today()), target
    )
    summary = _summary(target, timing, reference, written, busy, repeats)
    if as_json:
        print(json.dumps(summary))
    else:
        _print_table(summary)
