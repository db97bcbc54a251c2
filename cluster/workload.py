"""What a cluster simulation runs: jobs from a trace, their scaling curves, the cluster's shape.

The traces, throughput tables and cluster shapes are the ElasticFlow artifact's, copied into
`cluster/data/` with their licences (`cluster/data/SOURCES.md`); a trace may also be any CSV
in the artifact's formats. Throughputs are iterations per second at 1, 2, 4, ... GPUs per
(model, global batch): the scaling curve the schedulers read, with the compact placement the
buddy allocator gives (as the artifact assumes).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ground.errors import UsageError

__all__ = [
    "DATA",
    "Cluster",
    "Job",
    "ScalingCurve",
    "load_cluster",
    "load_curves",
    "load_trace",
    "shipped_traces",
]

DATA = Path(__file__).resolve().parent / "data"
_EF = DATA / "elasticflow"
_SHAPE = re.compile(r"n(\d+)g(\d+)")


@dataclass(frozen=True)
class Job:
    """One training job of a trace; times in seconds on the trace's clock."""

    id: int
    submit: float
    iterations: float
    model: str
    batch: int
    gpus: int  # what the user asked for: the non-elastic schedulers give exactly this
    deadline: float  # absolute; inf for a best-effort job
    duration: float  # the trace's run time at `gpus`


@dataclass(frozen=True)
class ScalingCurve:
    """Iterations per second of one (model, batch) at each profiled GPU count.

    `levels` are the counts a job may hold (1, 2, 4, ... up to `max_gpus`); `rate[i]` is the
    throughput at `levels[i]`, which need not rise with it (the schedulers that give a job
    more GPUs than help it are part of what the artifacts measure).
    """

    levels: np.ndarray
    rate: np.ndarray

    @property
    def max_gpus(self) -> int:
        return int(self.levels[-1])

    def at(self, gpus: int | np.ndarray) -> np.ndarray:
        """Throughput with `gpus` (0 gives 0; a count between levels runs at the level below)."""
        g = np.asarray(gpus)
        index = np.searchsorted(self.levels, g, side="right") - 1
        return np.where(g > 0, self.rate[np.clip(index, 0, None)], 0.0)

    def level_at_most(self, gpus: int | np.ndarray) -> np.ndarray:
        """The largest level <= `gpus` (0 when not even one GPU)."""
        g = np.asarray(gpus)
        index = np.searchsorted(self.levels, g, side="right") - 1
        return np.where(index >= 0, self.levels[np.clip(index, 0, None)], 0)

    def capped(self, max_gpus: int) -> ScalingCurve:
        """The same curve without the levels above `max_gpus`."""
        keep = self.levels <= max_gpus
        return ScalingCurve(self.levels[keep], self.rate[keep])

    @cached_property
    def by_count(self) -> tuple[np.ndarray, np.ndarray]:
        """(level, rate) for every GPU count 0..1024 at once: what the planners index with
        whole arrays of counts instead of searching the levels each time."""
        counts = np.arange(1025)
        level = self.level_at_most(counts)
        return level, self.at(level)


@dataclass(frozen=True)
class Cluster:
    """Nodes of equal GPUs, behind `switches` switches of equal size. The switches matter
    only to ElasticFlow's placement: the artifact numbers nodes within each switch."""

    nodes: int
    gpus_per_node: int
    switches: int = 1

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def load_cluster(spec: str | Path) -> Cluster:
    """`n16g4` (16 nodes of 4 GPUs; a shape the artifact ships, such as n64g8, with the
    artifact's switches) or a cluster-spec CSV of the artifact's format."""
    match = _SHAPE.fullmatch(str(spec))
    shipped = _EF / "cluster_specs" / f"{spec}.csv"
    if match and not shipped.is_file():
        return Cluster(int(match[1]), int(match[2]))
    path = shipped if match else Path(spec)
    if not path.is_file():
        raise UsageError(
            f"cluster '{spec}' is neither a shape like n16g4 nor a file.",
            "pass --cluster n16g4 (nodes x GPUs per node) or an artifact cluster-spec CSV.",
        )
    with path.open() as f:
        row = next(csv.DictReader(f))
    switches = int(row["num_switch"])
    nodes = switches * int(row["num_node_p_switch"])
    return Cluster(nodes, int(row["num_gpu_p_node"]), switches)


def load_curves(gpu_type: str) -> dict[tuple[str, int], ScalingCurve]:
    """Every (model, global batch) throughput table profiled on `gpu_type` (T4 or A100): all
    the GPU counts profiled (a "nan" or "-" cell is not), whether or not more GPUs help. Each
    scheduler caps the levels it may give (`ScalingCurve.capped`), as its artifact does."""
    folder = _EF / f"throughputs_{gpu_type.upper()}"
    if not folder.is_dir():
        raise UsageError(f"no throughputs for GPU type '{gpu_type}'.", "use T4 or A100.")
    curves = {}
    for path in sorted(folder.glob("*.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                batch = int(row.pop("global_batch_size"))
                cells = [(int(g), float(v)) for g, v in row.items() if v not in ("", "-")]
                cells = [(g, r) for g, r in cells if math.isfinite(r)]
                curves[path.stem, batch] = ScalingCurve(
                    np.array([g for g, _ in cells]), np.array([r for _, r in cells])
                )
    return curves


def shipped_traces() -> dict[str, Path]:
    """The traces the project ships, by name."""
    found = {p.stem: p for p in sorted((_EF / "traces").glob("*.csv"))}
    found |= {p.stem: p for p in sorted((_EF / "itp-clusters").glob("*.csv"))}
    return found


def load_trace(trace: str | Path) -> list[Job]:
    """A trace by its shipped name (`elasticVpollux_e`, `cluster01`, ...) or a CSV path, in
    either of the artifact's column sets. Times stay as the trace has them: Gandiva rotates
    its time slices on whole minutes of that clock."""
    path = shipped_traces().get(str(trace), Path(trace))
    if not path.is_file():
        raise UsageError(
            f"trace '{trace}' is neither a shipped trace nor a file.",
            f"pass a CSV path or one of: {', '.join(shipped_traces())}.",
        )
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise UsageError(f"trace {path} has no jobs.", "pass a trace with at least one job.")
    submit_key = "submit_time" if "submit_time" in rows[0] else "submission_time"
    iterations_key = "iteration" if "iteration" in rows[0] else "num_iteration"
    deadline_key = "ddl" if "ddl" in rows[0] else "deadline"
    try:
        return [
            Job(
                id=index,  # the artifact's job_idx: ITP traces name jobs by UUID
                submit=float(r[submit_key]),
                iterations=float(r[iterations_key]),
                model=r["model_name"],
                batch=int(r["batch_size"]),
                gpus=int(r["num_gpu"]),
                deadline=float(r[deadline_key])
                if r.get(deadline_key) not in (None, "", "inf")
                else float("inf"),
                duration=float(r["duration"]),
            )
            for index, r in enumerate(rows)
        ]
    except (KeyError, ValueError) as err:
        raise UsageError(
            f"trace {path} is not in the artifact's format ({err!r}).",
            "columns: job_id, submit_time, iteration, model_name, ddl, batch_size, num_gpu, "
            "duration (or the ITP traces' names).",
        ) from err
