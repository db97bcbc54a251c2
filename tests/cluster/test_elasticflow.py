"""ElasticFlow's worked examples (paper Fig. 3 and 4) and the simulator's invariants."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.elasticflow import EDF, ElasticFlow, progressive_filling
from cluster.simulate import simulate
from cluster.workload import Cluster, Job, ScalingCurve, load_curves, load_trace

# Fig. 3/4's curve: 1 unit of throughput on one GPU, 1.5 on two, 2 on four.
CURVE = ScalingCurve(np.array([1, 2, 4]), np.array([1.0, 1.5, 2.0]))


def test_progressive_filling_reproduces_figure_4() -> None:
    """G = 4, A and B hold 3 GPUs in slot 0; C needs 3 units by the end of slot 1: a cap of 2
    gives 1 + 1.5 = 2.5 < 3, a cap of 4 gives 1 + 2 = 3, so C's MSS is (1, 4)."""
    free = np.array([1, 4])
    assert progressive_filling(CURVE, 2.5, free, 1.0).tolist() == [1, 2]
    assert progressive_filling(CURVE, 3.0, free, 1.0).tolist() == [1, 4]
    assert progressive_filling(CURVE, 3.1, free, 1.0) is None
    # with room to spare, only the latest slots are taken
    assert progressive_filling(CURVE, 2.0, np.array([4, 4, 4]), 1.0).tolist() == [0, 1, 1]


def _figure_3_jobs() -> tuple[list[Job], dict]:
    """A and B, 3 units each (a unit = 600 s on one GPU), deadlines 3 and 3.5 units (plus the
    scaling overhead's minute), on 2 GPUs."""
    curve = ScalingCurve(np.array([1, 2]), np.array([1.0, 1.5]))
    jobs = [
        Job(0, 0.0, 1800.0, "m", 1, 1, 1800.0 + 60, 1800.0),
        Job(1, 0.0, 1800.0, "m", 1, 1, 2100.0 + 60, 1800.0),
    ]
    return jobs, {("m", 1): curve}


def test_edf_misses_b_where_one_gpu_each_meets_both() -> None:
    jobs, curves = _figure_3_jobs()
    cluster = Cluster(1, 2)
    edf = simulate(jobs, curves, cluster, EDF(cluster), slot_s=60.0)
    assert edf.finish[0] <= jobs[0].deadline < jobs[1].deadline < edf.finish[1]
    assert edf.deadline_ratio == 0.5
    flow = simulate(jobs, curves, cluster, ElasticFlow(cluster, 60.0), slot_s=60.0)
    assert flow.deadline_ratio == 1.0 and not flow.dropped


def test_admission_drops_a_job_no_plan_can_finish_in_time() -> None:
    jobs, curves = _figure_3_jobs()
    hopeless = Job(2, 0.0, 1e6, "m", 1, 1, 600.0, 1e6)
    cluster = Cluster(1, 2)
    result = simulate([*jobs, hopeless], curves, cluster, ElasticFlow(cluster, 60.0))
    assert result.dropped == [2] and 2 not in result.finish
    assert result.deadline_ratio == pytest.approx(2 / 3)
    no_admission = ElasticFlow(cluster, 60.0, admission=False)
    assert simulate([*jobs, hopeless], curves, cluster, no_admission).dropped == []


def test_the_shipped_trace_and_t4_curves_load() -> None:
    jobs = load_trace("elasticVpollux_e")
    curves = load_curves("T4")
    assert len(jobs) == 195 and min(j.submit for j in jobs) == 0
    assert {(j.model, j.batch) for j in jobs} <= set(curves)
    for curve in curves.values():  # levels double and throughput rises with them
        assert (np.diff(curve.levels) > 0).all() and (np.diff(curve.rate) > 0).all()
    # a job's iterations at its own GPUs take its recorded duration (within 1 %)
    job = jobs[0]
    seconds = job.iterations / float(curves[job.model, job.batch].at(job.gpus))
    assert seconds == pytest.approx(job.duration, rel=0.01)


def test_cluster_simulate_cli_reports_the_issue_s_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from moelambda.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["cluster", "simulate", "--scheduler", "edf", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    issue = "scheduler jobs deadline_ratio avg_jct_s p95_jct_s makespan_s preemptions"
    assert list(summary) == [*issue.split(), "gpu_utilisation", "wall_s"]
    assert summary["jobs"] == 195 and 0 < summary["deadline_ratio"] < 1
    assert 0 < summary["gpu_utilisation"] <= 1 and summary["preemptions"] == 0  # not elastic
    for args, error in (
        (["--scheduler", "gandiva"], "not built yet"),
        (["--cluster", "n0"], "neither a shape"),
        (["--trace", str(tmp_path / "none.csv")], "neither a shipped trace"),
        (["--gpu-type", "A100"], "no curve for"),
    ):
        refused = runner.invoke(app, ["cluster", "simulate", *args])
        assert refused.exit_code == 2 and error in " ".join(refused.output.split()), args


def test_tiresias_runs_the_least_attained_service_first_and_preempts() -> None:
    """One GPU: a long job runs alone until a short one arrives; the long one has attained
    more than the first queue's limit, so the newcomer (queue 0) preempts it and, needing less
    than the limit, finishes first. Without the limit both queue FIFO."""
    from cluster.tiresias import Tiresias

    curve = ScalingCurve(np.array([1]), np.array([1.0]))
    long_job = Job(0, 0.0, 7200.0, "m", 1, 1, float("inf"), 7200.0)
    short_job = Job(1, 1200.0, 600.0, "m", 1, 1, float("inf"), 600.0)
    cluster = Cluster(1, 1)
    result = simulate(
        [long_job, short_job], {("m", 1): curve}, cluster, Tiresias(cluster, limits=(900.0,))
    )
    assert result.finish[1] < result.finish[0]
    assert result.preemptions >= 1
    fifo = simulate(
        [long_job, short_job], {("m", 1): curve}, cluster, Tiresias(cluster, limits=(1e9,))
    )
    assert fifo.finish[0] < fifo.finish[1] and fifo.preemptions == 0


def test_cluster_compare_runs_several_schedulers_and_plots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from moelambda.cli import app

    plot = tmp_path / "c.png"
    args = ["cluster", "compare", "--schedulers", "edf,tiresias", "--plot", str(plot), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert [r["scheduler"] for r in rows] == ["edf", "tiresias"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    refused = CliRunner().invoke(app, ["cluster", "compare", "--schedulers", "edf,lyra"])
    assert refused.exit_code == 2 and "not built yet" in refused.output


def test_bench_cluster_times_each_scheduler() -> None:
    import json

    from typer.testing import CliRunner

    from moelambda.cli import app

    result = CliRunner().invoke(app, ["bench", "cluster", "--schedulers", "edf", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["runs"]["edf"]["wall_s"] > 0 and summary["elasticflow_target_s"] == 5.0
