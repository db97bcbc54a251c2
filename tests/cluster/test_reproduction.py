"""The schedulers against the ElasticFlow artifact's own runs (cluster/data/SOURCES.md gives
each command and the artifact's commit). ElasticFlow is compared round by round with the
artifact's per-event log (which jobs hold how many GPUs at every event); the baselines by
the number of jobs that meet their deadlines."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.artifact import Rounds
from cluster.edf import EDF
from cluster.elasticflow import ElasticFlow
from cluster.simulate import simulate
from cluster.tiresias import Tiresias
from cluster.workload import load_cluster, load_curves, load_trace

DATA = Path(__file__).parent / "data"


def _rounds(trace: str, count: int | None, shape: str, gpu_type: str) -> tuple[list, float]:
    jobs = load_trace(trace)[:count]
    cluster = load_cluster(shape)
    policy = ElasticFlow(cluster, load_curves(gpu_type), gpu_type)
    seen: list[tuple[float, dict[int, int]]] = []
    result = simulate(jobs, cluster, policy, on_round=lambda t, held: seen.append((t, held)))
    return seen, result.deadline_ratio or 0.0


def test_elasticflow_equals_the_artifact_round_by_round_on_the_195_job_trace() -> None:
    """282 events, the same jobs holding the same GPUs at each; 142 of 195 jobs in time."""
    seen, ratio = _rounds("elasticVpollux_e", None, "n16g4", "T4")
    artifact = Rounds.loads((DATA / "elasticflow_elasticVpollux_e_n16g4_T4.rounds").read_text())
    assert len(seen) == len(artifact.events) == 282
    assert seen == artifact.events
    assert ratio == 142 / 195


@pytest.mark.slow
def test_elasticflow_equals_the_artifact_round_by_round_on_cluster01s_first_300_jobs() -> None:
    """An ITP trace on the artifact's n64g8 (two switches, A100 tables): 196 events equal,
    227 of 300 jobs in time (the artifact's run gives 0.75667)."""
    seen, ratio = _rounds("cluster01", 300, "n64g8", "A100")
    artifact = (DATA / "elasticflow_cluster01-first300_n64g8_A100.rounds").read_text()
    assert seen == Rounds.loads(artifact).events
    assert ratio == 227 / 300


def test_edf_and_tiresias_equal_the_artifact_on_cluster01() -> None:
    """The artifact's runs on cluster01 (n64g8, A100, 60 s): EDF 0.18683 (298 of 1,595),
    Tiresias 0.49342 (787)."""
    jobs, cluster = load_trace("cluster01"), load_cluster("n64g8")
    assert len(simulate(jobs, cluster, EDF(cluster, load_curves("A100"))).met) == 298
    assert len(simulate(jobs, cluster, Tiresias(cluster)).met) == 787
