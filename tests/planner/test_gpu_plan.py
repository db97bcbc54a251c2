"""A GPU-backed candidate as the Plan it deploys as: one GPU function holding OLMoE, a GPU driver
with CPU experts for Mixtral, nothing for shapes the handlers cannot run; `plan --hardware`'s
refusals, and the CPU-or-GPU choice for a stream; the synthesised template of a planned GPU
function carries its accelerator and its pool."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpu.generation_compare import shape_model
from ground.errors import InfeasibleError
from ground.plan import Plan
from moelambda.cli import app
from planner import hardware, load_calibration
from planner.api import PlanOptions, shape_counts_for_plan
from planner.hardware.catalogue import load_catalogue
from planner.hardware.gpu_candidates import MIXED, plan_hardware
from planner.hardware.gpu_model import Stream, front_door
from planner.hardware.gpu_plan import plan_document, plan_traffic_on_hardware

runner = CliRunner()


def _stream(rate: float, seconds: float = 1800.0) -> Stream:
    rng = np.random.default_rng(1)
    arrivals = np.sort(rng.uniform(0, seconds, size=int(rate * seconds)))
    return Stream(arrivals, seconds, 1000, {"spec": f"poisson:{rate}"})


def _planned(name: str, hardware: str, rate: float = 1.0) -> tuple[Plan | None, object]:
    cal = load_calibration()
    model = shape_model(name, tokens=1000)
    stream = _stream(rate)
    candidate = plan_hardware(
        model.manifest, model.counts, cal, load_catalogue(), stream, slo_s=30.0,
        hardware=(hardware,),
    )[hardware]  # fmt: skip
    plan = plan_document(candidate, model.manifest, model.counts, cal, stream, 30.0)
    return plan, candidate


def test_olmoe_deploys_as_one_gpu_function_with_its_pool(tmp_path: Path) -> None:
    plan, candidate = _planned("olmoe", "gpu")
    assert plan is not None and plan.deployment == "monolithic"
    traffic = plan.traffic
    assert traffic is not None and traffic.accelerated
    (driver,) = traffic.capacity
    assert driver.function == "driver" and driver.policy == "managed"
    assert driver.accelerator_memory_gib == candidate.detail["driver_accelerator_gib"]
    assert driver.managed_environments == candidate.detail["driver_environments"]
    assert traffic.managed_instance_type == candidate.detail["instance_type"]
    assert traffic.managed_instances == candidate.detail["instances"]
    assert 0 < (traffic.managed_target_utilisation or 0) <= 1
    assert plan.totals.latency_s == pytest.approx(candidate.latency_s)
    again = Plan.load(plan.save(tmp_path / "plan.json"))
    assert again == plan


def test_mixtrals_gpu_driver_invokes_its_cpu_experts() -> None:
    plan, candidate = _planned("mixtral", MIXED)
    assert plan is not None and plan.deployment == "driver"
    remote = sum(len(layer.experts) for layer in plan.layers)
    assert remote == candidate.detail["cpu_experts"] > 0
    assert plan.traffic is not None
    names = [c.function for c in plan.traffic.capacity]
    assert names == plan.topology.function_names(plan.layers)
    gpus = [c for c in plan.traffic.capacity if c.accelerator_memory_gib]
    assert [c.function for c in gpus] == ["driver"]  # the experts stay on demand, on CPUs
    assert all(c.policy == "none" for c in plan.traffic.capacity[1:])


def test_a_gpu_drivers_cpu_experts_are_priced_as_the_re_scorer_prices_them() -> None:
    # One model: the GPU driver's CPU experts are any driver's remote experts, so the plan it
    # writes re-scores (`planner.evaluate_plan`, what run-local calls) to the same billed
    # seconds per expert function, at a memory option the CPU planner offers.
    from planner import evaluate_plan

    plan, candidate = _planned("olmoe", MIXED)
    assert plan is not None and plan.deployment == "driver"
    model = shape_model("olmoe", tokens=1000)
    counts = np.asarray(model.counts.counts, float) * 1000 / model.counts.tokens
    again = evaluate_plan(plan, model.manifest, counts, 1000)
    experts = {
        f"layer{layer.layer:02d}/expert{e.expert:02d}": e
        for layer in plan.layers
        for e in layer.experts
    }
    assert set(again.seconds) - {"driver"} <= set(experts)
    assert len(again.seconds) > 1
    for name, seconds in again.seconds.items():
        if name != "driver":
            assert seconds == pytest.approx(experts[name].time_s, rel=1e-9), name
    memory = {e.memory_mb for e in experts.values()}
    assert memory <= set(load_calibration().memory_options_mb)
    # and the driver on its GPU, as the candidate priced it: the request the plan promises
    assert again.seconds["driver"] == pytest.approx(plan.totals.latency_s, rel=1e-9)
    assert again.latency_s == pytest.approx(candidate.latency_s, rel=1e-9)


def test_shapes_the_handlers_cannot_run_are_not_written() -> None:
    plan, candidate = _planned("mixtral", "gpu")
    assert candidate.feasible and candidate.detail["shape"] == "stages"
    assert plan is None


def test_the_front_door_bills_every_request_and_its_idle_polls() -> None:
    cal = load_calibration()
    quiet, busy = _stream(0.01), _stream(2.0)
    assert front_door(cal, busy)[0] > front_door(cal, quiet)[0] > 0  # idle polls alone cost
    assert front_door(cal, busy)[1] == pytest.approx(cal.start_execution_s)
    # the traffic simulator's own front door: a cold batcher's INIT reaches the p99 when
    # nearly every delivery finds it reclaimed
    lonely = Stream(np.arange(0.0, 36000.0, 3600.0), 36000.0, 1000)
    assert front_door(cal, lonely)[1] > cal.start_execution_s + 0.1


def test_plan_hardware_gpu_needs_a_stream_and_a_known_hardware(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    base = ["plan", "--shape", "olmoe", "--out", str(out)]
    result = runner.invoke(app, [*base, "--hardware", "gpu"])
    assert result.exit_code == 2 and "--traffic" in result.output
    result = runner.invoke(app, [*base, "--hardware", "tpu"])
    assert result.exit_code == 2 and "cpu, gpu or auto" in result.output
    assert not out.exists()


def test_a_kind_whose_handlers_cannot_run_is_priced_and_reported_never_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hardware kind marked not runnable (`planner.hardware.KINDS`, as gpu was before its
    handlers ran on a device): a stream on --hardware gpu has no plan, and --hardware auto
    chooses CPU functions beside the GPU rows and their reason."""
    gpu = hardware.KINDS["gpu"]
    why = "no handler runs on this accelerator"
    monkeypatch.setitem(hardware.KINDS, "gpu", dataclasses.replace(gpu, not_runnable=why))
    # at fp32, which CPU functions compute (its published bf16 they are not known to)
    counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1000, weights="fp32")
    manifest = counts.manifest
    assert manifest is not None
    stream = {"traffic": "poisson:2", "slo_p99_s": 30.0, "hours": 0.25}
    with pytest.raises(InfeasibleError, match=why):
        plan_traffic_on_hardware(manifest, counts, load_calibration(), hardware="gpu", **stream)
    # The CPU side as the fan-out workflow: the driver's solver for OLMoE's 4,096-token batches
    # takes more memory than a test may (noted in the closing note).
    plan, summary = plan_traffic_on_hardware(
        manifest, counts, load_calibration(), hardware="auto",
        options=PlanOptions(deployment="workflow", concurrency_quota=None),
        **(stream | {"slo_p99_s": 600.0}),
    )  # fmt: skip
    assert summary["hardware_chosen"] == "cpu"
    assert plan.traffic is not None and not plan.traffic.accelerated
    assert set(summary["hardware"]) == {"cpu", "gpu", MIXED}
    priced = [summary["hardware"][h] for h in ("gpu", MIXED)]
    assert any(r["feasible"] for r in priced)  # priced by the one model ...
    assert all(not r["deployable"] and why in r["not_chosen_because"] for r in priced)


def test_a_stream_on_gpus_gets_a_deployable_gpu_plan() -> None:
    """GPU-backed handlers run (the registry's gpu line is runnable): a stream is planned on
    GPUs, with a shape the handlers deploy."""
    model = shape_model("olmoe", tokens=1000)
    plan, summary = plan_traffic_on_hardware(
        model.manifest, model.counts, load_calibration(), hardware="gpu",
        traffic="poisson:2", slo_p99_s=30.0, hours=0.25,
    )  # fmt: skip
    assert summary["hardware_chosen"] in {"gpu", MIXED}
    assert set(summary["hardware"]) == {"gpu", MIXED}
    assert plan.traffic is not None and plan.traffic.accelerated
    json.dumps(summary, allow_nan=False)  # a report of plain JSON numbers
    # the plan itself says what it was weighed against, and why it won
    assert plan.traffic.simulated["hardware"] == summary["hardware"]
    assert plan.traffic.simulated["hardware_chosen"] == summary["hardware_chosen"]
