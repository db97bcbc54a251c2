"""A `measured` calibration entry is a claim anyone can re-check: each names, in `command`, the
command that measures it (run from the repository's root), and that command exists and runs.
Its `--dry-run` exits 0 in seconds and names the entry it would measure, so a renamed script, a
dropped option or an entry no command measures any more fails here. The validator refuses a
measured entry without a command."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ground.errors import CalibrationError
from planner.calibration import Parameter, default_calibration_path, load_calibration

ROOT = Path(__file__).resolve().parents[2]
RAW: dict[str, Any] = json.loads(default_calibration_path().read_text(encoding="utf-8"))
PARAMETERS: dict[str, dict[str, Any]] = RAW["parameters"]


def _is_measured(entry: dict[str, Any]) -> bool:
    kind = entry.get("source_kind")
    kinds = set(kind.values()) if isinstance(kind, dict) else {kind}
    if kind is None:  # read off the source, as the validator does
        kinds = {entry["source"].strip().split(" ", 1)[0].rstrip(":").lower()}
    return "measured" in kinds


MEASURED = sorted(name for name, entry in PARAMETERS.items() if _is_measured(entry))
_CLI = "import sys; from moelambda.cli import main; sys.argv[0] = 'moelambda'; main()"


def _argv(command: str) -> list[str]:
    """The command as this test runs it: `moelambda ...` through this interpreter's CLI,
    `python scripts/X.py ...` with this interpreter; anything else is not a command here."""
    words = shlex.split(command)
    if words[0] == "moelambda":
        return [sys.executable, "-c", _CLI, *words[1:]]
    assert words[0] == "python" and len(words) > 1, f"{command!r}: moelambda or python scripts/"
    script = ROOT / words[1]
    assert script.parent == ROOT / "scripts" and script.is_file(), f"{words[1]} is no script"
    return [sys.executable, str(script), *words[2:]]


def test_the_packaged_file_has_measured_entries() -> None:
    assert "expert_token_compute_s" in MEASURED and "driver_runtime_mb" in MEASURED


@pytest.mark.parametrize("name", MEASURED)
def test_each_measured_entry_names_a_command_whose_dry_run_names_it(name: str) -> None:
    command = PARAMETERS[name].get("command")
    assert isinstance(command, str) and command, f"{name} is measured but names no command"
    result = subprocess.run(
        [*_argv(command), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert name in result.stdout, (command, result.stdout)
    assert "nothing measured" in result.stdout, result.stdout


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["driver_runtime_mb", "cold_start_reference"])
def test_a_measured_entry_without_its_command_is_refused(tmp_path: Path, name: str) -> None:
    raw = copy.deepcopy(RAW)
    del raw["parameters"][name]["command"]
    with pytest.raises(CalibrationError, match=rf"parameters\.{name}.*needs the command") as err:
        load_calibration(_write(tmp_path, raw))
    assert "assumed, derived" in str(err.value)


def test_a_value_measured_in_one_key_only_needs_a_command_too() -> None:
    fields: dict[str, Any] = {
        "value": {"a": 1, "b": 2},
        "unit": "s",
        "source": "assumed: b; a measured here",
        "as_of": date(2026, 12, 6),
        "source_kind": {"a": "measured", "b": "assumed"},
    }
    with pytest.raises(ValidationError, match="needs the command"):
        Parameter(**fields)
    assert Parameter(**fields, command="python scripts/x.py").kinds() == {"measured", "assumed"}
    assert Parameter(**fields | {"source_kind": "assumed"}).command is None  # not measured
