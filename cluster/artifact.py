"""The ElasticFlow artifact's per-event logs, read for a round-by-round comparison.

The artifact's simulator (`scheduler.py --simulation=True`, github.com/pkusys/ElasticFlow)
writes `scheduling_events.csv` (per event: its time, then for every GPU the job index holding
it) and `job.csv` (per finished job: the event it left at). `rounds` turns the first into what
`simulate(..., on_round=...)` reports, `Rounds` stores that compactly (one line a round:
`time,job:gpus job:gpus ...`), so the artifact's own log of a run can ship with the tests.
Whole logs are megabytes on the ITP traces, so `events.csv` keeps, per run, the number of
events and the SHA-256 of their compact form; `EventDigest` hashes a replay's rounds as they
come, to compare with it (for a run that had not finished, with the events it had logged).
"""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ArtifactRun",
    "EventDigest",
    "EventLog",
    "Rounds",
    "artifact_events",
    "artifact_runs",
    "rounds",
]

_DIR = Path(__file__).resolve().parent / "data" / "elasticflow" / "artifact"
_RUNS = _DIR / "runs.csv"
_EVENTS = _DIR / "events.csv"


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


def line(time: float, held: dict[int, int]) -> str:
    """One round in the compact form: `time,job:gpus job:gpus ...` (jobs in id order)."""
    pairs = " ".join(f"{job}:{gpus}" for job, gpus in sorted(held.items()))
    return f"{time:.0f},{pairs}\n"


class Rounds:
    """Rounds (time, GPUs per job) in the compact text form stored beside the tests."""

    def __init__(self, events: list[tuple[float, dict[int, int]]]) -> None:
        self.events = events

    def dumps(self) -> str:
        return "".join(line(time, held) for time, held in self.events)

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


@dataclass(frozen=True)
class EventLog:
    """The artifact's per-event log of one run, as its count and digest: `events` rounds
    whose compact form (`Rounds.dumps`) hashes to `sha256`; `complete` when the run had
    finished (else the events it had logged when it was stopped)."""

    events: int
    complete: bool
    sha256: str


class EventDigest:
    """A replay's rounds hashed as they come (an `on_round` callback), with the digest taken
    after the first `prefix` of them, to compare with an artifact's `EventLog`."""

    def __init__(self, prefix: int | None = None) -> None:
        self._hash = hashlib.sha256()
        self.prefix = prefix
        self.count = 0
        self.at_prefix: str | None = None

    def __call__(self, time: float, held: dict[int, int]) -> None:
        self._hash.update(line(time, held).encode())
        self.count += 1
        if self.count == self.prefix:
            self.at_prefix = self._hash.hexdigest()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def matches(self, log: EventLog) -> bool:
        """Whether the replay's events equal the artifact's: all of them for a finished run
        (the same count too), the first `log.events` for one that had not finished."""
        if log.complete:
            return self.count == log.events and self.hexdigest() == log.sha256
        return self.prefix == log.events and self.at_prefix == log.sha256


def artifact_events() -> dict[tuple[str, str], EventLog]:
    """The artifact's per-event logs recorded in `cluster/data/elasticflow/artifact/events.csv`
    (the runs of runs.csv; whole traces only), by (trace, scheduler)."""
    logs = {}
    with _EVENTS.open() as f:
        for row in csv.DictReader(f):
            logs[row["trace"], row["scheduler"]] = EventLog(
                int(row["events"]), row["complete"] == "1", row["sha256"]
            )
    return logs
