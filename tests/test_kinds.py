"""A file of the wrong kind is refused by name, with the command that takes it: exit 2, no
traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.kinds import KINDS, detect_kind
from moelambda.cli import app
from planner import default_calibration_path

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small file of every kind, recognisable by structure."""
    root = tmp_path_factory.mktemp("kinds")
    made = {
        "counts": root / "counts.json",
        "plan": root / "plan.json",
        "gpu-plan": root / "gpu-plan.json",
        "trace": root / "trace",
        "tables": root / "tables",
        "calibration": default_calibration_path(),
        "choice": root / "choose",
        "cluster-trace": root / "jobs.csv",
        "requests": root / "arrivals.csv",
    }
    made["counts"].write_text(
        json.dumps(
            {
                "model": "minilm",
                "experts": 2,
                "top_k": 1,
                "tokens": 4,
                "method": "m",
                "counts": [[2, 2]],
            }
        )
    )
    made["plan"].write_text(json.dumps({"solver": "exact", "layers": [], "totals": {}}))
    made["gpu-plan"].write_text(json.dumps({"scheduler": "lina", "gpu_types": [], "layers": []}))
    made["trace"].mkdir()
    np.savez(made["trace"] / "trace.npz", experts=np.zeros(2), token_ids=np.zeros(2))
    made["tables"].mkdir()
    np.savez(made["tables"] / "tables.npz", keys_0=np.zeros(2))
    made["choice"].mkdir()
    (made["choice"] / "choose.json").write_text(
        json.dumps({"options": [], "chosen": None, "floor": {}})
    )
    made["cluster-trace"].write_text("job_id,num_gpu,submit_time,iterations,model_name,ddl\n")
    made["requests"].write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    return made


def test_every_kind_is_recognised(files: dict[str, Path]) -> None:
    assert set(files) <= set(KINDS)
    for kind, path in files.items():
        assert detect_kind(path) == kind, path
    assert detect_kind(files["plan"].parent / "nothing-here") is None


# (command and its arguments before the file, the option, the kinds it takes)
COMMANDS = [
    (["synth", "--out", "{out}"], "--plan", ("plan",)),
    (["run-local"], "--plan", ("plan",)),
    (["run-gpu"], "--plan", ("gpu-plan",)),
    (["plan", "--out", "{out}/p.json"], "--counts", ("counts",)),
    (["plan", "--out", "{out}/p.json"], "--traces", ("trace",)),
    (["predict", "--counts-out", "{out}/c.json"], "--traces", ("trace",)),
    (["backtest", "--plot", "{out}/b.png"], "--traces", ("trace",)),
    (["bo", "--plot", "{out}/bo.png"], "--traces", ("trace",)),
    (["gpu-plan", "--gpus", "2", "--out", "{out}/g.json"], "--traces", ("trace",)),
    (["compare", "--slo", "60", "--rps", "1", "--plot", "{out}/c.png"], "--counts", ("counts",)),
    (["calibration"], "--calibration", ("calibration",)),
    (["cluster", "simulate", "--scheduler", "edf"], "--trace", ("cluster-trace",)),
]


@pytest.mark.parametrize(("args", "option", "takes"), COMMANDS)
def test_a_file_of_another_kind_is_refused_by_name(
    args: list[str], option: str, takes: tuple[str, ...], files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    for kind, path in files.items():
        if kind in takes:
            continue
        command = [a.replace("{out}", str(out)) for a in args] + [option, str(path)]
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert KINDS[kind].what.split(" (")[0] in result.output, (command, result.output)
        assert "Traceback" not in result.output
        assert not out.exists(), command
