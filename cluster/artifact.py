"""The ElasticFlow artifact's per-event logs, read for a round-by-round comparison.

The artifact's simulator (`scheduler.py --simulation=True`, github.com/pkusys/ElasticFlow)
writes `scheduling_events.csv` (per event: its time, then for every GPU the job index holding
it) and `job.csv` (per finished job: the event it left at). `rounds` turns the first into what
`simulate(..., on_round=...)` reports, `Rounds` stores that compactly (one line a round:
`time,job:gpus job:gpus ...`), so the artifact's own log of a run can ship with the tests.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ArtifactRun", "Rounds", "artifact_runs", "rounds"]

_RUNS = Path(__file__).resolve().parent / "data" / "elasticflow" / "artifact" / "runs.csv"


def rounds(log_dir: str | Path) -> list[tuple[float, dict[int, int]]]:
    """Each event the artifact logged: its time and the GPUs each job held."""
    out = []
    with (Path(log_dir) / "scheduling_events.csv").open() as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:  # time, one column per GPU, then the round's efficiency
            held = Counter(int(cell) for cell in row[1:-1] if cell != "")
            out.append((float(row[0]), dict(held)))
    return out


class Rounds:
    """Rounds (time, GPUs per job) in the compact text form stored beside the tests."""

    def __init__(self, events: list[tuple[float, dict[int, int]]]) -> None:
        self.events = events

    def dumps(self) -> str:
        lines = []
        for time, held in self.events:
            pairs = " ".join(f"{job}:{gpus}" for job, gpus in sorted(held.items()))
            lines.append(f"{time:.0f},{pairs}")
        return "\n".join(lines) + "\n"

    @classmethod
    def loads(cls, text: str) -> Rounds:
        events = []
        for line in text.splitlines():
            time, _, pairs = line.partition(",")
            held = {int(j): int(g) for j, g in (p.split(":") for p in pairs.split())}
            events.append((float(time), held))
        return cls(events)


@dataclass(frozen=True)
class ArtifactRun:
    """The artifact's own run of a scheduler on a whole trace: jobs that met their deadlines
    (its `accepted jobs`), the ratio it reports, and its wall time on this machine."""

    deadline_ratio: float
    accepted: int
    wall_s: float | None


def artifact_runs() -> dict[tuple[str, str], ArtifactRun]:
    """The artifact's runs recorded in `cluster/data/elasticflow/artifact/runs.csv` (each
    command in cluster/data/SOURCES.md), by (trace, scheduler); whole traces only."""
    runs = {}
    with _RUNS.open() as f:
        for row in csv.DictReader(f):
            if row["first_jobs"]:
                continue
            wall = float(row["artifact_wall_s"]) if row["artifact_wall_s"] else None
            runs[row["trace"], row["scheduler"]] = ArtifactRun(
                float(row["deadline_ratio"]), int(row["accepted"]), wall
            )
    return runs
