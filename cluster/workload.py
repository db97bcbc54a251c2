"""What a cluster simulation runs: jobs from a trace, their scaling curves, the cluster's shape.

The traces, throughput tables and cluster shapes are the ElasticFlow artifact's, copied into
`cluster/data/` with their licences (`cluster/data/SOURCES.md`); a trace may also be any CSV
in the artifact's formats. Throughputs are iterations per second at 1, 2, 4, ... GPUs per
(model, global batch): the scaling curve the schedulers read (the artifact profiles each
count on one compact placement and reads the table whatever the placement).
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
from ground.kinds import KINDS, detect_kind, refuse_other_kind

__all__ = [
    "DATA",
    "NODE_CLASSES",
    "Cluster",
    "Job",
    "ScalingCurve",
    "check_fits",
    "load_cluster",
    "load_curves",
    "load_trace",
    "shipped_traces",
]

DATA = Path(__file__).resolve().parent / "data"
# The job sizes the ElasticFlow artifact keeps node sets for (`CLUSTER.node_g`): its elastic
# placement and Gandiva file node sets under these classes.
NODE_CLASSES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 88, 128, 256)
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

    def own_curve(self) -> ScalingCurve:
        """The job at the GPUs it asked for, at the rate its trace records (its iterations
        in its duration): what the non-elastic schedulers run it at."""
        return ScalingCurve(np.array([self.gpus]), np.array([self.iterations / self.duration]))


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
    def by_level(self) -> dict[int, float]:
        """Throughput at each level, for lookups one job at a time."""
        return dict(zip(self.levels.tolist(), self.rate.tolist(), strict=True))

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
    artifact's switches) or a cluster-spec CSV of the artifact's format. A cluster without
    nodes or GPUs is refused here, before any replay."""
    match = _SHAPE.fullmatch(str(spec))
    shipped = _EF / "cluster_specs" / f"{spec}.csv"
    if match and not shipped.is_file():
        cluster = Cluster(int(match[1]), int(match[2]))
    else:
        path = shipped if match else Path(spec)
        if not path.is_file():
            raise UsageError(
                f"cluster '{spec}' is neither a shape like n16g4 nor a file.",
                "pass --cluster n16g4 (nodes x GPUs per node) or an artifact cluster-spec CSV.",
            )
        cluster = _cluster_file(path)
    if cluster.nodes < 1 or cluster.gpus_per_node < 1:
        raise UsageError(
            f"cluster '{spec}' has {cluster.nodes} nodes of {cluster.gpus_per_node} GPUs.",
            "pass at least one node of at least one GPU, e.g. --cluster n16g4.",
        )
    return cluster


def check_fits(jobs: list[Job], cluster: Cluster) -> None:
    """Refuse a job asking for more GPUs than the cluster has: a scheduler that gives each job
    exactly its trace's GPUs (Tiresias, Gandiva) would leave it waiting forever."""
    big = next((j for j in jobs if j.gpus > cluster.gpus), None)
    if big is not None:
        raise UsageError(
            f"job {big.id} asks for {big.gpus} GPUs; the cluster has {cluster.gpus}.",
            "pass a larger --cluster, or drop the job from the trace.",
        )


def _cluster_file(path: Path) -> Cluster:
    columns = ("num_switch", "num_node_p_switch", "num_gpu_p_node")
    kind = detect_kind(path)
    if kind is not None:  # another of our files (a plan, a trace, ...): say which
        raise UsageError(
            f"'{path}' is {KINDS[kind].what}, but --cluster takes a shape like n16g4 or a "
            "cluster-spec CSV.",
            f"{KINDS[kind].use}; for --cluster, pass e.g. --cluster n16g4.",
        )
    try:
        with path.open(encoding="utf-8") as f:
            row = next(csv.DictReader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UsageError(
            f"cannot read the cluster spec '{path}' as CSV ({err}).",
            "pass --cluster n16g4 (nodes x GPUs per node) or an artifact cluster-spec CSV.",
        ) from err
    try:
        switches, per_switch, per_node = (int(row[c]) for c in columns)  # type: ignore[index]
    except (TypeError, KeyError, ValueError) as err:
        raise UsageError(
            f"cluster spec {path} has no whole-number {', '.join(columns)} row.",
            "use the artifact's format: a header line and one row of whole numbers.",
        ) from err
    return Cluster(switches * per_switch, per_node, max(switches, 1))


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


_COLUMNS = {  # the two column sets of the artifact's traces: Pollux-style and ITP
    "submit": ("submit_time", "submission_time"),
    "iterations": ("iteration", "num_iteration"),
    "deadline": ("ddl", "deadline"),
}


def load_trace(trace: str | Path) -> list[Job]:
    """A trace by its shipped name (`elasticVpollux_e`, `cluster01`, ...) or a CSV path, in
    either of the artifact's column sets. Times stay as the trace has them: Gandiva rotates
    its time slices on whole minutes of that clock. Every row is checked before any replay
    (`UsageError` naming the line, the column and the fix): every column present, numbers
    where numbers belong, at least one GPU, iteration and second, a batch of at least one, a
    deadline no earlier than the submission, and no job id twice."""
    path = shipped_traces().get(str(trace), Path(trace))
    refuse_other_kind(path, "cluster-trace", "--trace")
    if not path.is_file():
        raise UsageError(
            f"trace '{trace}' is neither a shipped trace nor a file.",
            f"pass a CSV path or one of: {', '.join(shipped_traces())}.",
        )
    with path.open() as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        rows = list(reader)
    names = {k: next((c for c in cols if c in header), cols[0]) for k, cols in _COLUMNS.items()}
    numeric = [*names.values(), "batch_size", "num_gpu", "duration"]
    expected = ["job_id", "model_name", *numeric]
    missing = [c for c in expected if c not in header]
    if missing:
        raise UsageError(
            f"trace {path} has no {', '.join(repr(c) for c in missing)} column.",
            "give every job: job_id, submit_time, iteration, model_name, ddl, batch_size, "
            "num_gpu, duration (or the ITP traces' submission_time, num_iteration, deadline).",
        )
    if not rows:
        raise UsageError(f"trace {path} has no jobs.", "pass a trace with at least one job.")
    jobs, seen = [], {}
    for index, row in enumerate(rows):
        line = index + 2  # the header is line 1
        where = f"trace {path}, line {line}"
        if row["job_id"] in seen:
            raise UsageError(
                f"{where}: job id '{row['job_id']}' is also on line {seen[row['job_id']]}.",
                "give every job its own job_id.",
            )
        seen[row["job_id"]] = line
        number = {c: _number(where, c, row[c]) for c in numeric}
        for column in ("batch_size", "num_gpu"):
            if number[column] < 1 or number[column] != int(number[column]):
                raise UsageError(
                    f"{where}: {column} {row[column]} is not a whole number of at least 1.",
                    f"give {column} as a positive whole number.",
                )
        for column in (names["iterations"], "duration"):
            if number[column] <= 0:
                raise UsageError(
                    f"{where}: {column} {row[column]} is not positive.",
                    f"give every job a {column} above 0.",
                )
        submit, deadline = number[names["submit"]], number[names["deadline"]]
        if deadline < submit:
            raise UsageError(
                f"{where}: the deadline {row[names['deadline']]} is before the submission "
                f"{row[names['submit']]}.",
                "give each job a deadline at or after its submission time (same clock).",
            )
        jobs.append(
            Job(
                id=index,  # the artifact's job_idx: ITP traces name jobs by UUID
                submit=submit,
                iterations=number[names["iterations"]],
                model=row["model_name"],
                batch=int(number["batch_size"]),
                gpus=int(number["num_gpu"]),
                deadline=deadline,
                duration=number["duration"],
            )
        )
    return jobs


def _number(where: str, column: str, value: str | None) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise UsageError(
            f"{where}: {column} '{value}' is not a finite number.",
            f"give {column} as a number (seconds, iterations or a count).",
        )
    return number
