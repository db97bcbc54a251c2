"""Schedulers by name, and a trace replayed under one or several: what `moelambda cluster
simulate` and `cluster compare` do.

Three families of schedulers, each replaying its own artifact's traces on its own default
cluster: ElasticFlow (with and without admission control), EDF, Tiresias and Gandiva on the
ElasticFlow artifact's traces; Rubick and its ablations on the Rubick artifact's workloads; Lyra
and its baselines on a seeded generated trace (no Lyra trace is public).

Example::

    from cluster import compare_schedulers, simulate_scheduler

    summary = simulate_scheduler("edf")  # the 195-job trace on 16 x 4 T4
    table = compare_schedulers(["edf", "tiresias"], trace="cluster01", cluster="n64g8")
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import UsageError

if TYPE_CHECKING:
    from cluster.simulate import Result

__all__ = [
    "DEADLINE",
    "LYRA",
    "RUBICK",
    "SCHEDULERS",
    "LyraOptions",
    "Progress",
    "check_scheduler",
    "compare_schedulers",
    "family_of",
    "plot_comparison",
    "refuse_unused",
    "replay",
    "simulate_scheduler",
]

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
# Each family replays its own artifact's traces on its own default cluster (Lyra: a seeded
# generated trace on its fixed training and inference clusters).
DEFAULTS = {
    DEADLINE: ("elasticVpollux_e", "n16g4"),
    RUBICK: ("workload-base", "n8g8"),
    LYRA: ("generated", "lyra"),
}
DEFAULT_SLOT_S = 60.0
DEFAULT_GPU_TYPE = "T4"

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

Progress = Callable[[str, int, "int | None"], None]
"""A replay's progress: (what is replayed, jobs done, jobs in all or None when unknown)."""


def check_scheduler(name: str) -> None:
    """Refuse an unknown scheduler name before any work starts.

    Raises:
        UsageError: `name` is not one of `SCHEDULERS`.
    """
    if name not in SCHEDULERS:
        raise UsageError(f"unknown --scheduler '{name}'.", f"use one of: {', '.join(SCHEDULERS)}.")


def family_of(names: list[str]) -> tuple[str, ...]:
    """The one family (`DEADLINE`, `RUBICK` or `LYRA`) the named schedulers belong to.

    Raises:
        UsageError: An unknown name, or names of different families (they replay different
            artifacts' traces).
    """
    for name in names:
        check_scheduler(name)
    families = {f for f in DEFAULTS if set(names) & set(f)}
    if len(families) > 1:
        raise UsageError(
            f"{', '.join(names)} replay different artifacts' traces.",
            f"compare within one family: {', '.join(DEADLINE)}; or {', '.join(RUBICK)}; "
            f"or {', '.join(LYRA)}.",
        )
    return families.pop()


def refuse_unused(names: list[str], given: dict[str, object]) -> None:
    """Refuse an option that no chosen scheduler reads, instead of ignoring it.

    Args:
        names: The chosen schedulers.
        given: Option name (as in `USES`, e.g. "gpu-type") to its value; None is not given.

    Raises:
        UsageError: An option given that none of `names` reads.
    """
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


@dataclass(frozen=True)
class LyraOptions:
    """What a Lyra replay generates: its trace and, optionally, the inference cluster's hourly
    GPU demand from a GPU plan of our own at a diurnal request rate.

    Attributes:
        days: Days of generated trace. Defaults to 15.
        jobs: Training jobs in the generated trace. Defaults to 50,000.
        seed: The trace generator's seed. Defaults to 0.
        gpu_plan: A GPU plan (`moelambda gpu-plan`) the inference demand is taken from.
            Defaults to None (Lyra's own demand).
        peak_rps: Peak requests per second of the diurnal rate (with `gpu_plan`).
    """

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
        """The options as given, defaults for those that were not (None).

        Raises:
            UsageError: --days not positive, --jobs below 1, --peak-rps not positive or
                without --gpu-plan, named as the command line spells them.
        """
        if days is not None and not (math.isfinite(days) and days > 0):
            raise UsageError(
                f"--days {days:g} is not positive.",
                f"pass --days D with D > 0, or leave it out for the default {cls.days:g}.",
            )
        if jobs is not None and jobs < 1:
            raise UsageError(
                f"--jobs {jobs} is below 1.",
                f"pass --jobs N with N >= 1, or leave it out for the default {cls.jobs:,}.",
            )
        if peak_rps is not None and not (math.isfinite(peak_rps) and peak_rps > 0):
            raise UsageError(
                f"--peak-rps {peak_rps:g} is not positive.", "pass e.g. --peak-rps 20."
            )
        if peak_rps is not None and gpu_plan is None:
            raise UsageError(
                "--peak-rps is the request rate of --gpu-plan's inference demand; no "
                "--gpu-plan was given.",
                "add --gpu-plan FILE (a plan written by `moelambda gpu-plan`), or drop "
                "--peak-rps.",
            )
        return cls(
            cls.days if days is None else days,
            cls.jobs if jobs is None else jobs,
            cls.seed if seed is None else seed,
            gpu_plan,
            cls.peak_rps if peak_rps is None else peak_rps,
        )

    def inference_demand(self) -> np.ndarray | None:
        """GPUs the inference cluster needs each hour, or None without a GPU plan.

        Raises:
            UsageError: A GPU plan without a positive peak rate.
        """
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
        plan = GpuPlan.load(self.gpu_plan, option="--gpu-plan")
        return inference_demand_from_gpu_plan(plan, rates)


def replay(
    scheduler: str,
    *,
    trace: str | None = None,
    cluster: str | None = None,
    gpu_type: str | None = None,
    slot_s: float | None = None,
    lyra: LyraOptions | None = None,
    on_round: Callable[[float, dict[int, int]], None] | None = None,
    progress: Progress | None = None,
) -> Result:
    """One scheduler on one trace. Every input (trace, cluster, options) is checked before the
    replay starts.

    Args:
        scheduler: One of `SCHEDULERS`.
        trace: A shipped trace or a CSV in its artifact's format. Defaults to None: the
            family's default (elasticVpollux_e, workload-base; Lyra generates its own).
        cluster: A shape like "n16g4" or a spec CSV. Defaults to None: the family's default.
        gpu_type: Throughput tables, "T4" or "A100" (ElasticFlow and EDF only). Defaults to
            None ("T4").
        slot_s: Scheduling slot, seconds. Defaults to None (60).
        lyra: Lyra's generated trace. Defaults to None (`LyraOptions()`).
        on_round: Sees every round of ElasticFlow's family (`cluster.simulate.simulate`).
        progress: Called as jobs complete. Defaults to None.

    Returns:
        The replay's `cluster.simulate.Result`; `.summary()` is what `cluster simulate --json`
        prints.

    Raises:
        UsageError: An unknown scheduler, a slot that is not positive, a trace the throughput
            tables have no curve for, or an input the scheduler refuses.
    """
    from cluster.simulate import simulate
    from cluster.workload import load_cluster, load_curves, load_trace

    family = family_of([scheduler])
    slot_s = DEFAULT_SLOT_S if slot_s is None else slot_s
    if not slot_s > 0:
        raise UsageError(f"--slot {slot_s} is not positive.", "pass e.g. --slot 60.")
    say = progress or (lambda *_: None)
    if family == LYRA:
        from cluster.lyra import run_lyra

        options = lyra or LyraOptions()
        label = f"{scheduler}, {options.days:g} days"
        demand = options.inference_demand()
        say(label, 0, options.jobs)
        result = run_lyra(
            scheduler="gandiva" if scheduler == "lyra-gandiva" else scheduler,
            days=options.days,
            jobs=options.jobs,
            seed=options.seed,
            inference_demand=demand,
            progress=lambda done, total: say(label, done, total),
        ).result
        result.scheduler = scheduler
        return result
    trace = trace or DEFAULTS[family][0]
    shape = load_cluster(cluster or DEFAULTS[family][1])
    label = f"{scheduler} on {Path(trace).stem}"
    if family == RUBICK:
        from cluster.rubick import simulate_rubick

        return simulate_rubick(
            trace,
            scheduler=scheduler,
            interval_s=slot_s,
            cluster=shape,
            progress=lambda done, total: say(label, done, total),
        )
    jobs = load_trace(trace)
    gpu_type = gpu_type or DEFAULT_GPU_TYPE
    curves = None
    if scheduler in TABLES:
        curves = load_curves(gpu_type)
        missing = sorted({(j.model, j.batch) for j in jobs} - set(curves))
        if missing:
            raise UsageError(
                f"the {gpu_type} throughput tables have no curve for {missing[:3]}.",
                "pass the --gpu-type the trace was made for (the Pollux trace: T4; ITP: A100).",
            )
    policy = _policy(scheduler, shape, curves, gpu_type, slot_s)
    if hasattr(policy, "check"):
        policy.check(jobs)  # refused before any progress is reported
    say(label, 0, len(jobs))
    return simulate(
        jobs,
        shape,
        policy,
        slot_s=slot_s,
        progress=lambda arrived, _: say(label, arrived, len(jobs)),
        on_round=on_round,
    )


def simulate_scheduler(
    scheduler: str = "elasticflow",
    *,
    trace: str | None = None,
    cluster: str | None = None,
    gpu_type: str | None = None,
    slot_s: float | None = None,
    days: float | None = None,
    jobs: int | None = None,
    seed: int | None = None,
    gpu_plan: Path | None = None,
    peak_rps: float | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`moelambda cluster simulate`: replay a trace under one scheduler.

    Options the scheduler does not read are refused rather than ignored: trace, cluster and
    slot are ElasticFlow's and Rubick's families', gpu_type ElasticFlow's and EDF's, and days,
    jobs, seed, gpu_plan and peak_rps Lyra's (see `LyraOptions`). None means not given.

    Returns:
        The deadline-satisfactory ratio, average and p95 JCT, makespan, preemptions, GPU
        utilisation and the simulator's own wall time (`Result.summary`).

    Raises:
        UsageError: See `replay` and `refuse_unused`.
    """
    check_scheduler(scheduler)
    given = {"trace": trace, "cluster": cluster, "gpu-type": gpu_type, "slot": slot_s}
    given |= {"days": days, "jobs": jobs, "seed": seed, "gpu-plan": gpu_plan}
    refuse_unused([scheduler], given | {"peak-rps": peak_rps})
    lyra = LyraOptions.given(days, jobs, seed, gpu_plan, peak_rps)
    result = replay(
        scheduler,
        trace=trace,
        cluster=cluster,
        gpu_type=gpu_type,
        slot_s=slot_s,
        lyra=lyra,
        progress=progress,
    )
    return result.summary()


def compare_schedulers(
    names: list[str],
    *,
    trace: str | None = None,
    cluster: str | None = None,
    gpu_type: str | None = None,
    slot_s: float | None = None,
    days: float | None = None,
    jobs: int | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`moelambda cluster compare`: several schedulers of one family on one trace.

    Args:
        names: Schedulers of one family; every name is checked before any runs.
        trace: As `simulate_scheduler`, as are `cluster`, `gpu_type`, `slot_s`, `days`,
            `jobs` and `seed`.
        progress: Called as jobs complete. Defaults to None.

    Returns:
        {"trace", "cluster", "results"}: the trace and cluster replayed (defaults filled in)
        and one `Result.summary()` per scheduler, in the order given.

    Raises:
        UsageError: No names, unknown or mixed families, or an option none of them reads.
    """
    if not names:
        raise UsageError("--schedulers is empty.", f"pass e.g. {','.join(SCHEDULERS)}.")
    family = family_of(names)  # refuse unknown or mixed names before running anything
    given = {"trace": trace, "cluster": cluster, "gpu-type": gpu_type, "slot": slot_s}
    refuse_unused(names, given | {"days": days, "jobs": jobs, "seed": seed})
    lyra = LyraOptions.given(days, jobs, seed)
    rows = [
        replay(
            name,
            trace=trace,
            cluster=cluster,
            gpu_type=gpu_type,
            slot_s=slot_s,
            lyra=lyra,
            progress=progress,
        ).summary()
        for name in names
    ]
    return {
        "trace": trace or DEFAULTS[family][0],
        "cluster": cluster or DEFAULTS[family][1],
        "results": rows,
    }


def plot_comparison(
    rows: list[dict[str, Any]], path: Path, title: str, *, force: bool = False
) -> str:
    """A bar chart of the schedulers' deadline-satisfactory ratios (or, for traces without
    deadlines, their average JCT), written atomically.

    Args:
        rows: `compare_schedulers(...)["results"]`.
        path: The PNG to write.
        title: The chart's title.
        force: Replace `path` if it exists. Defaults to False.

    Returns:
        `path` as a string.

    Raises:
        UsageError: No scheduler finished a job (nothing to draw).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ground.files import write_file_atomically

    deadlines = any(r["deadline_ratio"] is not None for r in rows)
    if not deadlines and all(r["avg_jct_s"] is None for r in rows):
        raise UsageError(
            "no scheduler finished a job: the plot would be empty.",
            "leave --plot out, or replay more of the trace (e.g. more --days).",
        )
    fig, ax = plt.subplots(figsize=(6, 3.5))
    try:
        names = [str(r["scheduler"]) for r in rows]
        if deadlines:
            ax.bar(names, [r["deadline_ratio"] or 0.0 for r in rows], color="tab:blue")
            ax.set_ylabel("deadline-satisfactory ratio")
            ax.set_ylim(0, 1)
        else:  # Rubick's traces have no deadlines: compare JCT
            ax.bar(names, [(r["avg_jct_s"] or 0.0) / 3600 for r in rows], color="tab:blue")
            ax.set_ylabel("average JCT, hours")
        ax.set_title(title)
        fig.tight_layout()
        write_file_atomically(
            path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"), force=force
        )
    finally:
        plt.close(fig)
    return str(path)
