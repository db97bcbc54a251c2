"""GPU-backed Lambda planning (`planner.hardware`): the driver pool's queue against a brute-force
simulation, the roofline of a GPU stage, the popularity placement, and plans whose bill is the
pool the plan chose."""

from __future__ import annotations

import heapq
from functools import cache

import numpy as np
import pytest

from gpu.generation_compare import shape_model
from planner import load_calibration
from planner.hardware.catalogue import load_catalogue
from planner.hardware.gpu_candidates import MIXED, plan_hardware
from planner.hardware.gpu_model import (
    GpuSpeed,
    Stream,
    _layout,
    _Model,
    driver_servers,
)


def _brute_force(arrivals: np.ndarray, service: float, servers: int) -> np.ndarray:
    """FCFS on `servers` servers: each request takes the server that frees first."""
    free = [0.0] * servers
    out = []
    for a in arrivals:
        start = max(a, heapq.heappop(free))
        heapq.heappush(free, start + service)
        out.append(start + service - a)
    return np.array(out)


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_the_driver_queue_matches_a_brute_force(servers: int) -> None:
    rng = np.random.default_rng(servers)
    arrivals = np.sort(rng.uniform(0, 50, size=400))
    for service in (0.05, 0.4, 1.7):
        got = driver_servers(arrivals, service, servers)
        assert np.allclose(got, _brute_force(arrivals, service, servers))


def test_a_gpu_stage_is_bound_by_compute_or_by_reading_its_weights() -> None:
    speed = GpuSpeed("x", flops=1e12, bytes_per_s=1e11, kernel_s=1e-5)
    params = np.array([1e9, 1e9, 1e9])
    t = speed.seconds(params, np.array([0, 1, 10_000]))
    assert t[0] == 0.0  # no token, no call
    assert t[1] == pytest.approx(2e9 / 1e11 + 1e-5)  # one token: reading 2 GB of bf16
    assert t[2] == pytest.approx(2e9 * 1e4 / 1e12 + 1e-5)  # compute-bound


PEAK = 0.4  # GiB of a 1,000-token batch's tensors (Mixtral: 1,000 x 4,096 x 4 bytes x 24)
RUNTIME = 1.0  # GiB of a GPU environment's runtime


@cache
def _mixtral() -> tuple[_Model, object]:
    model = shape_model("mixtral", tokens=1000)
    return _Model.of(model.manifest, model.counts), model


def test_the_driver_holds_the_hottest_experts_and_the_rest_go_to_groups() -> None:
    model, _ = _mixtral()
    sizes = [3, 6, 12, 16, 24, 48]
    layout = _layout(model, sizes, 48, 1.0, PEAK, RUNTIME)
    assert not isinstance(layout, str)
    assert 0 < layout.local.sum() < layout.local.size
    coldest_local = model.share[layout.local].min()
    hottest_remote = model.share[~layout.local].max()
    assert coldest_local >= hottest_remote  # popularity decides, across layers
    held = model.nonmoe_gib + (model.expert_params[layout.local] * 2).sum() / 2**30
    assert held + RUNTIME + PEAK <= 48
    assert not layout.on_cpu.any()
    assert (layout.on_gpu_group == ~layout.local).all()
    assert set(layout.group_gib[layout.group_gib > 0]) <= set(sizes)
    mixed = _layout(model, sizes, 48, 0.5, PEAK, RUNTIME)
    assert not isinstance(mixed, str) and mixed.on_cpu.any() and mixed.on_gpu_group.any()
    assert isinstance(
        _layout(model, sizes, 3, 1.0, PEAK, RUNTIME), str
    )  # the stack alone is larger


def _stream(rate: float, seconds: float = 3600.0) -> Stream:
    rng = np.random.default_rng(0)
    arrivals = np.sort(rng.uniform(0, seconds, size=int(rate * seconds)))
    return Stream(arrivals, seconds, 1000)


def test_olmoe_fits_one_gpu_function_and_its_bill_is_the_pool_it_chose() -> None:
    cal = load_calibration()
    model = shape_model("olmoe", tokens=1000)
    stream = _stream(1.0)
    plans = plan_hardware(
        model.manifest,
        model.counts,
        cal,
        load_catalogue(),
        stream,
        slo_s=30.0,
        hardware=("gpu",),
    )
    gpu = plans["gpu"]
    assert gpu.feasible and gpu.p99_s is not None and gpu.p99_s <= 30.0
    assert gpu.detail["local_experts"] == model.manifest.num_layers * model.manifest.experts
    assert gpu.detail["gpu_group_experts"] == 0  # the whole model in the driver
    from planner.traffic.managed import InstanceChoice, managed_prices

    prices = managed_prices(cal, "x86_64", accelerated=True)
    assert prices is not None
    hourly = {t[0]: t[3] for t in prices.types}[gpu.detail["instance_type"]]
    choice = InstanceChoice(gpu.detail["instance_type"], gpu.detail["instances"], hourly)
    pool = prices.bill_usd(choice, stream.period_s, stream.arrivals_s.size)
    assert gpu.detail["pool_usd"] == pytest.approx(pool, rel=1e-5)
    assert gpu.detail["instances"] >= prices.default_instances
    assert gpu.bill_usd >= pool
    assert gpu.per_million_usd == pytest.approx(
        gpu.bill_usd / (stream.arrivals_s.size * 1000) * 1e6
    )


def test_more_traffic_needs_more_drivers_and_an_impossible_slo_is_said() -> None:
    cal = load_calibration()
    model = shape_model("olmoe", tokens=1000)
    args = (model.manifest, model.counts, cal, load_catalogue())
    slow = plan_hardware(*args, _stream(0.2), slo_s=30.0, hardware=("gpu",))["gpu"]
    fast = plan_hardware(*args, _stream(20.0, 600.0), slo_s=30.0, hardware=("gpu",))["gpu"]
    assert fast.detail["driver_environments"] > slow.detail["driver_environments"]
    never = plan_hardware(*args, _stream(1.0), slo_s=1e-4, hardware=("gpu",))["gpu"]
    assert not never.feasible and "over the SLO" in (never.reason or "")


def test_layer_stages_cover_the_model_in_the_fewest_contiguous_ranges_that_fit() -> None:
    from planner.hardware.gpu_stages import stage_ranges

    model, _ = _mixtral()
    for largest in (24.0, 48.0):
        ranges = stage_ranges(model, largest, RUNTIME + PEAK)
        assert not isinstance(ranges, str)
        assert ranges[0][0] == 0 and ranges[-1][1] == model.layer_params.size
        assert all(a < b for a, b, _ in ranges)
        assert all(r[1] == q[0] for r, q in zip(ranges, ranges[1:], strict=False))
        assert all(held <= largest for *_, held in ranges)
        # fewest: no two neighbours would fit together
        assert all(r[2] + q[2] > largest for r, q in zip(ranges, ranges[1:], strict=False))
    assert len(stage_ranges(model, 48.0, RUNTIME + PEAK)) < len(
        stage_ranges(model, 24.0, RUNTIME + PEAK)
    )
    assert isinstance(stage_ranges(model, 3.0, RUNTIME + PEAK), str)  # one layer is larger


def test_the_tandem_queue_feeds_each_stage_the_previous_ones_departures() -> None:
    from planner.hardware.gpu_stages import _tandem

    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 20, size=300))
    service = np.array([0.3, 0.5])
    servers = np.array([2, 3])
    waits = _tandem(arrivals, service, servers)
    first = _brute_force(arrivals, 0.3, 2)
    second = _brute_force(arrivals + first, 0.5, 3)
    assert np.allclose(waits[-1], first + second)
    assert np.allclose(waits[0], first - 0.3) and np.allclose(waits[1], second - 0.5)


def test_mixtral_needs_more_than_one_gpu_function_and_stages_beat_expert_groups() -> None:
    cal = load_calibration()
    model = shape_model("mixtral", tokens=1000)
    plans = plan_hardware(
        model.manifest, model.counts, cal, load_catalogue(), _stream(1.0), slo_s=30.0,
        hardware=("gpu", MIXED),
    )  # fmt: skip
    gpu, mixed = plans["gpu"], plans[MIXED]
    assert gpu.feasible and gpu.detail["shape"] == "stages" and not gpu.detail["deployable"]
    assert len(gpu.detail["stages"]) >= 2  # 87 GiB of weights, 48 GiB at most per function
    assert mixed.feasible and mixed.detail["cpu_experts"] > 0 and mixed.detail["deployable"]
    assert gpu.latency_s < mixed.latency_s  # one hidden state per boundary, not routed rows


def test_the_cpu_plan_is_planned_for_the_stream_with_its_cold_starts() -> None:
    from planner.hardware.gpu_candidates import cpu_plan

    cal = load_calibration()
    model = shape_model("olmoe", tokens=1000)
    cpu = cpu_plan(model.manifest, model.counts, cal, slo_s=30.0, prompt_tokens=1000)
    assert cpu[1] is None and cpu[0].totals.latency_s <= 30.0
    got = plan_hardware(
        model.manifest, model.counts, cal, load_catalogue(), _stream(0.05, 1800.0),
        slo_s=30.0, hardware=("cpu",), cpu=cpu,
    )["cpu"]  # fmt: skip
    assert got.feasible and got.p99_s is not None and got.p99_s <= 30.0
    assert got.detail["capacity"] != "none"  # cold starts alone would break the p99
