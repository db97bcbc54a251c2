"""`moelambda cluster simulate|compare`, `bench cluster` and `bench lyra`: GPU-cluster
schedulers replayed on training traces (the work is in `cluster.replay` and `cluster.bench`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from cluster.bench import BENCH_TRACES
from cluster.replay import DEADLINE, LYRA, SCHEDULERS, TABLES
from moelambda.cli import _render_cluster as render
from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    app,
    bench_app,
    check_file_out,
    err,
    progress,
    stdout,
    user_errors,
)

cluster_app = typer.Typer(help="GPU-cluster schedulers on training traces.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

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


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


@contextmanager
def _bars() -> Iterator[Any]:
    """A `cluster.replay.Progress` callback drawing one bar (or plain lines) per replay."""
    with progress() as bar:
        tasks: dict[str, Any] = {}

        def update(label: str, done: int, total: int | None) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield update


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
    from cluster.replay import simulate_scheduler

    with _bars() as bars:
        summary = simulate_scheduler(
            scheduler,
            trace=trace,
            cluster=cluster,
            gpu_type=gpu_type,
            slot_s=slot,
            days=days,
            jobs=jobs,
            seed=seed,
            gpu_plan=gpu_plan,
            peak_rps=peak_rps,
            progress=bars,
        )
    if as_json:
        print(json.dumps(summary))
        return
    render.cluster_simulate(stdout(), summary)


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
    from cluster.replay import compare_schedulers, plot_comparison

    check_file_out(plot, force, "--plot")
    names = _names(schedulers)
    with _bars() as bars:
        summary = compare_schedulers(
            names,
            trace=trace,
            cluster=cluster,
            gpu_type=gpu_type,
            slot_s=slot,
            days=days,
            jobs=jobs,
            seed=seed,
            progress=bars,
        )
    title = f"{Path(summary['trace']).stem} on {summary['cluster']}"
    if plot is not None:
        summary["plot"] = plot_comparison(summary["results"], plot, title, force=force)
    if as_json:
        print(json.dumps(summary))
        return
    tables = f"{gpu_type or 'T4'} tables, " if set(names) & set(TABLES) else ""
    slots = "" if set(names) <= set(LYRA) else f"{slot or 60:g} s slots"
    detail = ", ".join(part for part in (tables.rstrip(", "), slots) if part)
    render.cluster_compare(
        stdout(), title + (f" ({detail})" if detail else ""), summary["results"]
    )
    if plot is not None:
        stdout().print(f"Wrote {summary['plot']}", highlight=False)


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
    from cluster.bench import bench_cluster as run

    with _bars() as bars:
        summary = run(_names(schedulers), _names(traces), progress=bars)
    if as_json:
        print(json.dumps(summary))
        return
    render.bench_cluster(stdout(), summary)
    load = summary["load_average_1min"]
    err.print(
        "warm-up (compiling the kernels, or loading them from numba's cache): "
        f"{summary['warm_up_s']:.1f} s; load average (1 min) {load['before']:.1f} before, "
        f"{load['after']:.1f} after, on {os.cpu_count()} cores (wall s counts other work too, "
        "cpu s this process's only)"
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
    from cluster.bench import bench_lyra as run
    from cluster.replay import LyraOptions

    with _bars() as bars:
        summary = run(LyraOptions.given(days, jobs, seed), progress=bars)
    if as_json:
        print(json.dumps(summary))
        return
    render.bench_lyra(stdout(), summary)
