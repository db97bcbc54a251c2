"""EDF's array replay (`EDF.replay`) against the simulator's generic loop, its specification:
the same rounds (time and GPUs per job), the same ends, deadlines met and summary."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.edf import EDF
from cluster.simulate import Result, simulate
from cluster.workload import Cluster, Job, ScalingCurve, load_cluster, load_curves, load_trace


def _both(trace: str, count: int, shape: str, gpu_type: str) -> tuple[tuple, tuple]:
    jobs, cluster, curves = load_trace(trace)[:count], load_cluster(shape), load_curves(gpu_type)

    def run(reference: bool) -> tuple[Result, list]:
        seen: list = []
        policy = EDF(cluster, curves)
        result = simulate(
            jobs, cluster, policy, on_round=lambda t, h: seen.append((t, h)), reference=reference
        )
        return result, seen

    return run(True), run(False)


@pytest.mark.parametrize(
    ("trace", "count", "shape", "gpu_type"),
    [
        ("elasticVpollux_e", 195, "n16g4", "T4"),
        ("cluster04", 1000, "n128g8", "A100"),  # hundreds of jobs waiting at once
    ],
)
def test_the_array_replay_equals_the_generic_loop(
    trace: str, count: int, shape: str, gpu_type: str
) -> None:
    (slow, slow_rounds), (fast, fast_rounds) = _both(trace, count, shape, gpu_type)
    assert fast_rounds == slow_rounds and len(fast_rounds) > 100
    assert fast.finish == slow.finish and fast.met == slow.met
    assert fast.preemptions == slow.preemptions > 0
    slow_summary, fast_summary = slow.summary(), fast.summary()
    slow_summary.pop("wall_s"), fast_summary.pop("wall_s")
    assert fast_summary == slow_summary


def test_a_waiting_job_keeps_the_merge_rule() -> None:
    """One GPU: A (130 s of work) runs; B arrives at 100 s with a later deadline and waits.
    A's end (130 s) is within a slot and B's planned end differs from it, so the next round
    is a slot later (160 s), not at A's end: the waiting job's end counts for the merge
    rule although it can never come first."""
    cluster = Cluster(1, 1)
    curves = {("m", 1): ScalingCurve(np.array([1]), np.array([1.0]))}
    jobs = [
        Job(0, 0.0, 130.0, "m", 1, 1, 1000.0, 130.0),
        Job(1, 100.0, 50.0, "m", 1, 1, 2000.0, 50.0),
    ]
    times: list[list[float]] = [[], []]
    for seen, reference in zip(times, (True, False), strict=True):
        policy = EDF(cluster, curves)
        simulate(
            jobs, cluster, policy, on_round=lambda t, _, s=seen: s.append(t), reference=reference
        )
    assert times[0] == times[1] and times[1][:3] == [0.0, 100.0, 160.0]
