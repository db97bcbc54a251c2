"""Readable parts of `moelambda run-local`'s summary that say what its numbers are: the seconds
of each function, this machine's against the plan's for Lambda, and what the metered run's
requests, GB-seconds and bill mean (`runtime.local.metering`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def seconds_table(summary: dict[str, Any]) -> Table:
    """Per function the cost model's seconds per call on Lambda, this machine's, their ratio."""
    compared = summary["predicted_vs_measured"]
    table = Table(
        title="seconds per call: predicted for Lambda (cost model) vs measured on this machine "
        "(in-process, moto)"
    )
    for column in ("function", "predicted", "measured", "measured / predicted", "calls"):
        table.add_column(column, justify="left" if column == "function" else "right")
    rows = sorted(compared["functions"].items(), key=lambda kv: -(kv[1]["measured_s"] or 0.0))
    for name, entry in rows:
        predicted, measured = entry["predicted_s"], entry["measured_s"]
        ratio = entry.get("measured_over_predicted")
        table.add_row(
            name,
            "-" if predicted is None else f"{predicted:.3f}",
            "-" if measured is None else f"{measured:.3f}",
            "-" if ratio is None else f"{ratio:.2f} x",
            str(entry["calls"]),
        )
    return table


def metering(console: Console, summary: dict[str, Any]) -> None:
    """The metered run's verdict: requests exactly as planned, GB-seconds this machine's."""
    block = summary.get("metering")
    if block is None:
        return
    for line in block["lines"]:
        console.print(f"{line}.", highlight=False)


def driver_layers(console: Console, summary: dict[str, Any]) -> None:
    """The driver's layers with remote experts: measured against the model's rule (local
    experts while the remote calls run: the longer of the two), and the two run in turn."""
    block = summary.get("driver_layers")
    if block is None:
        return
    ratio = block["measured_over_priced"]
    console.print(
        f"driver layers with remote experts ({block['layers']}): measured "
        f"{block['measured_s']:.3f} s against {block['priced_s']:.3f} s as the model prices "
        f"them (local experts while the remote calls run); {block['sequential_s']:.3f} s one "
        f"after the other; measured / priced {'-' if ratio is None else f'{ratio:.2f}'}.",
        highlight=False,
    )
