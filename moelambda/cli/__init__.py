"""The `moelambda` command line.

Every command that a script may read takes `--json` and then prints exactly one JSON object on
stdout; progress and messages go to stderr. Errors the user can fix exit with code 2 and a message
ending in "To fix: ...", without a traceback.
"""

# ruff: noqa: I001  (the import order is the order `moelambda --help` lists the commands in)
from __future__ import annotations

from moelambda.cli._app import app
from moelambda.cli import model  # noqa: F401  (importing a command module registers it)
from moelambda.cli import quality  # noqa: F401
from moelambda.cli import precision  # noqa: F401
from moelambda.cli import choose  # noqa: F401
from moelambda.cli import predict  # noqa: F401
from moelambda.cli import plan  # noqa: F401
from moelambda.cli import backtest  # noqa: F401
from moelambda.cli import bo  # noqa: F401
from moelambda.cli import synth  # noqa: F401
from moelambda.cli import serve  # noqa: F401
from moelambda.cli import calibration  # noqa: F401
from moelambda.cli import calibrate  # noqa: F401
from moelambda.cli import traffic  # noqa: F401
from moelambda.cli import replan  # noqa: F401
from moelambda.cli import gpu  # noqa: F401
from moelambda.cli import cluster  # noqa: F401
from moelambda.cli import generate  # noqa: F401
from moelambda.cli import stream  # noqa: F401

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="moelambda")
