"""`moelambda cluster simulate`: a GPU-cluster scheduler replayed on a training trace.

The schedulers the simulator has today: ElasticFlow (with and without admission control) and
EDF. Tiresias, Gandiva, Rubick and Lyra are not built yet (issue 15); naming one says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, err, user_errors

cluster_app = typer.Typer(help="GPU-cluster schedulers on training traces.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

SCHEDULERS = ("elasticflow", "elasticflow-noadmit", "edf")
NOT_YET = ("tiresias", "gandiva", "rubick", "lyra")


def _policy(name: str, cluster: Any, slot_s: float) -> Any:
    from cluster.elasticflow import EDF, ElasticFlow

    if name == "elasticflow":
        return ElasticFlow(cluster, slot_s)
    if name == "elasticflow-noadmit":
        return ElasticFlow(cluster, slot_s, admission=False)
    if name == "edf":
        return EDF(cluster)
    if name in NOT_YET:
        raise UsageError(
            f"scheduler '{name}' is not built yet.", f"use one of: {', '.join(SCHEDULERS)}."
        )
    raise UsageError(f"unknown --scheduler '{name}'.", f"use one of: {', '.join(SCHEDULERS)}.")


@cluster_app.command()
@user_errors
def simulate(
    trace: Annotated[
        str,
        typer.Option(
            help="A shipped trace (elasticVpollux_e, 100jobs_1500lam, philly_103959, "
            "cluster01..05, 195job) or a CSV in the ElasticFlow artifact's format."
        ),
    ] = "elasticVpollux_e",
    cluster: Annotated[
        str, typer.Option(help="A shape like n16g4 (nodes x GPUs per node) or a spec CSV.")
    ] = "n16g4",
    gpu_type: Annotated[str, typer.Option(help="Throughput tables: T4 or A100.")] = "T4",
    scheduler: Annotated[
        str, typer.Option(help=f"One of: {', '.join(SCHEDULERS)}.")
    ] = "elasticflow",
    slot: Annotated[float, typer.Option(help="Scheduling slot, seconds.")] = 60.0,
    as_json: JsonOpt = False,
) -> None:
    """Replay a trace under one scheduler: deadline-satisfactory ratio, JCT, makespan,
    preemptions, GPU utilisation, and the simulator's own wall time."""
    from cluster.simulate import simulate as run
    from cluster.workload import load_cluster, load_curves, load_trace

    if not slot > 0:
        raise UsageError(f"--slot {slot} is not positive.", "pass e.g. --slot 60.")
    shape = load_cluster(cluster)
    policy = _policy(scheduler, shape, slot)
    jobs = load_trace(trace)
    curves = load_curves(gpu_type)
    missing = sorted({(j.model, j.batch) for j in jobs} - set(curves))
    if missing:
        raise UsageError(
            f"the {gpu_type} throughput tables have no curve for {missing[:3]}.",
            "pass the --gpu-type the trace was made for (the Pollux trace: T4; ITP: A100).",
        )
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task(f"{scheduler} on {Path(trace).stem}", total=len(jobs))
        result = run(
            jobs,
            curves,
            shape,
            policy,
            slot_s=slot,
            progress=lambda arrived, _: bar.update(task, completed=arrived),
        )
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
        return
    Console().print_json(json.dumps(summary))
