"""Driver and monolithic plans over a request stream: their functions, timelines, cold starts
and bill in the simulator, and `plan --traffic` weighing the shapes."""

from __future__ import annotations

import numpy as np
import pytest

from ground.driver import remote_table_bytes
from planner import load_calibration
from planner.build import instance_for
from planner.deployments import plan_driver_shape
from planner.replay import evaluate_plan
from planner.traffic import load_arrivals
from planner.traffic.platform import platform_for
from planner.traffic.simulate import BatchPolicy, simulate
from planner.traffic.workflow import _per_expert_counts, manifest_of_plan, workflow_model
from tests.traffic.plans import counts_of, tiny_manifest

TOKENS = 2048


def _plan(shape: str, slo_s: float | None = None):  # type: ignore[no-untyped-def]
    manifest = tiny_manifest()
    cal = load_calibration()
    counts = counts_of(manifest.num_layers, manifest.experts, TOKENS)
    base = instance_for(manifest, counts, cal, tokens=TOKENS)
    return plan_driver_shape(shape, base, manifest, cal, slo_s, {"test": True})[0]


@pytest.fixture(scope="module")
def driver():  # type: ignore[no-untyped-def]
    """The cheapest driver plan of the tiny model: a remote expert at least."""
    plan = _plan("driver")
    assert plan.driver is not None and sum(len(la.experts) for la in plan.layers) >= 1
    return plan


def test_a_driver_s_functions_and_timeline(driver) -> None:  # type: ignore[no-untyped-def]
    model = workflow_model(driver, 4096)
    fns = model.functions
    remote = [(la.layer, e) for la in driver.layers for e in la.experts]
    assert fns.names[0] == "driver" and fns.count == 1 + len(remote)
    assert fns.role == ["driver"] + ["expert"] * len(remote)
    assert fns.stage.tolist() == [0] + [1 + layer for layer, _ in remote]
    assert fns.waits_on_later_stages.tolist() == [True] + [False] * len(remote)
    # the driver's INIT builds its stages: head, tail, every layer, its local experts
    local = sum(len(x) for x in driver.driver.local)
    assert int(fns.hosted[0]) == 2 + len(driver.layers) + local
    # at the plan's own batch the model is the cost model: the latency, and the driver holds
    # the request from start to end; each remote expert runs inside the driver's time
    i = int(np.argmin(np.abs(model.sizes - TOKENS)))
    n = int(model.sizes[i])
    manifest = manifest_of_plan(driver)
    counts = counts_of(driver.model.num_layers, driver.model.experts, TOKENS)
    assert _per_expert_counts(driver) == pytest.approx(counts)  # local experts' too
    expected = evaluate_plan(driver, manifest, counts * n / TOKENS, n).latency_s
    assert model.latency_s[i] == pytest.approx(expected, rel=1e-6)
    assert model.duration_s[i, 0] == pytest.approx(model.latency_s[i])
    ends = model.offset_s[i, 1:] + model.duration_s[i, 1:]
    assert (ends <= model.latency_s[i] + 1e-9).all() and (model.offset_s[i, 1:] > 0).all()


def test_a_stream_pays_one_large_init_and_the_driver_waits_on_cold_experts(
    driver,  # type: ignore[no-untyped-def]
) -> None:
    model = workflow_model(driver, 4096)
    cal = load_calibration()
    platform = platform_for(
        cal, model.functions, "x86_64", static_bytes=remote_table_bytes(driver)
    )
    arrivals = load_arrivals("poisson:0.02", hours=2, seed=1)
    result = simulate(model, arrivals, BatchPolicy(4096, 0.0), platform)
    assert result.cold_starts["driver"] >= 1
    assert result.bill_usd["init_usd"] > 0
    # the driver is billed while its remote experts start cold (they did: the first request)
    assert sum(v for k, v in result.cold_starts.items() if k != "driver") >= 1
    assert result.bill_usd["cold_wait_usd"] > 0
    # one large function starts slower than a small expert: its INIT holds every stage
    wait_s, _ = platform.cold_s()
    assert wait_s[0] > wait_s[1:].max()


def test_a_monolithic_stream_has_one_function() -> None:
    plan = _plan("monolithic")
    model = workflow_model(plan, 4096)
    assert model.functions.names == ["driver"] and model.functions.stages == 1
    platform = platform_for(load_calibration(), model.functions, "x86_64", static_bytes=0)
    result = simulate(
        model, load_arrivals("poisson:0.01", hours=1, seed=2), BatchPolicy(4096, 0.0), platform
    )
    assert set(result.cold_starts) == {"driver"} and result.cold_starts["driver"] >= 1
    # nothing but the Express execution waits on its cold start: no function waits on another
    express = model.express_usd_per_s * float(result.latency_s.sum())
    assert result.bill_usd["cold_wait_usd"] <= express


def test_replan_prices_a_driver_on_the_observed_routing_and_keeps_its_shape(
    driver,  # type: ignore[no-untyped-def]
) -> None:
    from planner.drift import replan

    planned = _per_expert_counts(driver)
    observed = planned[:, ::-1].copy()  # the popular experts became the rare ones
    report, new = replan(driver, observed)
    assert report["max_drift"] > 0.1 and not report["current"]["refused"]
    assert report["current"]["cost_usd"] > 0 and new is not None
    assert new.deployment == "driver" and new.driver is not None
    same, _ = replan(driver, planned)
    assert same["max_drift"] == pytest.approx(0.0, abs=1e-12)
    assert same["current"]["cost_usd"] == pytest.approx(driver.totals.bill_usd["total_usd"])
