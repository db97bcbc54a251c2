"""GPU-backed Lambda planning (`planner.hardware`): the driver pool's throttling and retries
against a brute-force simulation, the roofline of a GPU stage, the popularity placement within
what a GPU exposes, and plans whose bill is the pool the plan chose."""

from __future__ import annotations

import heapq
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from gpu.generation_compare import shape_model
from ground.coldstart import retry_waits
from planner import load_calibration
from planner.hardware.catalogue import GpuType, load_catalogue
from planner.hardware.gpu_candidates import MIXED, plan_hardware
from planner.hardware.gpu_model import (
    GpuSpeed,
    Stream,
    _fewest_servers,
    _layout,
    _Model,
    pool_latency,
)


def _brute_force(arrivals: np.ndarray, service: float, servers: int) -> np.ndarray:
    """Each request's latency through `servers` environments serving one request at a time:
    one that finds all busy is retried after each of `retry_waits()` in turn, and fails (inf)
    when still throttled after the last."""
    free = [0.0] * servers  # when each environment is next idle
    tries = [(float(a), i, 0) for i, a in enumerate(arrivals)]  # (time, request, retries so far)
    heapq.heapify(tries)
    out = np.full(len(arrivals), np.inf)
    while tries:
        t, i, done = heapq.heappop(tries)
        idle = [k for k, at in enumerate(free) if at <= t]
        if idle:
            free[idle[0]] = t + service
            out[i] = t + service - arrivals[i]
        elif done < len(retry_waits()):
            heapq.heappush(tries, (t + retry_waits()[done], i, done + 1))
    return out


def test_a_throttled_request_waits_for_the_retries_and_fails_after_the_last() -> None:
    waits = np.cumsum(retry_waits())  # 0.5, 1.5, 3.5, ... after its arrival
    # one environment busy from 0 to 1 s: the request of 0.1 s is throttled at 0.1 and 0.6 s,
    # and served at its second retry, 1.6 s
    assert pool_latency(np.array([0.0, 0.1]), 1.0, 1) == pytest.approx([1.0, waits[1] + 1.0])
    # busy until the last retry: served then; a moment longer, and the request fails
    last = waits[-1]
    assert pool_latency(np.array([0.0, 0.1]), last, 1) == pytest.approx([last, 2 * last])
    assert pool_latency(np.array([0.0, 0.1]), last + 0.5, 1)[1] == np.inf
    assert (pool_latency(np.array([0.0, 0.1]), 1.0, 2) == 1.0).all()  # one each: no wait


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_the_driver_pool_matches_a_brute_force(servers: int) -> None:
    rng = np.random.default_rng(servers)
    arrivals = np.sort(rng.uniform(0, 50, size=400))
    for service in (0.05, 0.4, 1.7):
        got = pool_latency(arrivals, service, servers)
        assert np.allclose(got, _brute_force(arrivals, service, servers))
    assert np.isinf(pool_latency(arrivals, 30.0, servers)).any()  # the retries run out


def test_the_driver_gets_the_fewest_environments_whose_p99_meets_the_slo() -> None:
    """A failed request counts within the p99 as an infinite latency, as the traffic
    simulator counts one (`TrafficResult.quantiles`): one environment fewer misses the SLO."""
    stream = _stream(2.0, 600.0)
    for service, slo in ((0.4, 30.0), (1.7, 30.0), (5.0, 30.0), (1.7, 2.0)):
        got = _fewest_servers(stream, service, slo)
        assert got is not None
        servers, p99 = got
        latency = pool_latency(stream.arrivals_s, service, servers)
        assert p99 == np.quantile(latency, 0.99, method="inverted_cdf") <= slo
        assert np.isinf(latency).mean() <= 0.01
        fewer = pool_latency(stream.arrivals_s, service, servers - 1)
        assert servers == 1 or np.quantile(fewer, 0.99, method="inverted_cdf") > slo
    assert _fewest_servers(stream, 31.0, 30.0) is None  # over the SLO warm


def test_a_gpu_stage_is_bound_by_compute_or_by_reading_its_weights() -> None:
    speed = GpuSpeed("x", flops=1e12, bytes_per_s=1e11, kernel_s=1e-5)
    params = np.array([1e9, 1e9, 1e9])
    t = speed.seconds(params, np.array([0, 1, 10_000]))
    assert t[0] == 0.0  # no token, no call
    assert t[1] == pytest.approx(2e9 / 1e11 + 1e-5)  # one token: reading 2 GB of bf16
    assert t[2] == pytest.approx(2e9 * 1e4 / 1e12 + 1e-5)  # compute-bound


PEAK = 0.4  # GiB of a 1,000-token batch's tensors (Mixtral: 1,000 x 4,096 x 4 bytes x 24)
RUNTIME = 1.0  # GiB of a GPU environment's runtime


ANY = GpuSpeed("any", flops=1e14, bytes_per_s=1e12, kernel_s=1e-5)  # exposes every size whole
SIZES = [3, 6, 12, 16, 24, 48]


@cache
def _mixtral() -> tuple[_Model, object]:
    model = shape_model("mixtral", tokens=1000)
    return _Model.of(model.manifest, model.counts), model


def test_every_gpu_exposes_at_most_its_nominal_memory() -> None:
    catalogue = load_catalogue()
    for name, gpu in catalogue.types.items():
        assert gpu.usable_memory_mib is not None, name  # the catalogue gives every one
        assert gpu.usable_gib <= gpu.memory_gb, name
    assert catalogue.get("l40s").usable_gib == pytest.approx(46068 / 1024)
    fields = catalogue.get("l4").model_dump(exclude={"usable_memory_mib"})
    assert GpuType(**fields).usable_gib == 24  # a cluster file's own type: nominal is usable
    with pytest.raises(ValueError, match="exceeds memory_gb"):
        GpuType(**fields, usable_memory_mib=24 * 1024 + 1)


def test_the_driver_holds_the_hottest_experts_and_the_rest_go_to_groups() -> None:
    model, _ = _mixtral()
    sizes = SIZES
    layout = _layout(model, ANY, sizes, 48, 1.0, PEAK, RUNTIME)
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
    mixed = _layout(model, ANY, sizes, 48, 0.5, PEAK, RUNTIME)
    assert not isinstance(mixed, str) and mixed.on_cpu.any() and mixed.on_gpu_group.any()
    assert isinstance(
        _layout(model, ANY, sizes, 3, 1.0, PEAK, RUNTIME), str
    )  # the stack alone is larger


def test_a_placement_is_bounded_by_what_the_gpu_exposes_not_its_nominal_size() -> None:
    model, _ = _mixtral()
    l40s = GpuSpeed.of(load_catalogue(), "l40s")  # 48 GB nominal, 44.99 GiB exposed
    nominal = _layout(model, ANY, SIZES, 48, 1.0, PEAK, RUNTIME)
    usable = _layout(model, l40s, SIZES, 48, 1.0, PEAK, RUNTIME)
    assert not isinstance(nominal, str) and not isinstance(usable, str)
    held = model.nonmoe_gib + (model.expert_params[usable.local] * 2).sum() / 2**30
    assert held + RUNTIME + PEAK <= l40s.usable_gib < 48
    assert usable.local.sum() < nominal.local.sum()  # what fit 48 GiB does not fit 44.99
    # a stack that fits a 6-GiB size whole but not the 4 GiB a device exposes of it
    small = GpuSpeed("small", flops=1e14, bytes_per_s=1e12, kernel_s=1e-5, usable_gib=4.0)
    assert not isinstance(_layout(model, ANY, SIZES, 6, 0.0, PEAK, RUNTIME), str)
    why = _layout(model, small, SIZES, 6, 0.0, PEAK, RUNTIME)
    assert isinstance(why, str) and "the 4.00 GiB a 6-GiB accelerator exposes on small" in why


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


def test_the_scaling_target_is_the_gpus_computing_share_of_the_period() -> None:
    model = shape_model("olmoe", tokens=1000)
    stream = _stream(1.0)
    gpu = plan_hardware(
        model.manifest, model.counts, load_calibration(), load_catalogue(), stream,
        slo_s=30.0, hardware=("gpu",),
    )["gpu"]  # fmt: skip
    assert gpu.parts is not None
    request = gpu.parts["request"]
    assert 0 < request.gpu_s < request.latency_s  # not its S3 reads and Invoke waits
    share = (
        stream.arrivals_s.size
        * request.gpu_s
        / (gpu.detail["driver_environments"] * stream.period_s)
    )
    assert gpu.detail["scaling_target"] == pytest.approx(max(share, 0.01), abs=1e-4)


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


def test_a_stage_that_fits_the_nominal_size_but_not_the_exposed_memory_is_split() -> None:
    from planner.hardware.gpu_stages import stage_ranges, stages_candidate
    from planner.traffic.managed import managed_prices

    model, _ = _mixtral()
    l40s = GpuSpeed.of(load_catalogue(), "l40s")
    nominal = stage_ranges(model, 48.0, RUNTIME + PEAK)
    usable = stage_ranges(model, l40s.room_gib(48), RUNTIME + PEAK)
    assert not isinstance(nominal, str) and not isinstance(usable, str)
    assert max(held for *_, held in nominal) > l40s.usable_gib  # 47.6 GiB in 48, not in 44.99
    assert all(held <= l40s.usable_gib for *_, held in usable)
    assert [r[:2] for r in usable] != [r[:2] for r in nominal]
    why = stage_ranges(model, l40s.room_gib(48), 43.0, l40s.bound(48))
    assert isinstance(why, str) and "the 44.99 GiB a 48-GiB accelerator exposes on l40s" in why
    cal = load_calibration()
    prices = managed_prices(cal, "x86_64", accelerated=True)
    assert prices is not None
    pool = replace(prices, types=tuple(t for t in prices.types if t.gpu == "l40s"))
    got = stages_candidate(model, l40s, pool, cal, _stream(1.0), 30.0, SIZES)
    assert got.feasible and got.detail["stage_accelerator_gib"] == [48] * len(usable)


def _chained(arrivals: np.ndarray, service: list[float], servers: list[int]) -> np.ndarray:
    """End-to-end latencies through stage pools one after another (`_brute_force` each): a
    request leaves one stage into the next, unless it failed."""
    t = arrivals.copy()
    for cost, count in zip(service, servers, strict=True):
        alive = np.isfinite(t)
        t[alive] += _brute_force(t[alive], cost, count)
    return t - arrivals


def test_the_stage_pools_feed_each_stage_the_previous_ones_departures() -> None:
    from planner.hardware.gpu_stages import _tandem

    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 60, size=300))
    service, servers = [0.3, 0.5], [2, 3]
    waits = _tandem(arrivals, np.array(service), np.array(servers))
    assert np.allclose(waits[-1], _chained(arrivals, service, servers))
    first = _brute_force(arrivals, 0.3, 2)
    assert np.allclose(waits[0], first - 0.3) and (waits[0] > 0).any()  # some retried
    # too few environments: some fail at the first stage and never reach the second
    waits = _tandem(arrivals, np.array([2.0, 0.5]), np.array([1, 3]))
    failed = np.isinf(waits[0])
    assert failed.any() and (waits[1, failed] == 0).all() and np.isinf(waits[-1, failed]).all()
    assert np.allclose(waits[-1], _chained(arrivals, [2.0, 0.5], [1, 3]))


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


def test_a_gpu_functions_host_holds_its_runtime_beside_its_largest_weight_file() -> None:
    """The host side streams weights onto the device a file at a time (`moe.StageLoader`):
    it is sized for the CUDA runtime and the largest file it reads, at least its vCPUs."""
    from planner.hardware.gpu_model import host_memory_mb

    model, _ = _mixtral()
    cal = load_calibration()
    runtime = cal.gpu_host_runtime_mb
    assert runtime is not None
    one = np.zeros(model.expert_params.shape, bool)
    one[0, 0] = True
    width = model.manifest.precision.bytes_per_weight("expert")  # bf16, as published
    expert_mb = model.expert_params[0, 0] * width / 1e6  # one Mixtral expert: 704 MB
    assert host_memory_mb(model, cal, 1, one) == pytest.approx(runtime + expert_mb)
    assert host_memory_mb(model, cal, 4, one) == 4 * cal.mb_per_vcpu  # the vCPUs' share
    nothing = np.zeros_like(one)
    head_mb = model.head_params * width / 1e6  # the embeddings, the largest non-MoE file
    assert host_memory_mb(model, cal, 1, nothing, head=True) == pytest.approx(runtime + head_mb)
    assert host_memory_mb(model, cal, 1, nothing) == pytest.approx(max(runtime, cal.mb_per_vcpu))
