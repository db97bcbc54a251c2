"""Measure a handler's INIT on this machine (`moelambda calibrate --cold`): fresh processes, real
imports, weights from moto S3. It lives beside the CLI, not in pipeline/, because it runs the
handlers of functions/ (the packages below never import the handlers they deploy).

Each sample is a new Python process (`python -c`), as a new execution environment is: it imports
the role's handler module (`functions.head`, `functions.layer`, `functions.expert`,
`functions.tail`, with torch, boto3 and the model code they pull in), then, inside its own moto
S3, uploads the export's manifest, config and the role's stage (not timed), downloads them once
(timed: the download alone), and builds the stage through `functions.weights` exactly as a
handler does on its first call (timed: download again plus reading and building). The parent
times the interpreter's start from `Popen` to the child's first statement.

`summarise` turns the samples into `planner.calibration.ColdStartReference`: the median of each
role's import, and the load time (build minus download) fitted as fixed + per-byte seconds over
the roles' different stage sizes, by least squares. `calibrate_cold` does all of it and writes
the result into a calibration file.

Example::

    from planner import default_calibration_path
    summary = calibrate_cold(default_calibration_path(), Path("out/calibration.json"), 3)
    print(summary["import_s"], summary["load_s_per_byte"])
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import CalibrationError, UsageError
from ground.manifest import HEAD_KEY, TAIL_KEY, expert_key, layer_key
from ground.progress import Status, quiet

__all__ = ["CHILD", "calibrate_cold", "measure_cold", "reference_export", "summarise"]

Progress = Callable[[str], None]

STAGES = {  # role -> (stage key, the weights.<role> call's extra arguments)
    "head": (HEAD_KEY, ()),
    "layer": (layer_key(0), (0,)),
    "expert": (expert_key(0, 0), (0, 0)),
    "tail": (TAIL_KEY, ()),
}

CHILD = r"""
import json, sys, time
started = time.time()
role, root, key, extra = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
import importlib
t0 = time.perf_counter()
importlib.import_module("functions." + role)
imported = time.perf_counter() - t0
import pathlib, tempfile
import boto3
from moto import mock_aws
from functions import weights
root = pathlib.Path(root)
config = [] if role == "expert" else sorted((root / "config").rglob("*"))  # as functions.weights
files = [root / "manifest.json", *config, root / key]
files = [f for f in files if f.is_file()]
with mock_aws():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="cold")
    for f in files:
        s3.upload_file(str(f), "cold", "w/" + f.relative_to(root).as_posix())
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for f in files:
            s3.download_file("cold", "w/" + f.relative_to(root).as_posix(), tmp + "/x")
        downloaded = time.perf_counter() - t0
    t0 = time.perf_counter()
    getattr(weights, role)(s3, "cold", "w/", *extra)
    built = time.perf_counter() - t0
config = [f for f in files if f.name == "manifest.json" or (root / "config") in f.parents]
print(json.dumps({
    "started": started, "import_s": imported, "download_s": downloaded, "build_s": built,
    "stage_bytes": (root / key).stat().st_size, "config_objects": len(config),
    "config_bytes": sum(f.stat().st_size for f in config),
    "manifest_bytes": (root / "manifest.json").stat().st_size,
}))
"""


def reference_export(out: Path, progress: Progress | None = None) -> Path:
    """The default model (MiniLM MoEfied into 4 experts, top-2, seed 0) exported to `out`."""
    from moe import export_model, load_model

    model = load_model("minilm", experts=4, top_k=2, seed=0, progress=progress)
    export_model(model, out, force=True)
    return out


def _sample(role: str, root: Path) -> dict[str, Any]:
    key, extra = STAGES[role]
    env = dict(os.environ)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env[name] = "testing"  # the child's S3 is moto's: never sign with a real credential
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("AWS_PROFILE", None)
    spawned = time.time()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, role, str(root), key, json.dumps(list(extra))],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise CalibrationError(
            f"measuring the {role} handler's INIT failed in its fresh process: "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}",
            "check that the package imports (`python -c 'import functions.expert'`) and that "
            "the export directory holds the model's weights.",
        )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["python_start_s"] = max(result.pop("started") - spawned, 0.0)
    return result | {"role": role}


def measure_cold(
    root: Path, repeats: int, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """`repeats` fresh-process samples of every role's INIT on the export under `root`.

    Roles alternate sample by sample, so drift on a shared machine hits all of them alike.
    """
    say = progress or (lambda _msg: None)
    samples = []
    for r in range(repeats):
        for role in STAGES:
            say(f"fresh process {r + 1}/{repeats}: {role} handler")
            samples.append(_sample(role, root))
    return samples


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The `cold_start_reference` entry of the calibration file from `measure_cold`'s samples.

    Load (build minus download) is fitted as fixed + per-byte seconds by least squares over
    the roles' medians; negative fits (noise on tiny stages) are clipped to 0.
    """
    roles = list(dict.fromkeys(s["role"] for s in samples))
    builders = [r for r in roles if r != "expert"] or roles

    def median(role: str, what: str) -> float:
        return statistics.median(s[what] for s in samples if s["role"] == role)

    stage_bytes = np.array([median(r, "stage_bytes") for r in roles], dtype=float)
    load = np.array([max(median(r, "build_s") - median(r, "download_s"), 0.0) for r in roles])
    design = np.column_stack([np.ones_like(stage_bytes), stage_bytes])
    (fixed, per_byte), *_ = np.linalg.lstsq(design, load, rcond=None)
    return {
        "python_start_s": statistics.median(s["python_start_s"] for s in samples),
        "import_s": {r: median(r, "import_s") for r in roles},
        "load_fixed_s": max(float(fixed), 0.0),
        "load_s_per_byte": max(float(per_byte), 0.0),
        # What a head, gate or tail downloads before its stage; an expert, the manifest alone.
        "config_objects": int(median(builders[0], "config_objects")),
        "config_bytes": int(median(builders[0], "config_bytes")),
        "manifest_bytes": int(median(roles[0], "manifest_bytes")),
        "repeats": len(samples) // len(roles),
        "samples": [
            {
                "role": r,
                "stage_bytes": int(median(r, "stage_bytes")),
                "import_s": median(r, "import_s"),
                "download_s": median(r, "download_s"),
                "build_s": median(r, "build_s"),
            }
            for r in roles
        ],
    }


def calibrate_cold(
    source: Path,
    target: Path,
    repeats: int = 3,
    *,
    status: Status = quiet,
) -> dict[str, Any]:
    """Measure every handler's INIT on this machine and write it into a calibration file.

    Exports the reference model to a temporary directory, samples each role `repeats` times in
    fresh processes (`measure_cold`), and writes `summarise`'s result as the
    `cold_start_reference` of `source`'s calibration into `target`.

    Example::

        summary = calibrate_cold(default_calibration_path(), Path("out/cal.json"), 5)
        print(summary["load_fixed_s"], summary["background_cpus"])

    Args:
        source: The calibration file to start from.
        target: Where to write the updated calibration (may be `source`).
        repeats: Fresh processes per handler role (the median is kept). Defaults to 3.
        status: Wraps the export and the measurement (a spinner in the CLI); gets an `update`.

    Returns:
        The `--json` summary: the file written, the CPUs other processes kept busy meanwhile
        (None: unknown) and the reference as written.

    Raises:
        UsageError: `repeats` below 1, or `target` a directory.
    """
    from planner import compute
    from planner.calibration import ColdStartReference
    from planner.traffic.platform import calibrated_cold_document

    if repeats < 1:
        raise UsageError(f"--cold-repeats {repeats} measures nothing.", "pass 1 or more.")
    if target.is_dir():
        raise UsageError(f"--out '{target}' is a directory.", "pass a calibration file name.")
    document = compute.read_document(source)
    compute.load_calibration(source)
    with tempfile.TemporaryDirectory(prefix="moelambda-cold-") as tmp:
        with status("exporting the reference model") as shown:
            root = reference_export(Path(tmp) / "weights", progress=shown.update)
            before = compute.cpu_times()
            samples = measure_cold(root, repeats, progress=shown.update)
            busy = compute.background_cpus(before, compute.cpu_times())
    import torch

    reference = ColdStartReference(
        **summarise(samples), torch_version=torch.__version__, cpu_model=compute.cpu_model()
    )
    written = compute.write_calibration(
        calibrated_cold_document(document, reference, date.today()), target
    )
    assert written.cold_start_reference is not None
    return {
        "file": str(target),
        "background_cpus": busy,
        **written.cold_start_reference.model_dump(),
    }
