"""Lyra (spec Part A): the worked examples, the kernels against brute force, the generator's
calibration and the qualitative orderings of §A4 on a small generated trace."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cluster.lyra import LYRA_SCHEDULERS, Assumptions, replay, run_lyra
from cluster.lyra_cluster import Cluster
from cluster.lyra_mckp import (
    flex_items,
    greedy_marginal,
    reclaim_lyra,
    reclaim_scf,
    server_fraction_costs,
    solve_mckp,
)
from cluster.lyra_trace import (
    ELASTIC_GPU_SHARE,
    INFER_GPUS,
    LOAD,
    TRAIN_GPUS,
    diurnal_utilisation,
    generate_trace,
    inference_demand_from_gpu_plan,
)
from ground.errors import UsageError

# Table 3.1's layout [R]: a spans servers 1-2, b fills 3, c and d put 80 % on 4 / 6, 20 % on 5.
TABLE_3_1 = {1: {"a": 4}, 2: {"a": 4}, 3: {"b": 8}, 4: {"c": 4}, 5: {"c": 1, "d": 1}, 6: {"d": 4}}


def test_table_3_1_costs_and_reclaim():
    costs = server_fraction_costs(TABLE_3_1)
    assert costs == {1: 0.5, 2: 0.5, 3: 1.0, 4: 0.5, 5: 1.0, 6: 0.5}
    chosen, preempted = reclaim_lyra(2, TABLE_3_1)
    assert sorted(chosen) == [1, 2] and preempted == {"a"}
    chosen, preempted = reclaim_lyra(1, TABLE_3_1)  # fewest jobs, then cost, then collateral
    assert chosen == [1] and preempted == {"a"}
    # "GPU fraction" ignores job counts and would take server 5 first (Table 3.1's point).
    spans = {"a": 8, "b": 8, "c": 5, "d": 5}
    gpu_fraction = {s: sum(g / spans[j] for j, g in js.items()) for s, js in TABLE_3_1.items()}
    assert min(gpu_fraction, key=gpu_fraction.get) == 5


def test_reclaim_takes_idle_then_flex_before_preempting():
    servers = {1: {}, 2: {"x": 4}, 3: {"y": 8}, 4: {"z": 8}}
    chosen, preempted = reclaim_lyra(3, servers, flex={2})
    assert sorted(chosen) == [1, 2, 3] and preempted == {"y"}
    assert reclaim_lyra(2, servers, flex={2}) == ([1, 2], set())


def test_reclaim_heuristic_beats_scf_where_the_optimum_is_known():
    # Three single-job servers vs one job spanning two: SCF takes any two and preempts two
    # jobs; the optimum (and Lyra) takes the spanning job's pair and preempts one.
    servers = {1: {"p": 8}, 2: {"q": 8}, 3: {"w": 4}, 4: {"w": 4}}
    chosen, preempted = reclaim_lyra(2, servers)
    assert sorted(chosen) == [3, 4] and preempted == {"w"}
    assert len(reclaim_scf(2, servers)[1]) == 2


def _two_jobs(
    capacity: int, a: tuple[int, int, float, int], b: tuple[int, int, float, int], xa: int, xb: int
):
    """JCTs of two elastic jobs (w_min, w_max, T_min, GPUs/worker) started at w_min + x; when
    one ends the other scales to w_max (§A2.3's examples; work = w_max * T_min)."""
    jobs = [
        dict(w=a[0] + xa, wmax=a[1], rem=a[1] * a[2]),
        dict(w=b[0] + xb, wmax=b[1], rem=b[1] * b[2]),
    ]
    assert (a[0] + xa) * a[3] + (b[0] + xb) * b[3] <= capacity
    first = min(range(2), key=lambda i: jobs[i]["rem"] / jobs[i]["w"])
    t = jobs[first]["rem"] / jobs[first]["w"]
    other = jobs[1 - first]
    rest = t + (other["rem"] - other["w"] * t) / other["wmax"]
    return (t, rest) if first == 0 else (rest, t)


def test_table_3_3_work_model():
    a, b = (2, 6, 50.0, 1), (2, 6, 20.0, 1)
    expected = {(4, 0): (50, 53.33), (0, 4): (63.33, 20), (2, 2): (60, 30)}
    for (xa, xb), jcts in expected.items():
        assert _two_jobs(8, a, b, xa, xb) == pytest.approx(jcts, abs=0.01)


def test_table_3_4_and_fig_3_6_mckp():
    items_a = flex_items(300.0, 2, 3, 2)  # A: w 2..3, 100 s at w_max, 2 GPUs/worker
    items_b = flex_items(120.0, 2, 6, 1)  # B: w 2..6, 20 s at w_max, 1 GPU/worker
    assert [w for w, _ in items_a] == [2] and [v for _, v in items_a] == pytest.approx([50.0])
    assert [w for w, _ in items_b] == [1, 2, 3, 4]
    assert [v for _, v in items_b] == pytest.approx([20.0, 30.0, 36.0, 40.0])
    # 11 GPUs, bases take 6: the MCKP favours the longer job A (avg JCT 62 < 63.33).
    picks = solve_mckp([items_a, items_b], 5)
    assert picks == [0, 2]
    assert _two_jobs(11, (2, 3, 100.0, 2), (2, 6, 20.0, 1), 1, 3) == pytest.approx((100, 24))
    assert _two_jobs(11, (2, 3, 100.0, 2), (2, 6, 20.0, 1), 0, 4) == pytest.approx(
        (106.67, 20), abs=0.01
    )


def _brute(groups, capacity):
    best = 0.0
    for picks in itertools.product(*[range(-1, len(g)) for g in groups]):
        w = sum(g[p][0] for g, p in zip(groups, picks, strict=True) if p >= 0)
        if w <= capacity:
            best = max(best, sum(g[p][1] for g, p in zip(groups, picks, strict=True) if p >= 0))
    return best


def _value(groups, picks, capacity):
    assert sum(g[p][0] for g, p in zip(groups, picks, strict=True) if p >= 0) <= capacity
    return sum(g[p][1] for g, p in zip(groups, picks, strict=True) if p >= 0)


def test_mckp_matches_brute_force_and_beats_greedy():
    rng = np.random.default_rng(7)
    for _ in range(200):
        groups = [
            [
                (int(rng.integers(1, 6)), float(rng.uniform(0, 10)))
                for _ in range(rng.integers(1, 4))
            ]
            for _ in range(rng.integers(1, 5))
        ]
        capacity = int(rng.integers(0, 13))
        best = _brute(groups, capacity)
        assert _value(groups, solve_mckp(groups, capacity), capacity) == pytest.approx(best)
        elastic = [
            flex_items(float(rng.uniform(10, 100)), int(w), int(w + rng.integers(1, 4)), int(g))
            for w, g in zip(rng.integers(1, 4, 3), rng.integers(1, 3, 3), strict=True)
        ]
        best = _brute(elastic, capacity)
        assert _value(elastic, solve_mckp(elastic, capacity), capacity) == pytest.approx(best)
        assert _value(elastic, greedy_marginal(elastic, capacity), capacity) <= best + 1e-9


def test_bfd_placement_best_fit_all_or_nothing():
    c = Cluster()
    c.free[:3] = [3, 5, 8]
    c.free[3:443] = 0
    assert c.place(1, 2, 1, pool=0, flex=False)
    assert c.free[0] == 1  # least leftover: the server with 3 free, not the empty one
    assert c.place(2, 4, 1, pool=0, flex=False) and c.free[1] == 1
    assert not c.place(3, 4, 3, pool=0, flex=False)  # only one server fits a 4-GPU worker
    assert c.free[:3].tolist() == [1, 1, 8] and 3 not in c.base
    c.drop(1, flex=False)
    assert c.free[0] == 3 and not c.jobs[0]
    assert (c.free >= 0).all() and (c.free <= 8).all()


def test_generator_is_deterministic():
    one, two = generate_trace(days=2, jobs=3000, seed=3), generate_trace(days=2, jobs=3000, seed=3)
    for field in ("submit", "duration", "workers", "fungible", "elastic", "inference_gpus"):
        assert np.array_equal(getattr(one, field), getattr(two, field))
    assert not np.array_equal(one.duration, generate_trace(days=2, jobs=3000, seed=4).duration)


def test_generator_calibration():
    t = generate_trace()
    work = t.duration * t.demand
    assert t.jobs == 50_000 and np.all(np.diff(t.submit) >= 0) and t.submit[-1] <= 15 * 86400
    assert t.fungible.mean() == pytest.approx(0.21, abs=0.01)
    assert t.elastic.mean() == pytest.approx(0.05, abs=0.005)
    assert work[t.elastic].sum() / work.sum() == pytest.approx(ELASTIC_GPU_SHARE, abs=0.01)
    assert t.duration[t.elastic].mean() / 3600 == pytest.approx(14.2, rel=0.1)
    assert work.sum() / (TRAIN_GPUS * 15 * 86400) == pytest.approx(LOAD, rel=0.01)
    assert 60 <= t.duration.min() and t.duration.max() <= 5 * 86400
    u = t.inference_gpus / INFER_GPUS
    assert u.mean() == pytest.approx(0.65, abs=0.03)
    day = diurnal_utilisation(1)
    assert day.min() == pytest.approx(0.42, abs=0.01) and day.max() == pytest.approx(
        0.95, abs=0.01
    )
    assert np.argmin(day) * 300 / 3600 < 7  # the trough before dawn


def test_explicit_inference_demand():
    hourly = np.linspace(1000, 3000, 24)
    t = generate_trace(days=2, jobs=100, inference_demand=hourly)
    assert t.inference_gpus.size == 2 * 288 and t.inference_gpus.max() <= 3000
    assert np.array_equal(t.inference_gpus[:288], t.inference_gpus[288:])
    with pytest.raises(UsageError):
        generate_trace(days=2, jobs=100, inference_demand=np.full(30, 100.0))
    with pytest.raises(UsageError):
        generate_trace(days=1, jobs=100, inference_demand=np.full(24, INFER_GPUS + 1.0))


def test_inference_demand_from_gpu_plan():
    from gpu.compare import GpuOption

    option = GpuOption("T4", 4, latency_s=0.5, usd_per_hour=1.0)
    gpus = inference_demand_from_gpu_plan(option, np.array([0.0, 1.0, 8.0]), max_utilisation=0.5)
    assert gpus.tolist() == [0, 4, 32]  # ceil(R * 0.5 / 0.5) copies of 4 GPUs


def test_bad_input():
    with pytest.raises(UsageError):
        run_lyra(scheduler="pollux", days=1, jobs=10)
    with pytest.raises(UsageError):
        run_lyra(days=0, jobs=10)
    with pytest.raises(UsageError):
        run_lyra(days=1, jobs=0)


@pytest.fixture(scope="module")
def small_runs():
    trace = generate_trace(days=2, jobs=6700, seed=1, load=1.1)  # congested: queues form
    names = ("baseline", "random", "scf", "lyra-loaning", "lyra-scaling", "lyra")
    return {s: replay(trace, s, seed=1) for s in names}


def test_every_job_finishes_and_result_fields(small_runs):
    for name, run in small_runs.items():
        r = run.result
        assert r.scheduler == name and r.deadline_ratio is None and len(r.finish) == 6700
        assert all(np.isfinite(list(r.finish.values())))
        assert 0 < r.gpu_utilisation <= 1.05 and r.p95_jct_s > 0


def test_qualitative_orderings(small_runs):
    """§A4: Lyra's reclaiming preempts less than SCF, which preempts less than Random; the
    FLEX group absorbs part of the reclaim demand; loaning raises usage and cuts queuing."""
    pre = {s: r.result.preemptions for s, r in small_runs.items()}
    assert pre["lyra-loaning"] < pre["scf"] < pre["random"]
    assert pre["lyra"] <= pre["lyra-loaning"] and pre["baseline"] == pre["lyra-scaling"] == 0
    assert small_runs["lyra"].stats.flex_reclaim_share > 0.05
    base, lyra = small_runs["baseline"], small_runs["lyra"]
    assert lyra.stats.queue_mean_s < base.stats.queue_mean_s
    assert lyra.stats.overall_utilisation > base.stats.overall_utilisation
    assert small_runs["lyra-scaling"].result.avg_jct_s < base.result.avg_jct_s


def test_schedulers_listed_and_default_entry_point_runs():
    assert "lyra" in LYRA_SCHEDULERS and "baseline" in LYRA_SCHEDULERS
    run = run_lyra(scheduler="lyra", days=0.25, jobs=300, seed=2)
    assert run.result.jobs == 300 and run.stats.preemption_ratio >= 0


def test_each_assumption_changes_only_the_schemes_it_concerns(small_runs):
    """The baseline lends nothing, so a loaned T4's speed and checkpointing leave it as it
    was; giving unscaled elastic jobs their base demand w_min slows its elastic jobs down."""
    trace = generate_trace(days=2, jobs=6700, seed=1, load=1.1)
    base = small_runs["baseline"].result.avg_jct_s
    fast_resume = Assumptions(t4_speed=1.0, checkpoint=True)
    assert replay(trace, "baseline", seed=1, assumptions=fast_resume).result.avg_jct_s == base
    at_wmin = replay(trace, "baseline", seed=1, assumptions=Assumptions(unscaled_elastic="w_min"))
    assert at_wmin.result.avg_jct_s > base
    lyra = small_runs["lyra"].result.avg_jct_s
    assert replay(trace, "lyra", seed=1, assumptions=fast_resume).result.avg_jct_s != lyra
