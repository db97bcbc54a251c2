"""`moelambda bench precision`: tokens per second and bytes per token of each weight precision
on this machine (`planner.precision_bench`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, bench_app, err, stdout, user_errors


def print_report(report: dict[str, Any]) -> None:
    """The bench's table: one row per precision."""
    table = Table(
        title=f"Weight precisions on this machine (one torch thread, median of "
        f"{report['repeats']} interleaved rounds)"
    )
    for column in (
        "weights",
        "MiniLM tok/s",
        "MiniLM B/tok",
        "SmolLM2 decode tok/s (1)",
        "B/tok (1)",
        "tok/s (8)",
        "B/tok (8)",
        "decode x fp32 (1)",
        "TPOT (1) planned",
        "expert U_j x fp32",
    ):
        table.add_column(column, justify="right")
    for name, row in report["rows"].items():
        one, eight, speed = row["decode"]["1"], row["decode"]["8"], row["speed_vs_fp32"]
        table.add_row(
            name,
            f"{row['minilm_tokens_per_s']:,.0f}",
            f"{row['minilm_bytes_per_token']:,.0f}",
            f"{one['tokens_per_s']:.1f}",
            f"{one['bytes_per_token'] / 1e6:.1f} MB",
            f"{eight['tokens_per_s']:.1f}",
            f"{eight['bytes_per_token'] / 1e6:.1f} MB",
            f"{speed['decode_1_speedup']:.2f}",
            "-"
            if one["predicted_tpot_s"] is None
            else (f"{one['predicted_tpot_s'] * 1e3:.0f} ms (measured {one['tpot_s'] * 1e3:.0f})"),
            f"{speed['compute']:.2f}",
        )
    stdout().print(table)


@bench_app.command("precision")
@user_errors
def bench_precision(
    weights: Annotated[
        str, typer.Option(help="Comma-separated precisions to compare with fp32.")
    ] = "fp32,bf16,int8",
    repeats: Annotated[int, typer.Option(help="Interleaved rounds (median).")] = 5,
    as_json: JsonOpt = False,
) -> None:
    """Tokens per second and weight bytes per token at fp32, bf16 and int8: MiniLM E8 k6 on a
    batch, the SmolLM2 MoE decoding 1 and 8 sequences (one torch thread, as one Lambda vCPU)."""
    from ground.precision import parse_weights
    from moe import check_precision
    from planner.precision_bench import bench_precision as run

    if repeats < 1:
        raise UsageError(f"--repeats {repeats} times nothing.", "pass --repeats 1 or more.")
    names = [w.strip() for w in weights.split(",") if w.strip()]
    for name in names:
        check_precision(parse_weights(name))
    with err.status("measuring") as status:
        report = run(names, repeats=repeats, progress=status.update)
    if as_json:
        print(json.dumps(report))
        return
    print_report(report)
