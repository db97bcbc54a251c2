"""Rubick: the performance model (A2), its fit (A3), plan feasibility (A4), the artifact's
allocation rules (A6) and the reproduction of the artifact's simulator on `naive.csv`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cluster.rubick import (
    ARTIFACT_CLUSTER,
    RUBICK_SCHEDULERS,
    _family,
    _fit_3d,
    _Rubick,
    simulate_rubick,
)
from cluster.rubick_model import (
    MODELS,
    Constants,
    _feasible,
    artifact_iteration_ms,
    fit,
    gpu_curve,
    iteration_time,
    overlap,
)
from cluster.rubick_workload import Trace, placement_id, profile
from cluster.workload import Cluster
from ground.errors import UsageError

K = Constants(k_bwd=2.0, k_sync=1.0, k_opt=0.01, k_opt_off=0.5, k_const=3.0, k_off=1.0, k_swap=1.0)


def test_overlap_adds_at_k1_and_takes_the_max_as_k_grows():
    assert overlap(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert overlap(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert overlap(3.0, 4.0, 200.0) == pytest.approx(4.0, rel=1e-3)
    assert np.isfinite(overlap(5e4, 4e4, 71.0))  # the artifact's GPT-2 k_sync cannot overflow
    assert overlap(0.0, 2.5, 71.0) == pytest.approx(2.5)


def test_dp_plan_follows_eq1():
    # fwd 10, bwd 20, DP all-reduce 100*2*3/4/10 = 15 added (k_sync = 1), optimizer 0.01*100
    t = iteration_time(K, t_fwd=10, params=100, d=4, b_dp=10)
    assert t == pytest.approx(10 + 20 + 15 + 1.0 + 3.0)
    # GC recomputes one forward; GA runs a forwards and a-1 extra backwards
    assert iteration_time(K, t_fwd=10, params=100, d=4, b_dp=10, gc=True) == pytest.approx(t + 10)
    assert iteration_time(K, t_fwd=10, params=100, d=4, b_dp=10, a=2) == pytest.approx(t + 30)
    # ZeRO-DP slices the optimizer across the d ranks
    assert iteration_time(K, t_fwd=10, params=100, d=4, b_dp=10, zero="zero-dp") == pytest.approx(
        t - 1.0 + 0.25
    )


def test_offload_and_3d_terms():
    # ZeRO-Offload (k_off = k_swap = 1: additive): comm 15 + off 100/(4*5) twice + CPU update
    t = iteration_time(
        K, t_fwd=10, params=100, d=4, b_dp=10, zero="zero-offload", cpus=2, b_pcie=5
    )
    assert t == pytest.approx(10 + 35 + (15 + 5) + (0.5 * 100 / 8 + 5) + 3)
    # single GPU: no communication at all; pipeline: (m+p-1)/p forward stretch plus PP traffic
    assert iteration_time(K, t_fwd=10, params=100) == pytest.approx(10 + 20 + 1 + 3)
    pp = iteration_time(K, t_fwd=10, params=100, p=2, m=4, batch=1, seq_hid=1, b_pp=1)
    fwd = 10 * 5 / 2
    assert pp == pytest.approx(fwd + 2 * fwd + 4 + 100 * 0.01 / 2 + 3)


def _samples(spec):
    g = np.tile(np.arange(1, 9), 6)
    zt = np.repeat([0, 1, 2, 0, 1, 2], 8)
    gc = np.repeat([False, False, False, True, True, True], 8)
    fwd = spec.forward_ms / g
    return fwd, g, zt, gc


def test_fit_recovers_the_model_it_was_generated_from():
    spec = MODELS["gpt2"]
    fwd, g, zt, gc = _samples(spec)
    sync, opt, it = artifact_iteration_ms(
        spec.constants.array(), fwd, g, zt, gc, spec.params_mib, spec.b_nvlink, spec.b_pcie
    )
    got = fit(spec, fwd, g, zt, gc, sync, opt, it)
    pred = artifact_iteration_ms(
        got.array(), fwd, g, zt, gc, spec.params_mib, spec.b_nvlink, spec.b_pcie
    )
    assert np.sqrt(np.mean(np.log(pred[2] / it) ** 2)) < 0.01
    assert got.k_bwd == pytest.approx(spec.constants.k_bwd, rel=0.05)
    assert got.k_opt_off == pytest.approx(spec.constants.k_opt_off, rel=0.1)


def test_best_plan_respects_memory_and_batch_split():
    llama = MODELS["llama7"]
    assert not _feasible(llama, np.array([1, 8]), ("ga", "")).any()  # plain DP never fits
    assert _feasible(llama, np.array([1]), ("ga", "zero-offload")).all()
    gpt2 = MODELS["gpt2"]
    assert not _feasible(gpt2, np.arange(1, 9), ("gc", "zero-dp")).any()
    curve = gpu_curve(MODELS["vit"])
    assert curve.gpus[3] == 2  # 64 samples do not split over 3 GPUs: hold the 2-GPU plan
    assert np.all(np.diff(curve.throughput[1:]) >= 0)
    assert curve.plan[8] is not None and curve.plan[8][0] in ("ga", "gc")
    llama_curve = gpu_curve(llama)  # only ZeRO variants fit: offload on 1 GPU, ZeRO-DP from 4
    assert llama_curve.plan[1] == ("ga", "zero-offload")
    assert llama_curve.plan[4] == ("ga", "zero-dp") and llama_curve.gpus[5] == 4


def test_3d_fit_places_one_chunk_per_node():
    assert _fit_3d(np.array([8, 8, 0, 0]), (8, 8)) == {0: 8, 1: 8}
    assert _fit_3d(np.array([8, 4, 8, 0]), (8, 8)) in ({0: 8, 2: 8, 1: 0}, {0: 8, 1: 0, 2: 8})
    assert _fit_3d(np.array([8, 4, 4, 0]), (8, 8)) is None
    assert placement_id((8, 4, 8)) == "488"


def test_profile_lookup_falls_back_like_the_artifact():
    vit = profile("vit")
    assert vit.iter_time((8,), "zero-dp") == pytest.approx(0.05183963214649873)
    # GPT-2 has no GA row on one GPU: the mean of every one-GPU row stands in
    gpt2 = profile("gpt2")
    assert gpt2.iter_time((1,), "ga") == pytest.approx(gpt2._means[1, 1])
    assert gpt2.iter_time((2,), "ga") != gpt2._means[1, 2]  # an exact row wins
    # a LLaMA 3D plan runs at the mean over its node and GPU count (the artifact's lookup
    # never matches its plan), not at its own, faster row
    llama7 = profile("llama7")
    assert llama7.iter_time((8,) * 8, _family("248")) == pytest.approx(1.0656036842)
    assert llama7.iter_time((8,) * 8, "248") == pytest.approx(0.672942105)
    assert profile("llama7").iter_time((8,), "zero-offload") == pytest.approx(9.400914431)


def _trace(models, sla=None):
    n = len(models)
    return Trace(
        names=tuple(f"{m}-{i}" for i, m in enumerate(models)),
        submit=np.zeros(n),
        model=tuple(models),
        gpus=np.full(n, 8),
        plan=("zero-dp",) * n,
        steps=np.full(n, 100),
        sla=np.zeros(n, dtype=bool) if sla is None else np.array(sla),
    )


def test_dp_jobs_take_a_whole_free_node_each_and_the_rest_wait():
    trace = _trace(["vit"] * 3)
    policy = _Rubick(trace, Cluster(2, 8))
    policy.decide(60.0, np.arange(3), np.full(3, -1))
    assert policy.alloc.sum(axis=1).tolist() == [8, 8, 0]
    assert (policy.alloc.sum(axis=0) == 8).all()
    assert policy.plan[0] == "zero-dp"


def test_llama_takes_its_menu_and_grows_into_leftovers():
    trace = _trace(["llama7", "vit"])
    policy = _Rubick(trace, ARTIFACT_CLUSTER)
    policy.decide(60.0, np.arange(2), np.full(2, -1))
    assert policy.alloc[1].sum() == 8  # the DP job gets one node
    assert policy.alloc[0].sum() == 32  # LLaMA grows from 16 to the largest count that fits
    assert policy.plan[0] == "244"
    assert policy.alloc.sum(axis=0).max() <= 8


def test_bad_input_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        simulate_rubick("no-such-workload")
    with pytest.raises(UsageError):
        simulate_rubick("naive", scheduler="sia")
    bad = tmp_path / "w.csv"
    bad.write_text("name,submission_time\nx,0\n")
    with pytest.raises(UsageError):
        simulate_rubick(bad)
    assert "rubick" in RUBICK_SCHEDULERS


def test_multi_node_jobs_read_no_curve_and_go_last():
    trace = _trace(["llama30", "llama30", "vit"])
    policy = _Rubick(trace, ARTIFACT_CLUSTER)
    # 48 GPUs: beyond one node the curve reads -1, a steep slope
    slope = policy._slope(np.array([0, 1]), np.array([48, 8]), 1, np.zeros(2))
    assert slope[0] > 1.0 and slope[1] == 0.0  # on one node the curve is flat past 4 GPUs


def test_naive_reproduces_the_artifact_simulator():
    result = simulate_rubick("naive")
    assert result.jobs == 10 and len(result.finish) == 10
    assert result.avg_jct_s == pytest.approx(895.6, rel=0.10)
    assert result.makespan_s == pytest.approx(6060, rel=0.10)
    assert math.isclose(result.makespan_s % 60, 0)  # the artifact ends on a round boundary
    assert all(f <= result.makespan_s for f in result.finish.values())


def test_base_trace_reproduces_the_artifact_simulator():
    result = simulate_rubick("workload-base")
    assert result.avg_jct_s == pytest.approx(3638, rel=0.10)
    assert result.makespan_s == pytest.approx(58680, rel=0.10)


def test_ablations_hold_each_request_and_never_restart():
    trace = _trace(["vit", "gpt2", "llama7"])
    trace = Trace(**{**trace.__dict__, "gpus": np.array([2, 4, 16]), "plan": ("gc", "ga", "242")})
    for scheduler, vit_plan in (("rubick-n", "gc"), ("rubick-e", "zero-dp")):
        policy = _Rubick(trace, ARTIFACT_CLUSTER, scheduler)
        policy.fix_plans(reconfigure=scheduler == "rubick-e")
        for now in (60.0, 120.0):
            policy.decide(now, np.arange(3), np.zeros(3, dtype=int))
        assert policy.alloc.sum(axis=1).tolist() == [2, 4, 16]
        assert policy.plan[0] == vit_plan
    assert policy.plan[2] == "182"  # rubick-e: the menu's plan for 16 GPUs on two nodes
    result = simulate_rubick("naive", scheduler="rubick-n")
    assert result.preemptions == 0
    assert result.avg_jct_s > simulate_rubick("naive").avg_jct_s
