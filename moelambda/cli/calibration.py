"""Commands on the platform parameters the planner uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from moelambda.cli._app import JsonOpt, app, renamed, stdout, user_errors


@app.command()
@user_errors
def calibration(
    calibration: Annotated[
        Path | None, typer.Option(help="Calibration JSON to check (default: the packaged one).")
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", hidden=True)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show (and validate) the platform parameters the planner uses, with units and sources."""
    from planner import load_calibration

    cal = load_calibration(renamed("--file", "--calibration", file, calibration))
    rows = cal.describe()
    if as_json:
        print(
            json.dumps(
                {
                    "file": str(cal.source_path),
                    "region": cal.region,
                    "parameters": {
                        n: {"value": v, "unit": u, "source": src} for n, v, u, src in rows
                    },
                }
            )
        )
        return
    table = Table(title=f"Calibration ({cal.region}): {cal.source_path}")
    for column in ("parameter", "value", "unit", "source"):
        table.add_column(column, overflow="fold")
    for name, value, unit, source in rows:
        table.add_row(name, json.dumps(value), unit, source)
    stdout().print(table)
