"""The schedulers against the ElasticFlow artifact's own runs (cluster/data/SOURCES.md gives
each command and the artifact's commit), round by round with the artifact's per-event logs
(which jobs hold how many GPUs at every event): ElasticFlow against the logs themselves, the
baselines against their digests (cluster/data/elasticflow/artifact/events.csv; the longer
traces are checked by `moelambda bench cluster`)."""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import pytest

import cluster.elasticflow as elasticflow
from cluster.artifact import EventDigest, EventLog, Rounds, artifact_events, artifact_runs
from cluster.edf import EDF
from cluster.ef_kernels import plan_round
from cluster.elasticflow import ElasticFlow
from cluster.gandiva import Gandiva
from cluster.simulate import overhead_s, simulate
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


def test_elasticflow_equals_the_artifact_round_by_round_on_cluster01s_first_300_jobs() -> None:
    """An ITP trace on the artifact's n64g8 (two switches, A100 tables): 196 events equal,
    227 of 300 jobs in time (the artifact's run gives 0.75667)."""
    seen, ratio = _rounds("cluster01", 300, "n64g8", "A100")
    artifact = (DATA / "elasticflow_cluster01-first300_n64g8_A100.rounds").read_text()
    assert seen == Rounds.loads(artifact).events
    assert ratio == 227 / 300


@pytest.mark.parametrize("trace", ["cluster01", "cluster02", "cluster03", "cluster05"])
def test_elasticflow_equals_the_artifact_event_by_event_on_whole_itp_traces(trace: str) -> None:
    """The artifact's whole runs: 1,139 events on cluster01 (1,352 jobs in time), 8,373 on
    cluster02 (4,909), 2,558 on cluster03 (1,566), 3,907 on cluster05 (3,065)."""
    cluster = load_cluster("n64g8")
    digest = EventDigest()
    policy = ElasticFlow(cluster, load_curves("A100"), "A100")
    result = simulate(load_trace(trace), cluster, policy, on_round=digest)
    assert digest.matches(artifact_events()[trace, "elasticflow"])
    assert len(result.met) == artifact_runs()[trace, "elasticflow"].accepted


def test_reusing_scale_up_estimates_changes_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-out reuses an estimate while a grant leaves what it read unchanged; every
    estimate made afresh (`reuse=False`) gives the same events, here on cluster02's first
    1,500 jobs (2,507 events; no artifact log of ElasticFlow on cluster02 to hold them to)."""
    digests = []
    for reuse in (True, False):
        monkeypatch.setattr(elasticflow, "plan_round", functools.partial(plan_round, reuse=reuse))
        cluster = load_cluster("n64g8")
        digest = EventDigest()
        policy = ElasticFlow(cluster, load_curves("A100"), "A100")
        simulate(load_trace("cluster02")[:1500], cluster, policy, on_round=digest)
        digests.append((digest.count, digest.hexdigest()))
    assert digests[0] == digests[1]
    assert digests[0][0] == 2507


@pytest.mark.parametrize(
    ("scheduler", "trace", "shape"),
    [
        ("tiresias", "elasticVpollux_e", "n16g4"),
        ("tiresias", "cluster01", "n64g8"),
        ("tiresias", "cluster02", "n64g8"),  # its last arrival keeps its own time
        ("tiresias", "cluster03", "n64g8"),
        ("gandiva", "cluster01", "n64g8"),
        ("gandiva", "cluster03", "n64g8"),
        ("edf", "cluster01", "n64g8"),
    ],
)
def test_baselines_equal_the_artifact_event_by_event(
    scheduler: str, trace: str, shape: str
) -> None:
    """Every event of the artifact's run: its time and the GPUs each job holds (Tiresias
    1,181 events on cluster01, 12,332 on cluster02, 5,217 on cluster03; Gandiva 832 and
    1,858), and the same jobs in time."""
    cluster = load_cluster(shape)
    policy = {
        "tiresias": lambda: Tiresias(cluster),
        "gandiva": lambda: Gandiva(cluster),
        "edf": lambda: EDF(cluster, load_curves("T4" if shape == "n16g4" else "A100")),
    }[scheduler]()
    log = artifact_events()[trace, scheduler]
    digest = EventDigest()
    result = simulate(load_trace(trace), cluster, policy, on_round=digest)
    assert (digest.count, digest.hexdigest()) == (log.events, log.sha256)
    assert digest.matches(log)
    assert len(result.met) == artifact_runs()[trace, scheduler].accepted


def test_the_overhead_base_follows_the_clusters_size() -> None:
    """`utils.estimate_overhead`: 7 s base on 256 GPUs or more (every ITP cluster), 2 s below;
    the artifact's log(x, 2), which is not log2 in the last bit for 3 GPUs."""
    assert overhead_s(32, False, 512) == 7 + 2 * 6
    assert overhead_s(32, False, 64) == 2 + 2 * 6
    assert overhead_s(1, True, 1024) == 7 + 47 + 2
    assert overhead_s(8, True, 64, cached=True) == 2
    assert overhead_s(3, False, 64) == 2 + (math.log(3, 2) + 1) * 2


def test_an_unfinished_log_is_compared_on_its_prefix() -> None:
    """A run that had not finished is compared on the events it logged, no more."""
    digest = EventDigest(prefix=2)
    for t in (0.0, 60.0, 120.0):
        digest(t, {1: 4})
    head = Rounds([(0.0, {1: 4}), (60.0, {1: 4})]).dumps()
    log = EventLog(2, False, hashlib.sha256(head.encode()).hexdigest())
    assert digest.matches(log)
    assert not digest.matches(EventLog(2, True, log.sha256))  # finished: all 3 must equal
    assert not EventDigest(prefix=2).matches(log)  # nothing seen
