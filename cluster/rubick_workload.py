"""The Rubick artifact's job traces and profiled iteration times (`cluster/data/rubick/`).

A trace row is a job: submission time, model, requested GPUs, the user's plan, its length in
iterations (`steps`) and whether it is guaranteed (`is_sla`, the multi-tenant trace). The
profiles hold measured iteration times per (plan, placement): the simulator runs jobs at
these *measured* speeds while the scheduler decides with the *predicted* ones, as in the
artifact, so prediction error shows up in the results.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import scipy.interpolate

from cluster.rubick_model import MODELS
from ground.errors import UsageError

__all__ = ["RUBICK_DATA", "Profile", "Trace", "load_trace", "placement_id", "shipped_workloads"]

RUBICK_DATA = Path(__file__).resolve().parent / "data" / "rubick"
_COLUMNS = ("name", "submission_time", "application", "num_gpus", "exec_plan", "steps", "is_sla")


def shipped_workloads() -> list[str]:
    return sorted(p.stem for p in (RUBICK_DATA / "workloads").glob("*.csv"))


@dataclass(frozen=True)
class Trace:
    """A workload as parallel arrays (one entry per job, in submission order)."""

    names: tuple[str, ...]
    submit: np.ndarray
    model: tuple[str, ...]
    gpus: np.ndarray
    plan: tuple[str, ...]
    steps: np.ndarray
    sla: np.ndarray

    def __len__(self) -> int:
        return len(self.names)


def load_trace(workload: str | Path) -> Trace:
    """A shipped workload by name (`workload-base`, `naive`, ...) or a CSV in that format."""
    path = RUBICK_DATA / "workloads" / f"{workload}.csv"
    if not path.is_file():
        path = Path(workload)
    if not path.is_file():
        raise UsageError(
            f"workload '{workload}' is neither a shipped Rubick workload nor a file.",
            f"pass a CSV path or one of: {', '.join(shipped_workloads())}.",
        )
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or any(c not in rows[0] for c in _COLUMNS):
        raise UsageError(
            f"workload {path} has no jobs or lacks columns.",
            f"give a CSV with columns {', '.join(_COLUMNS)} and at least one row.",
        )
    unknown = sorted({r["application"] for r in rows} - MODELS.keys())
    if unknown:
        raise UsageError(
            f"workload {path} names models without a profile: {', '.join(unknown)}.",
            f"use only {', '.join(MODELS)}.",
        )
    rows.sort(key=lambda r: float(r["submission_time"]))
    steps = np.array([int(float(r["steps"])) for r in rows])
    if (steps < 1).any():
        raise UsageError(f"workload {path} has jobs of no steps.", "give every job steps >= 1.")
    return Trace(
        names=tuple(r["name"] for r in rows),
        submit=np.array([float(r["submission_time"]) for r in rows]),
        model=tuple(r["application"] for r in rows),
        gpus=np.array([int(float(r["num_gpus"])) for r in rows]),
        plan=tuple(r["exec_plan"] for r in rows),
        steps=steps,
        sla=np.array([bool(int(float(r["is_sla"]))) for r in rows]),
    )


def placement_id(counts: tuple[int, ...]) -> str:
    """The profiles' key of a placement (GPUs per node): the digits of its smallest rotation,
    so the same ring of nodes is one key whichever node it starts on."""
    counts = tuple(c for c in counts if c)
    return "".join(map(str, min(counts[i:] + counts[:i] for i in range(len(counts)))))


class Profile:
    """Measured iteration times (seconds) of one model, looked up as the artifact does."""

    def __init__(self, model: str) -> None:
        with (RUBICK_DATA / "profiles" / model / "placements.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        self._exact: dict[tuple[str, str], float] = {}
        for r in rows:  # the first row of a (plan, placement) wins, as in the artifact
            self._exact.setdefault((r["exec_plan"], r["placement"]), float(r["iter_time"]))
        shape = np.array([(len(r["placement"]), sum(map(int, r["placement"]))) for r in rows])
        times = np.array([float(r["iter_time"]) for r in rows])
        keys, inverse = np.unique(shape, axis=0, return_inverse=True)
        means = np.bincount(inverse.ravel(), weights=times) / np.bincount(inverse.ravel())
        self._means = {tuple(map(int, k)): float(v) for k, v in zip(keys, means, strict=True)}
        self._interp = scipy.interpolate.LinearNDInterpolator(keys, means)

    @cache  # noqa: B019 - one Profile per model lives for the process
    def iter_time(self, counts: tuple[int, ...], family: str) -> float:
        """The plan family's row at this placement, else the GA row there (the artifact's
        fallback), else the mean over rows of the same node and GPU count, else a linear
        interpolation over those means (NaN outside them)."""
        key = placement_id(counts)
        for plan in (family, "ga"):
            if (plan, key) in self._exact:
                return self._exact[plan, key]
        shape = (len(key), sum(map(int, key)))
        if shape in self._means:
            return self._means[shape]
        return float(self._interp(*shape))


@cache
def profile(model: str) -> Profile:
    return Profile(model)
