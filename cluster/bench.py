"""The cluster benchmarks: `moelambda bench cluster` (our replays beside the artifacts' own runs,
with wall-time targets) and `bench lyra` (Lyra's lead under each assumption it depends on)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from cluster.replay import (
    DEADLINE,
    DEFAULTS,
    LYRA,
    TABLES,
    LyraOptions,
    Progress,
    check_scheduler,
    family_of,
    replay,
)
from ground.errors import UsageError

if TYPE_CHECKING:
    from cluster.artifact import EventLog

__all__ = ["BENCH_TRACES", "LYRA_ROWS", "bench_cluster", "bench_lyra"]

# Where bench cluster replays ElasticFlow's family: the artifact's settings for each trace
# (`run_fig8a.sh`, `run_fig8b.sh`), and the wall-time target of each run.
BENCH_TRACES = {
    "elasticVpollux_e": ("n16g4", "T4"),
    "cluster01": ("n64g8", "A100"),
    "cluster02": ("n64g8", "A100"),
    "cluster03": ("n64g8", "A100"),
    "cluster04": ("n128g8", "A100"),
    "cluster05": ("n64g8", "A100"),
}
TARGET_S = {"elasticVpollux_e": 2.0}  # ElasticFlow on the 195-job trace; 60 s elsewhere


def _target(scheduler: str, trace: str) -> float | None:
    if trace in TARGET_S:
        return TARGET_S[trace] if scheduler == "elasticflow" else None
    return 60.0


def _bench_row(
    name: str,
    trace: str,
    artifact: dict[tuple[str, str], Any],
    logs: dict[tuple[str, str], EventLog],
    progress: Progress | None,
) -> dict[str, Any]:
    """One scheduler on one trace, measured, beside the artifact's own run of it: the jobs
    that met their deadlines, and every event against the artifact's per-event log (for a run
    that had not finished, the events it had logged)."""
    from cluster.artifact import EventDigest

    shape, gpu_type = BENCH_TRACES[trace]
    log = logs.get((trace, name))
    digest = EventDigest(None if log is None or log.complete else log.events)
    result = replay(
        name,
        trace=trace,
        cluster=shape,
        gpu_type=gpu_type if name in TABLES else None,
        on_round=digest,
        progress=progress,
    )
    theirs = artifact.get((trace, name))
    target = _target(name, trace)
    return {
        "scheduler": name,
        "trace": trace,
        "cluster": shape,
        "gpu_type": gpu_type,
        "jobs": result.jobs,
        "met": len(result.met),
        "deadline_ratio": result.deadline_ratio,
        "artifact_met": None if theirs is None else theirs.accepted,
        "artifact_ratio": None if theirs is None else theirs.deadline_ratio,
        "matches_artifact": None if theirs is None else theirs.accepted == len(result.met),
        "events": digest.count,
        "artifact_events": None if log is None else log.events,
        "artifact_events_complete": None if log is None else log.complete,
        "events_match": None if log is None else digest.matches(log),
        "wall_s": result.wall_s,
        # this process's CPU seconds (`Result.cpu_s` where the replay records it): on a shared
        # machine the wall time also counts other work
        "cpu_s": getattr(result, "cpu_s", None),
        "target_s": target,
        "within_target": None if target is None else result.wall_s <= target,
    }


def bench_cluster(
    schedulers: list[str],
    traces: list[str],
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Each scheduler of ElasticFlow's family on each trace beside the artifact's own runs
    (cluster/data/SOURCES.md) with a match flag, and each run's wall time against its target
    (ElasticFlow on the 195-job trace 2 s, every scheduler on every ITP trace 60 s), after a
    warm-up that compiles the kernels (or loads them from numba's cache; reported apart).
    Rubick on workload-base (8 x 8 GPUs), Lyra on its 15-day 50,000-job generated trace
    (target 2 minutes).

    Args:
        schedulers: Schedulers of any family.
        traces: Traces of `BENCH_TRACES` ElasticFlow's family replays.
        progress: Called as jobs complete. Defaults to None.

    Returns:
        {"runs": one row per ElasticFlow-family scheduler and trace (wall and CPU seconds),
        "others": the other families' wall time and JCT by scheduler, "warm_up_s": the
        kernels' warm-up, "load_average_1min": the machine's load before and after}.

    Raises:
        UsageError: An unknown scheduler, or a trace bench cluster has no settings for.
    """
    from cluster.artifact import artifact_events, artifact_runs

    for name in schedulers:
        check_scheduler(name)
    for trace in traces:
        if trace not in BENCH_TRACES:
            raise UsageError(
                f"bench cluster has no settings for trace '{trace}'.",
                f"use some of: {', '.join(BENCH_TRACES)}.",
            )
    artifact, logs = artifact_runs(), artifact_events()
    load_before = os.getloadavg()  # wall times here count other work on the machine too
    started = time.perf_counter()  # compile (or load from numba's cache) outside the timings
    if set(schedulers) & set(TABLES):
        for warm in ("elasticflow", "edf"):
            replay(warm, trace="elasticVpollux_e", cluster="n16g4", gpu_type="T4")
    compile_s = time.perf_counter() - started
    runs: list[dict[str, Any]] = []
    others: dict[str, Any] = {}
    for name in schedulers:
        family = family_of([name])
        if family == DEADLINE:
            runs += [_bench_row(name, trace, artifact, logs, progress) for trace in traces]
            continue
        row = replay(name, progress=progress).summary()
        target = 120.0 if family == LYRA else None
        others[name] = {
            "trace": DEFAULTS[family][0],
            "wall_s": row["wall_s"],
            "avg_jct_s": row["avg_jct_s"],
            "target_s": target,
            "within_target": None if target is None else row["wall_s"] <= target,
        }
    load = {"before": load_before[0], "after": os.getloadavg()[0]}
    return {"runs": runs, "others": others, "warm_up_s": compile_s, "load_average_1min": load}


# The assumptions Lyra's JCT lead over the baseline depends on, one change at a time
# (cluster.lyra.Assumptions; load: offered GPU-seconds over the training cluster's).
LYRA_ROWS = (
    ("as built", 0.85, {}),
    ("load 0.90 (baseline queues as the thesis's)", 0.90, {}),
    ("load 0.90, loaned T4 as fast as a V100", 0.90, {"t4_speed": 1.0}),
    ("load 0.90, preempted jobs resume", 0.90, {"checkpoint": True}),
    (
        "load 0.90, no-scaling schemes run elastic jobs at w_min",
        0.90,
        {"unscaled_elastic": "w_min"},
    ),
    (
        "load 0.90, all three",
        0.90,
        {"t4_speed": 1.0, "checkpoint": True, "unscaled_elastic": "w_min"},
    ),
    ("load 0.95", 0.95, {}),
)


def bench_lyra(
    options: LyraOptions | None = None, *, progress: Progress | None = None
) -> dict[str, Any]:
    """Lyra against the baseline on mean JCT under each assumption it depends on (the thesis:
    11,236 vs 16,610 s, 1.48x): the generated trace's congestion, the loaned T4's speed,
    checkpointing on preemption, and the workers an unscaled elastic job gets.

    Args:
        options: The generated trace. Defaults to None (`LyraOptions()`: 15 days, 50,000 jobs).
        progress: Called as jobs complete. Defaults to None.

    Returns:
        {"rows": one per assumption of `LYRA_ROWS`, both schemes' mean JCT and queueing and
        Lyra's lead, "thesis": the thesis's mean JCTs}.
    """
    from cluster.lyra import Assumptions, run_lyra

    options = options or LyraOptions()
    say = progress or (lambda *_: None)
    rows = []
    for name, load, changes in LYRA_ROWS:
        runs = {}
        for scheme in ("baseline", "lyra"):
            label = f"{name}: {scheme}"
            runs[scheme] = run_lyra(
                scheduler=scheme,
                days=options.days,
                jobs=options.jobs,
                seed=options.seed,
                load=load,
                assumptions=Assumptions(**changes),  # type: ignore[arg-type]
                progress=lambda done, total, label=label: say(label, done, total),
            )
        base, lyra = runs["baseline"], runs["lyra"]
        rows.append(
            {
                "assumptions": name,
                "load": load,
                "baseline_jct_s": base.result.avg_jct_s,
                "lyra_jct_s": lyra.result.avg_jct_s,
                "lead": (base.result.avg_jct_s or 0.0) / (lyra.result.avg_jct_s or 1.0),
                "baseline_queue_s": base.stats.queue_mean_s,
                "lyra_queue_s": lyra.stats.queue_mean_s,
                "lyra_preemption_ratio": lyra.stats.preemption_ratio,
            }
        )
    return {"rows": rows, "thesis": {"baseline_jct_s": 16610, "lyra_jct_s": 11236}}
