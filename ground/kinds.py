"""What kind of file a path is, so that a file given to the wrong option is named, not parsed.

Commands take several kinds of files (counts, plans, GPU plans, trace directories, cluster
traces, ...). Given one of another kind, a schema error ("format_version: Input should be 2")
says nothing useful; `refuse_other_kind` recognises the file by its content and says what it is
and which command takes it. Recognition is by structure (JSON keys, the files a directory holds,
a CSV header), cheap, and never executes or unpickles anything.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ground.errors import UsageError

__all__ = ["KINDS", "Kind", "detect_kind", "refuse_other_kind"]


@dataclass(frozen=True)
class Kind:
    """A kind of file: what it is, and the command that takes it."""

    name: str
    what: str  # "a counts file from `moelambda predict --counts-out`"
    use: str  # "pass it to `moelambda plan --counts`"


KINDS = {
    k.name: k
    for k in (
        Kind(
            "counts",
            "a counts file (from `moelambda predict --counts-out`)",
            "pass it as --counts to `moelambda plan` or `moelambda compare`",
        ),
        Kind(
            "plan",
            "a serverless plan (from `moelambda plan`)",
            "pass it as --plan to `moelambda synth` or `moelambda run-local`",
        ),
        Kind(
            "gpu-plan",
            "a GPU plan (from `moelambda gpu-plan`)",
            "run it with `moelambda run-gpu --plan`",
        ),
        Kind(
            "trace",
            "a routing trace (from `moelambda profile`)",
            "pass its directory as --traces to predict, plan, backtest, bo or gpu-plan",
        ),
        Kind(
            "tables",
            "count tables (from `moelambda predict --tables-out`)",
            "pass them as --tables to `moelambda predict`",
        ),
        Kind(
            "weights",
            "a weight export (from `moelambda export`)",
            "deploy it with the plan made for the same model",
        ),
        Kind(
            "calibration",
            "a calibration file",
            "pass it as --calibration to plan, backtest, bo or calibrate",
        ),
        Kind(
            "choice",
            "a `moelambda choose` summary",
            "its chosen plan is plan.json in the same directory",
        ),
        Kind(
            "cluster-trace",
            "a GPU-cluster training trace (CSV of jobs)",
            "pass it as --trace to `moelambda cluster simulate`",
        ),
        Kind(
            "requests",
            "a request-arrival trace (CSV of timestamps and token counts)",
            "pass it as --traffic",
        ),
    )
}

_JSON_KEYS = (  # the first set of keys a document holds decides its kind
    ({"solver", "layers", "totals"}, "plan"),
    ({"scheduler", "gpu_types", "layers"}, "gpu-plan"),
    ({"counts", "method", "experts"}, "counts"),
    ({"schema_version", "parameters"}, "calibration"),
    ({"options", "chosen", "floor"}, "choice"),
    ({"stages", "family", "format_version"}, "weights"),
)


def _json_kind(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for keys, kind in _JSON_KEYS:
        if keys <= data.keys():
            return kind
    return None


def _npz_kind(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return None
    if "experts.npy" in names and "token_ids.npy" in names:
        return "trace"
    if "keys_0.npy" in names:
        return "tables"
    return None


def _csv_kind(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8") as handle:
            header = handle.readline().strip().lower()
    except (OSError, UnicodeDecodeError):
        return None
    columns = {c.strip() for c in header.split(",")}
    if {"timestamp", "contexttokens"} <= columns:
        return "requests"
    if "num_gpu" in columns or {"submit_time", "duration"} <= columns:
        return "cluster-trace"
    return None


def detect_kind(path: str | Path) -> str | None:
    """The kind of `path` (a key of `KINDS`), or None when it is none of them (or missing)."""
    path = Path(path)
    if path.is_dir():
        for name, kind in (
            ("trace.npz", "trace"),
            ("tables.npz", "tables"),
            ("choose.json", "choice"),
            ("manifest.json", "weights"),
        ):
            if (path / name).is_file():
                return kind
        return None
    if not path.is_file():
        return None
    head = path.read_bytes()[:2]
    if head == b"PK":
        return _npz_kind(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _csv_kind(path)
    return _json_kind(path)


def refuse_other_kind(path: str | Path, expected: str | tuple[str, ...], option: str) -> None:
    """Raise when `path` is recognisably another kind of file than `expected`.

    Raises:
        UsageError: The file is of another known kind; the message names it and the command
            that takes it. Unknown or missing files pass: their own loader explains.
    """
    wanted = (expected,) if isinstance(expected, str) else expected
    found = detect_kind(path)
    if found is None or found in wanted:
        return
    kind = KINDS[found]
    expect = " or ".join(KINDS[w].what for w in wanted)
    raise UsageError(
        f"'{path}' is {kind.what}, but {option} takes {expect}.",
        f"{kind.use}; for {option}, give {expect}.",
    )
