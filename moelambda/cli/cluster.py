"""`moelambda cluster simulate`: a GPU-cluster scheduler replayed on a training trace.

Two families of schedulers, each replaying its own artifact's traces: ElasticFlow (with and
without admission control), EDF, Tiresias and Gandiva on the ElasticFlow artifact's traces;
Rubick and its ablations on the Rubick artifact's workloads; Lyra and its baselines on a seeded
generated trace (no Lyra trace is public).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import ForceOpt, JsonOpt, app, bench_app, err, user_errors

if TYPE_CHECKING:
    from cluster.artifact import EventLog

cluster_app = typer.Typer(help="GPU-cluster schedulers on training traces.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

DEADLINE = ("elasticflow", "elasticflow-noadmit", "edf", "tiresias", "gandiva")
RUBICK = ("rubick", "rubick-e", "rubick-n")
# Lyra's schemes (thesis Table 3.5); its Gandiva baseline is `lyra-gandiva` here, to keep
# `gandiva` for the ElasticFlow artifact's.
LYRA = (
    "lyra",
    "lyra-loaning",
    "lyra-scaling",
    "baseline",
    "opportunistic",
    "random",
    "scf",
    "afs",
    "lyra-gandiva",
)
SCHEDULERS = (*DEADLINE, *RUBICK, *LYRA)
NOT_YET: tuple[str, ...] = ()
# Each family replays its own artifact's traces on its own default cluster (Lyra: a seeded
# generated trace on its fixed training and inference clusters).
DEFAULTS = {
    DEADLINE: ("elasticVpollux_e", "n16g4"),
    RUBICK: ("workload-base", "n8g8"),
    LYRA: ("generated", "lyra"),
}


def _check(name: str) -> None:
    """Refuse an unknown or unbuilt scheduler name before any work starts."""
    if name in NOT_YET:
        raise UsageError(
            f"scheduler '{name}' is not built yet.", f"use one of: {', '.join(SCHEDULERS)}."
        )
    if name not in SCHEDULERS:
        raise UsageError(f"unknown --scheduler '{name}'.", f"use one of: {', '.join(SCHEDULERS)}.")


def _family(names: list[str]) -> tuple[str, ...]:
    for name in names:
        _check(name)
    families = {f for f in DEFAULTS if set(names) & set(f)}
    if len(families) > 1:
        raise UsageError(
            f"{', '.join(names)} replay different artifacts' traces.",
            f"compare within one family: {', '.join(DEADLINE)}; or {', '.join(RUBICK)}; "
            f"or {', '.join(LYRA)}.",
        )
    return families.pop()


# The options each scheduler reads; one that none of the chosen schedulers reads is refused.
TABLES = ("elasticflow", "elasticflow-noadmit", "edf")  # the throughput tables (--gpu-type)
USES = {
    "trace": (*DEADLINE, *RUBICK),
    "cluster": (*DEADLINE, *RUBICK),
    "gpu-type": TABLES,
    "slot": (*DEADLINE, *RUBICK),
    "days": LYRA,
    "jobs": LYRA,
    "seed": LYRA,
    "gpu-plan": LYRA,
    "peak-rps": LYRA,
}
WHY = {
    "trace": "Lyra replays its own generated trace on its own clusters",
    "cluster": "Lyra replays its own generated trace on its own clusters",
    "gpu-type": "Tiresias and Gandiva run each job at its trace's GPUs for its duration, "
    "Rubick and Lyra have their own performance models",
    "slot": "Lyra schedules on its own fixed interval",
}


def _refuse_unused(names: list[str], given: dict[str, object]) -> None:
    """Refuse an option that no chosen scheduler reads, instead of ignoring it."""
    for option, value in given.items():
        if value is None or set(names) & set(USES[option]):
            continue
        why = WHY.get(option, "only Lyra's generated trace reads it")
        raise UsageError(
            f"--{option} is not used by {', '.join(names)} ({why}).",
            f"drop --{option}; it applies to: {', '.join(USES[option])}.",
        )


def _policy(name: str, cluster: Any, curves: Any, gpu_type: str, slot_s: float) -> Any:
    from cluster.edf import EDF
    from cluster.elasticflow import ElasticFlow
    from cluster.gandiva import Gandiva
    from cluster.tiresias import Tiresias

    if name == "elasticflow":
        return ElasticFlow(cluster, curves, gpu_type, slot_s)
    if name == "elasticflow-noadmit":
        return ElasticFlow(cluster, curves, gpu_type, slot_s, admission=False)
    if name == "edf":
        return EDF(cluster, curves, slot_s)
    if name == "gandiva":
        return Gandiva(cluster, slot_s)
    return Tiresias(cluster, slot_s)


TraceOpt = Annotated[
    str | None,
    typer.Option(
        help="A shipped trace or a CSV in its artifact's format. ElasticFlow's family: "
        "elasticVpollux_e (default), 100jobs_1500lam, philly_103959, cluster01..05, 195job; "
        "Rubick's: workload-base (default), workload-bp, workload-mt, naive."
    ),
]
ClusterOpt = Annotated[
    str | None,
    typer.Option(
        help="A shape like n16g4 (nodes x GPUs per node) or a spec CSV; default n16g4 for "
        "ElasticFlow's family, n8g8 for Rubick's."
    ),
]
GpuTypeOpt = Annotated[
    str | None,
    typer.Option(
        help="Throughput tables: T4 (default; the 195-job trace) or A100 (the ITP traces). "
        "ElasticFlow and EDF only: Tiresias and Gandiva run jobs at their traces' GPUs."
    ),
]
SlotOpt = Annotated[
    float | None, typer.Option(help="Scheduling slot, seconds (default 60; not Lyra).")
]


@dataclass(frozen=True)
class LyraOptions:
    """What a Lyra replay generates: its trace and, optionally, the inference cluster's hourly
    GPU demand from a GPU plan of our own at a diurnal request rate."""

    days: float = 15.0
    jobs: int = 50_000
    seed: int = 0
    gpu_plan: Path | None = None
    peak_rps: float = 0.0

    @classmethod
    def given(
        cls,
        days: float | None,
        jobs: int | None,
        seed: int | None,
        gpu_plan: Path | None = None,
        peak_rps: float | None = None,
    ) -> LyraOptions:
        """The options as given, defaults for those that were not."""
        return cls(
            cls.days if days is None else days,
            cls.jobs if jobs is None else jobs,
            cls.seed if seed is None else seed,
            gpu_plan,
            cls.peak_rps if peak_rps is None else peak_rps,
        )

    def inference_demand(self) -> Any:
        if self.gpu_plan is None:
            return None
        if not self.peak_rps > 0:
            raise UsageError("--gpu-plan needs --peak-rps.", "pass e.g. --peak-rps 20.")
        from cluster.lyra_trace import diurnal_utilisation, inference_demand_from_gpu_plan
        from gpu.plan import GpuPlan

        daily = diurnal_utilisation(1.0)
        hourly = daily.reshape(24, -1).mean(axis=1)  # 5-minute samples to hours
        days = int(-(-self.days // 1))
        rates = self.peak_rps * np.tile(hourly / hourly.max(), days)
        return inference_demand_from_gpu_plan(GpuPlan.load(self.gpu_plan), rates)


def _run(
    trace: str | None,
    cluster: str | None,
    gpu_type: str | None,
    scheduler: str,
    slot: float | None,
    lyra: LyraOptions | None = None,
    on_round: Callable[[float, dict[int, int]], None] | None = None,
) -> Any:
    """One scheduler on one trace, with a progress bar on stderr. Every input is checked
    (trace, cluster, options) before the replay starts. `on_round` sees every round of
    ElasticFlow's family (`cluster.simulate.simulate`)."""
    from cluster.simulate import simulate as run
    from cluster.workload import load_cluster, load_curves, load_trace

    family = _family([scheduler])
    slot = 60.0 if slot is None else slot
    if not slot > 0:
        raise UsageError(f"--slot {slot} is not positive.", "pass e.g. --slot 60.")
    with Progress(console=err, transient=True) as bar:
        if family == LYRA:
            from cluster.lyra import run_lyra

            options = lyra or LyraOptions()
            task = bar.add_task(f"{scheduler}, {options.days:g} days", total=options.jobs)
            result = run_lyra(
                scheduler="gandiva" if scheduler == "lyra-gandiva" else scheduler,
                days=options.days,
                jobs=options.jobs,
                seed=options.seed,
                inference_demand=options.inference_demand(),
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            ).result
            result.scheduler = scheduler
            return result
        trace = trace or DEFAULTS[family][0]
        shape = load_cluster(cluster or DEFAULTS[family][1])
        if family == RUBICK:
            from cluster.rubick import simulate_rubick

            task = bar.add_task(f"{scheduler} on {Path(trace).stem}", total=None)
            return simulate_rubick(
                trace,
                scheduler=scheduler,
                interval_s=slot,
                cluster=shape,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
        jobs = load_trace(trace)
        gpu_type = gpu_type or "T4"
        curves = None
        if scheduler in TABLES:
            curves = load_curves(gpu_type)
            missing = sorted({(j.model, j.batch) for j in jobs} - set(curves))
            if missing:
                raise UsageError(
                    f"the {gpu_type} throughput tables have no curve for {missing[:3]}.",
                    "pass the --gpu-type the trace was made for (the Pollux trace: T4; "
                    "ITP: A100).",
                )
        policy = _policy(scheduler, shape, curves, gpu_type, slot)
        if hasattr(policy, "check"):
            policy.check(jobs)  # refused before the progress bar starts
        task = bar.add_task(f"{scheduler} on {Path(trace).stem}", total=len(jobs))
        return run(
            jobs,
            shape,
            policy,
            slot_s=slot,
            progress=lambda arrived, _: bar.update(task, completed=arrived),
            on_round=on_round,
        )


DaysOpt = Annotated[float | None, typer.Option(help="Lyra: days of generated trace (default 15).")]
JobsOpt = Annotated[
    int | None, typer.Option(help="Lyra: training jobs in the generated trace (default 50,000).")
]
SeedOpt = Annotated[int | None, typer.Option(help="Lyra: the trace generator's seed (default 0).")]
GpuPlanOpt = Annotated[
    Path | None,
    typer.Option(
        help="Lyra: take the inference cluster's hourly GPU demand from this GPU plan "
        "(moelambda gpu-plan) at a diurnal request rate peaking at --peak-rps."
    ),
]
PeakOpt = Annotated[
    float | None, typer.Option(help="Lyra: peak requests per second (--gpu-plan).")
]


@cluster_app.command()
@user_errors
def simulate(
    trace: TraceOpt = None,
    cluster: ClusterOpt = None,
    gpu_type: GpuTypeOpt = None,
    scheduler: Annotated[
        str, typer.Option(help=f"One of: {', '.join(SCHEDULERS)}.")
    ] = "elasticflow",
    slot: SlotOpt = None,
    days: DaysOpt = None,
    jobs: JobsOpt = None,
    seed: SeedOpt = None,
    gpu_plan: GpuPlanOpt = None,
    peak_rps: PeakOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a trace under one scheduler: deadline-satisfactory ratio, JCT, makespan,
    preemptions, GPU utilisation, and the simulator's own wall time."""
    _check(scheduler)
    given = {"trace": trace, "cluster": cluster, "gpu-type": gpu_type, "slot": slot}
    given |= {"days": days, "jobs": jobs, "seed": seed, "gpu-plan": gpu_plan}
    _refuse_unused([scheduler], given | {"peak-rps": peak_rps})
    lyra = LyraOptions.given(days, jobs, seed, gpu_plan, peak_rps)
    summary = _run(trace, cluster, gpu_type, scheduler, slot, lyra).summary()
    if as_json:
        print(json.dumps(summary))
        return
    Console().print_json(json.dumps(summary))


@cluster_app.command()
@user_errors
def compare(
    trace: TraceOpt = None,
    cluster: ClusterOpt = None,
    gpu_type: GpuTypeOpt = None,
    schedulers: Annotated[
        str, typer.Option(help="Comma-separated schedulers of one family to run.")
    ] = ",".join(DEADLINE),
    slot: SlotOpt = None,
    days: DaysOpt = None,
    jobs: JobsOpt = None,
    seed: SeedOpt = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a bar chart of the deadline ratios (PNG).")
    ] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Several schedulers on one trace: a table (and a plot) of their metrics."""
    if plot is not None and plot.exists() and not force:
        raise UsageError(f"'{plot}' already exists.", "pick another --plot or pass --force.")
    names = [n.strip() for n in schedulers.split(",") if n.strip()]
    if not names:
        raise UsageError("--schedulers is empty.", f"pass e.g. {','.join(SCHEDULERS)}.")
    family = _family(names)  # refuse unknown or mixed names before running anything
    given = {"trace": trace, "cluster": cluster, "gpu-type": gpu_type, "slot": slot}
    _refuse_unused(names, given | {"days": days, "jobs": jobs, "seed": seed})
    lyra = LyraOptions.given(days, jobs, seed)
    rows = [_run(trace, cluster, gpu_type, name, slot, lyra).summary() for name in names]
    trace, cluster = trace or DEFAULTS[family][0], cluster or DEFAULTS[family][1]
    if plot is not None:
        _plot(rows, plot, f"{Path(trace).stem} on {cluster}")
    if as_json:
        print(json.dumps({"trace": trace, "cluster": cluster, "results": rows}))
        return
    tables = f"{gpu_type or 'T4'} tables, " if set(names) & set(TABLES) else ""
    table = Table(title=f"{Path(trace).stem} on {cluster} ({tables}{slot or 60:g} s slots)")
    for column in (
        "scheduler",
        "deadline ratio",
        "avg JCT h",
        "makespan h",
        "preemptions",
        "GPU util.",
        "wall s",
    ):
        table.add_column(column, justify="left" if column == "scheduler" else "right")
    for row in rows:
        ratio = row["deadline_ratio"]
        table.add_row(
            str(row["scheduler"]),
            "-" if ratio is None else f"{ratio:.3f}",
            "-" if row["avg_jct_s"] is None else f"{row['avg_jct_s'] / 3600:.1f}",
            f"{row['makespan_s'] / 3600:.1f}",
            str(row["preemptions"]),
            f"{row['gpu_utilisation']:.2f}",
            f"{row['wall_s']:.2f}",
        )
    Console().print(table)


def _plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    try:
        names = [str(r["scheduler"]) for r in rows]
        if any(r["deadline_ratio"] is not None for r in rows):
            ax.bar(names, [r["deadline_ratio"] or 0.0 for r in rows], color="tab:blue")
            ax.set_ylabel("deadline-satisfactory ratio")
            ax.set_ylim(0, 1)
        else:  # Rubick's traces have no deadlines: compare JCT
            ax.bar(names, [(r["avg_jct_s"] or 0.0) / 3600 for r in rows], color="tab:blue")
            ax.set_ylabel("average JCT, hours")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


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
) -> dict[str, Any]:
    """One scheduler on one trace, measured, beside the artifact's own run of it: the jobs
    that met their deadlines, and every event against the artifact's per-event log (for a run
    that had not finished, the events it had logged)."""
    from cluster.artifact import EventDigest

    shape, gpu_type = BENCH_TRACES[trace]
    log = logs.get((trace, name))
    digest = EventDigest(None if log is None or log.complete else log.events)
    result = _run(trace, shape, gpu_type if name in TABLES else None, name, None, None, digest)
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
        "cpu_s": result.cpu_s,
        "target_s": target,
        "within_target": None if target is None else result.wall_s <= target,
    }


@bench_app.command("cluster")
@user_errors
def bench_cluster(
    schedulers: Annotated[
        str, typer.Option(help="Comma-separated schedulers to time (any family).")
    ] = ",".join((*DEADLINE, "rubick", "lyra")),
    traces: Annotated[
        str, typer.Option(help="ElasticFlow's family: comma-separated traces to replay.")
    ] = ",".join(BENCH_TRACES),
    as_json: JsonOpt = False,
) -> None:
    """Each scheduler of ElasticFlow's family on the 195-job trace (16 x 4 T4) and the ITP
    traces cluster01..05 (A100; 64 x 8 GPUs, 128 x 8 for cluster04; 60 s slots, as the
    artifact's run_fig8b.sh), beside the artifact's own runs (cluster/data/SOURCES.md): the
    jobs in time with a match flag, every event against the artifact's per-event log
    (cluster/data/elasticflow/artifact/events.csv; the events it had logged for a run that
    had not finished), and each run's wall time against its target (ElasticFlow on the
    195-job trace 2 s, every scheduler on every ITP trace 60 s) with its CPU time beside it
    and the machine's load average, after a warm-up that compiles the kernels (or loads them
    from numba's cache; reported apart). Rubick on workload-base (8 x 8 GPUs), Lyra on its
    15-day 50,000-job generated trace (target 2 minutes)."""
    from cluster.artifact import artifact_events, artifact_runs

    names = [n.strip() for n in schedulers.split(",") if n.strip()]
    chosen = [t.strip() for t in traces.split(",") if t.strip()]
    for name in names:
        _check(name)
    for trace in chosen:
        if trace not in BENCH_TRACES:
            raise UsageError(
                f"bench cluster has no settings for trace '{trace}'.",
                f"use some of: {', '.join(BENCH_TRACES)}.",
            )
    artifact, logs = artifact_runs(), artifact_events()
    load_before = os.getloadavg()  # wall times here count other work on the machine too
    started = time.perf_counter()  # compile (or load from numba's cache) outside the timings
    if set(names) & set(TABLES):
        _run("elasticVpollux_e", "n16g4", "T4", "elasticflow", None)
        _run("elasticVpollux_e", "n16g4", "T4", "edf", None)
    compile_s = time.perf_counter() - started
    runs: list[dict[str, Any]] = []
    others: dict[str, Any] = {}
    for name in names:
        if _family([name]) == DEADLINE:
            runs += [_bench_row(name, trace, artifact, logs) for trace in chosen]
            continue
        row = _run(None, None, None, name, None).summary()
        target = 120.0 if _family([name]) == LYRA else None
        others[name] = {
            "trace": DEFAULTS[_family([name])][0],
            "wall_s": row["wall_s"],
            "avg_jct_s": row["avg_jct_s"],
            "target_s": target,
            "within_target": None if target is None else row["wall_s"] <= target,
        }
    load = {"before": load_before[0], "after": os.getloadavg()[0]}
    summary = {"runs": runs, "others": others, "warm_up_s": compile_s, "load_average_1min": load}
    if as_json:
        print(json.dumps(summary))
        return
    table = Table(title="bench cluster: ours beside the artifact's own runs")
    columns = (
        "scheduler",
        "trace",
        "met / jobs",
        "artifact",
        "match",
        "events",
        "wall s",
        "cpu s",
        "target s",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("scheduler", "trace") else "right")
    for row in runs:
        theirs = "-" if row["artifact_met"] is None else f"{row['artifact_met']}"
        match = {None: "-", True: "yes", False: "NO"}[row["matches_artifact"]]
        target = "-" if row["target_s"] is None else f"{row['target_s']:g}"
        events = f"{row['events']}"
        if row["events_match"] is not None:
            prefix = "" if row["artifact_events_complete"] else "first "
            same = "equal" if row["events_match"] else "DIFFER"
            events += f" ({prefix}{row['artifact_events']} {same})"
        table.add_row(
            row["scheduler"],
            row["trace"],
            f"{row['met']} / {row['jobs']} ({row['deadline_ratio']:.5f})",
            theirs,
            match,
            events,
            f"{row['wall_s']:.1f}",
            "-" if row["cpu_s"] is None else f"{row['cpu_s']:.1f}",
            target,
        )
    Console().print(table)
    err.print(
        f"warm-up (compiling the kernels, or loading them from numba's cache): {compile_s:.1f} s;"
        f" load average (1 min) {load['before']:.1f} before, {load['after']:.1f} after, on "
        f"{os.cpu_count()} cores (wall s counts other work too, cpu s this process's only)"
    )
    if others:
        Console().print_json(json.dumps(others))


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


@bench_app.command("lyra")
@user_errors
def bench_lyra(
    days: DaysOpt = None,
    jobs: JobsOpt = None,
    seed: SeedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Lyra against the baseline on mean JCT under each assumption it depends on (the
    thesis: 11,236 vs 16,610 s, 1.48x): the generated trace's congestion, the loaned T4's
    speed, checkpointing on preemption, and the workers an unscaled elastic job gets."""
    from cluster.lyra import Assumptions, run_lyra

    options = LyraOptions.given(days, jobs, seed)
    rows = []
    for name, load, changes in LYRA_ROWS:
        runs = {
            s: run_lyra(
                scheduler=s,
                days=options.days,
                jobs=options.jobs,
                seed=options.seed,
                load=load,
                assumptions=Assumptions(**changes),  # type: ignore[arg-type]
            )
            for s in ("baseline", "lyra")
        }
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
    if as_json:
        print(json.dumps({"rows": rows, "thesis": {"baseline_jct_s": 16610, "lyra_jct_s": 11236}}))
        return
    table = Table(title="Lyra vs baseline, mean JCT (thesis: 16,610 vs 11,236 s, 1.48x)")
    for column in ("assumptions", "baseline JCT s", "Lyra JCT s", "lead", "queue s base/Lyra"):
        table.add_column(column, justify="left" if column == "assumptions" else "right")
    for row in rows:
        table.add_row(
            row["assumptions"],
            f"{row['baseline_jct_s']:,.0f}",
            f"{row['lyra_jct_s']:,.0f}",
            f"{row['lead']:.2f}x",
            f"{row['baseline_queue_s']:,.0f} / {row['lyra_queue_s']:,.0f}",
        )
    Console().print(table)
