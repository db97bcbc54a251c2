"""ElasticFlow's worked examples (paper Fig. 3 and 4), its artifact's planning semantics, and
the reproduction of the artifact's numbers on its 195-job trace."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.edf import EDF
from cluster.ef_placement import Nodes
from cluster.ef_planner import Demand, Profile, plan
from cluster.elasticflow import ElasticFlow
from cluster.gandiva import Gandiva
from cluster.simulate import simulate
from cluster.tiresias import Tiresias
from cluster.workload import Cluster, Job, ScalingCurve, load_cluster, load_curves, load_trace

# Fig. 3/4's curve: 1 unit of throughput on one GPU, 1.5 on two, 2 on four.
CURVE = ScalingCurve(np.array([1, 2, 4]), np.array([1.0, 1.5, 2.0]))


def _demand(work: float, deadline: float, curve: ScalingCurve = CURVE) -> Demand:
    levels = tuple(int(g) for g in curve.levels)
    rates = dict(zip(levels, (float(r) for r in curve.rate), strict=True))
    return Demand(work, deadline, levels, rates, levels[-1])


def test_minimum_satisfactory_share_reproduces_figure_4() -> None:
    """G = 4, A and B hold 3 GPUs in slot 0; C must do its work by the end of slot 1: 2.5
    units fit under a cap of 2 (1 + 1.5), 3 units need a cap of 4 (1 + 2), 3.1 do not fit."""
    free = Profile((0, 1), (1, 4))
    cases = ((2.5, 2, Profile((0, 1, 2), (0, 2, 4))), (3.0, 4, Profile((0, 2), (0, 4))))
    for work, gpus, left in cases:
        p = plan(_demand(work, 2.0), free, 0.0, 1.0, 4)
        assert p.ok and p.alloc == ((0, 1), (1, gpus))
        assert p.end == 2 and p.real_end == 2.0 and p.free == left
    late = plan(_demand(3.1, 2.0), free, 0.0, 1.0, 4)
    assert not late.ok and late.real_end > 2.0  # the fallback runs on past the deadline


def test_a_plan_keeps_a_zero_breakpoint_where_the_artifact_re_plans() -> None:
    """With 4 GPUs free throughout, 2 units at a cap of 1 run from now and end in slot 2; an
    earlier job's end at slot 3 is a profile breakpoint before the deadline (slot 4), so the
    plan's allocation drops to zero there: the artifact's next scale event."""
    p = plan(_demand(2.0, 4.0), Profile((0, 3), (4, 5)), 0.0, 1.0, 5)
    assert p.ok and p.alloc == ((0, 1), (3, 0)) and p.end == 2
    assert p.next_change() == 3


def test_a_scale_up_estimate_runs_the_new_level_to_the_next_breakpoint() -> None:
    """The idle-GPU hand-out's estimate: 4 GPUs from now finish 3 units in 1.5 s, before the
    profile's next breakpoint (slot 3): one piece ending at slot 2."""
    p = plan(_demand(3.0, 4.0), Profile((0, 3), (4, 5)), 0.0, 1.0, 5, assign=4)
    assert p.alloc == ((0, 4),) and p.end == 2 and p.real_end == 2.0


def _figure_3_jobs() -> tuple[list[Job], dict]:
    """A and B, 3 units each (a unit = 600 s on one GPU), deadlines 3 and 3.5 units (plus the
    scaling overhead's minute), on 2 GPUs."""
    curve = ScalingCurve(np.array([1, 2]), np.array([1.0, 1.5]))
    jobs = [
        Job(0, 0.0, 1800.0, "m", 64, 1, 1800.0 + 60, 1800.0),
        Job(1, 0.0, 1800.0, "m", 64, 1, 2100.0 + 60, 1800.0),
    ]
    return jobs, {("m", 64): curve}


def test_edf_misses_b_where_one_gpu_each_meets_both() -> None:
    """EDF gives A both GPUs (its largest profiled count) and B waits; ElasticFlow's MSS is
    one GPU each, and both finish in time."""
    jobs, curves = _figure_3_jobs()
    cluster = Cluster(1, 2)
    edf = simulate(jobs, cluster, EDF(cluster, curves))
    assert edf.finish[0] <= jobs[0].deadline < jobs[1].deadline < edf.finish[1]
    assert edf.met == {0}
    flow = simulate(jobs, cluster, ElasticFlow(cluster, curves, "T4"))
    assert flow.met == {0, 1} and not flow.dropped


def test_admission_drops_a_job_no_plan_can_finish_in_time() -> None:
    """A hopeless arrival is declined; the jobs admitted before it keep their plans. (The
    artifact admits or declines all arrivals of one scheduling round together.)"""
    jobs, curves = _figure_3_jobs()
    hopeless = Job(2, 120.0, 1e6, "m", 64, 1, 720.0, 1e6)
    cluster = Cluster(1, 2)
    result = simulate([*jobs, hopeless], cluster, ElasticFlow(cluster, curves, "T4"))
    assert result.dropped == [2] and 2 not in result.finish
    assert result.deadline_ratio == pytest.approx(2 / 3)
    no_admission = ElasticFlow(cluster, curves, "T4", admission=False)
    assert simulate([*jobs, hopeless], cluster, no_admission).dropped == []


def test_the_shipped_trace_and_t4_tables_load() -> None:
    jobs = load_trace("elasticVpollux_e")
    curves = load_curves("T4")
    assert len(jobs) == 195 and [j.id for j in jobs] == list(range(195))
    assert {(j.model, j.batch) for j in jobs} <= set(curves)
    # the tables keep counts that slow a job down (EDF gives them); "nan" cells are dropped
    ncf = curves["ncf", 32768]
    assert ncf.max_gpus == 64 and ncf.rate[-1] < ncf.rate[0]
    assert curves["yolov3", 64].max_gpus == 16
    # a job's iterations at its own GPUs take its recorded duration (within 1 %)
    job = jobs[0]
    seconds = job.iterations / float(curves[job.model, job.batch].at(job.gpus))
    assert seconds == pytest.approx(job.duration, rel=0.01)


def test_tiresias_demotes_past_its_limit_and_the_newcomer_preempts() -> None:
    """One GPU: a long job alone passes the first queue's 3,250 GPU-seconds and is demoted;
    a short job arriving later (queue 0) preempts it and finishes first. Behind a job that
    ends before its demotion, a newcomer waits (first come, first served within a queue)."""
    cluster = Cluster(1, 1)
    long_job = Job(0, 0.0, 7200.0, "m", 1, 1, float("inf"), 7200.0)
    late_short = Job(1, 4000.0, 600.0, "m", 1, 1, float("inf"), 600.0)
    result = simulate([long_job, late_short], cluster, Tiresias(cluster))
    assert result.finish[1] < result.finish[0] and result.preemptions >= 1
    shorter = Job(0, 0.0, 3000.0, "m", 1, 1, float("inf"), 3000.0)
    early_short = Job(1, 1200.0, 600.0, "m", 1, 1, float("inf"), 600.0)
    fifo = simulate([shorter, early_short], cluster, Tiresias(cluster))
    assert fifo.finish[0] < fifo.finish[1] and fifo.preemptions == 0


@pytest.fixture(scope="module")
def pollux() -> tuple[list[Job], dict, Cluster]:
    return load_trace("elasticVpollux_e"), load_curves("T4"), load_cluster("n16g4")


def test_edf_and_tiresias_reproduce_the_artifact_on_the_195_job_trace(pollux) -> None:  # type: ignore[no-untyped-def]
    """The artifact's own runs: EDF 0.11795 (23 of 195), Tiresias 0.28718 (56)."""
    jobs, curves, cluster = pollux
    edf = simulate(jobs, cluster, EDF(cluster, curves))
    assert len(edf.met) == 23
    assert len(simulate(jobs, cluster, Tiresias(cluster)).met) == 56


def test_gandiva_shares_a_node_between_small_jobs_and_time_slices_past_capacity() -> None:
    """One 4-GPU node, five one-GPU jobs of 600 s: they share one node set (the artifact joins
    while its load + 1 < 4, then time-slices into it), four run at a time and rotate on whole
    minutes, so the five finish together no sooner than 3,000 GPU-s / 4 GPUs."""
    cluster = Cluster(1, 4)
    jobs = [Job(i, 0.0, 600.0, "m", 1, 1, float("inf"), 600.0) for i in range(5)]
    policy = Gandiva(cluster)
    result = simulate(jobs, cluster, policy)
    assert set(result.finish) == set(range(5)) and not policy.pending
    assert result.makespan_s >= 750 and result.preemptions > 0
    one_job = simulate(jobs[:1], cluster, Gandiva(cluster))
    assert one_job.preemptions == 0 and one_job.makespan_s < result.makespan_s


def test_gandiva_reproduces_the_artifact_on_the_195_job_trace(pollux) -> None:  # type: ignore[no-untyped-def]
    """The artifact's run: 0.09231 (18 of 195)."""
    jobs, curves, cluster = pollux
    assert len(simulate(jobs, cluster, Gandiva(cluster)).met) == 18


def _feasible_by_brute_force(jobs: list[tuple[int, int, int]], gpus: int, slots: int) -> bool:
    """Any per-slot integer split of the GPUs meeting every (k, work, deadline slot)?"""
    import itertools
    from functools import cache

    splits = [c for c in itertools.product(range(gpus + 1), repeat=len(jobs)) if sum(c) <= gpus]

    @cache
    def done_from(t: int, left: tuple[int, ...]) -> bool:
        if not any(left):
            return True
        if t == slots or any(w and d <= t for w, (_, _, d) in zip(left, jobs, strict=True)):
            return False
        return any(
            done_from(
                t + 1,
                tuple(max(w - k * x, 0) for w, x, (k, _, _) in zip(left, c, jobs, strict=True)),
            )
            for c in splits
        )

    return done_from(0, tuple(w for _, w, _ in jobs))


def test_theorem_1_matches_brute_force_and_admission_never_admits_the_infeasible() -> None:
    """Linear curves T(x) = k x, work in whole GPU-slots: Theorem 1's condition (in deadline
    order, cumulative GPU-time <= G x deadline) holds exactly when some allocation meets every
    deadline. MSS admission is sound (it never admits an infeasible set) but not complete: a
    cap holds for a whole period, so a job needing 2.5 GPUs per slot takes 3 in each (the
    artifact and Algorithm 1 alike), and a few feasible sets are declined."""
    import random

    rng = random.Random(2)
    declined = 0
    for _ in range(150):
        gpus, slots = rng.choice([2, 3, 4]), rng.choice([2, 3])
        jobs = []
        for _ in range(rng.choice([2, 3])):
            k = rng.choice([1, 2, 3])
            jobs.append((k, k * rng.randint(1, 6), rng.randint(1, slots)))
        jobs.sort(key=lambda j: j[2])
        used, theorem = 0.0, True
        for k, work, deadline in jobs:
            used += work / k
            theorem &= used <= gpus * deadline + 1e-9
        feasible = _feasible_by_brute_force(jobs, gpus, slots)
        assert theorem == feasible, jobs
        free, admitted = Profile.constant(gpus), True
        for k, work, deadline in jobs:
            curve = ScalingCurve(np.arange(1, gpus + 1), k * np.arange(1, gpus + 1.0))
            p = plan(_demand(work, float(deadline), curve), free, 0.0, 1.0, gpus)
            admitted &= p.ok
            free = p.free
        assert feasible or not admitted, jobs
        declined += feasible and not admitted
    assert declined < 10
    linear = ScalingCurve(np.arange(1, 5), np.arange(1, 5.0))
    first = plan(_demand(5.0, 2.0, linear), Profile.constant(4), 0.0, 1.0, 4)
    assert first.alloc == ((0, 3),) and first.end == 2  # 2.5 GPUs a slot: a cap of 3, twice


def test_placement_shares_a_node_in_joining_order() -> None:
    """One switch of two 4-GPU nodes: the 2-GPU job opens node 0, the 1-GPU jobs fill it
    (a set with 2 GPUs left takes a 1-GPU job before a new node is opened)."""
    nodes = Nodes(1, 2, 4)
    assert nodes.place({7: 2, 8: 1, 9: 1}) == {7: [0], 8: [2], 9: [3]}


def test_the_free_node_list_sorts_by_node_id_within_a_switch_stably() -> None:
    """Two switches of two 4-GPU nodes, ids 0 and 1 in each: jobs on node 0 and node 1 of
    the first switch released in the order 1, 0 come back behind the second switch's nodes
    of the same id, so the next 4-GPU job opens the second switch's node 0 (GPU 8)."""
    nodes = Nodes(2, 2, 4)
    assert nodes.place({1: 4, 2: 4}) == {1: [0], 2: [4]}
    nodes.release([2, 1])
    assert nodes.free == [2, 0, 3, 1]
    assert nodes.place({3: 4}) == {3: [8]}
