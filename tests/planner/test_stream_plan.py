"""Planning a generation stream with continuously batching workers (`planner.stream`): the
plan meets its SLOs in simulation and round-trips, more load buys more slots and a cheaper
token, a measured step table is used and scaled by memory, and impossible asks say why."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.errors import InfeasibleError, UsageError
from ground.plan import Plan
from moelambda.cli import app
from planner import load_calibration
from planner.api import PlanningCounts, PlanOptions, plan_deployment
from planner.calibration import DecodeStepTable
from planner.stream import StreamOptions, decode_table_key, plan_stream, worker_model
from tests.traffic.plans import counts_of, tiny_manifest

OPTIONS = PlanOptions(slo_ttft_s=10.0, slo_tpot_s=0.5, confidence=0.0)


def _decoder() -> tuple:
    manifest = tiny_manifest().model_copy(update={"family": "decoder", "model": "tiny-decoder"})
    return manifest, PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})


@pytest.fixture(scope="module")
def planned() -> dict[str, tuple[Plan, dict]]:
    manifest, counts = _decoder()
    return {
        rate: plan_stream(
            manifest,
            counts,
            load_calibration(),
            traffic=f"poisson:{rate}",
            hours=0.25,
            options=OPTIONS,
        )  # fmt: skip
        for rate in ("0.05", "2")
    }


def test_the_stream_plan_meets_its_slos_in_simulation_and_round_trips(
    planned: dict, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    plan, summary = planned["2"]
    stream = plan.stream
    assert stream is not None and plan.generation is not None and plan.traffic is None
    assert summary["ttft_s"]["p99"] <= 10.0 and summary["tpot_s"]["p99"] <= 0.5
    assert len(stream.step_s) == stream.slots and stream.workers >= 1
    assert stream.visibility_timeout_s > 900  # longer than the worker's timeout
    assert stream.flush_tokens == 16 and stream.poll_s == 0.25
    assert stream.max_new_tokens == summary["stream"]["max_new_tokens"]
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan


def test_more_load_buys_more_slots_and_a_cheaper_output_token(planned: dict) -> None:
    low, high = planned["0.05"], planned["2"]
    assert high[0].stream.slots > low[0].stream.slots
    assert high[0].stream.simulated["mean_decode_batch"] > 1.5
    low_usd = low[1]["bill_usd"]["per_million_output_usd"]
    assert high[1]["bill_usd"]["per_million_output_usd"] < low_usd


def test_a_measured_table_is_used_and_scaled_by_its_serial_share() -> None:
    manifest, counts = _decoder()
    sized = dataclasses.replace(OPTIONS, prompt_tokens=64, new_tokens=16, slo_ttft_s=None)
    cal = load_calibration()
    base = plan_deployment(manifest, counts, cal, options=sized).plan
    assert not any(layer.experts for layer in base.layers)  # one function
    no_table = cal.model_copy(update={"decode_step_table": None})
    modelled = worker_model(
        base, manifest, no_table, slots=4, memory_mb=1769, prefill_chunk_tokens=64
    )
    assert modelled.step_source.startswith("model")
    table = DecodeStepTable(
        batches=(1, 2, 4),
        step_s=(0.1, 0.12, 0.2),
        two_thread_ratio=(0.9, 0.8, 0.75),  # serial shares 0.8, 0.6, 0.5
        memory_mb=1769,
        context_tokens=512,
        repeats=1,
        torch_version="test",
        cpu_model="test",
    )
    assert table.serial_fraction == pytest.approx((0.8, 0.6, 0.5))
    measured_cal = cal.model_copy(
        update={"decode_step_table": {decode_table_key(manifest): table}}
    )
    one = worker_model(
        base, manifest, measured_cal, slots=6, memory_mb=1769, prefill_chunk_tokens=64
    )
    assert one.step_source.startswith("measured")
    # interpolated between 2 and 4, extrapolated along the last segment past 4
    assert one.step_s == pytest.approx([0.1, 0.12, 0.16, 0.2, 0.24, 0.28])
    half = worker_model(
        base, manifest, measured_cal, slots=1, memory_mb=884, prefill_chunk_tokens=64
    )
    assert half.step_s[0] == pytest.approx(0.1 * 1769 / 884, rel=1e-3)  # half a vCPU
    five = worker_model(
        base, manifest, measured_cal, slots=4, memory_mb=5 * 1769, prefill_chunk_tokens=64
    )  # Amdahl over 5 vCPUs: the serial share stays, the rest is shared five ways
    assert five.step_s == pytest.approx(
        [0.1 * (0.8 + 0.2 / 5), 0.12 * (0.6 + 0.4 / 5), 0.16 * (0.55 + 0.45 / 5), 0.2 * 0.6]
    )
    assert one.prices.remote_step_usd == pytest.approx([0.0] * 6)


def test_impossible_asks_name_the_fix() -> None:
    manifest, counts = _decoder()
    cal = load_calibration()
    with pytest.raises(UsageError, match="--slo-ttft and --slo-tpot"):
        plan_stream(manifest, counts, cal, traffic="poisson:1", hours=0.1,
                    options=PlanOptions(slo_tpot_s=0.5, confidence=0.0))  # fmt: skip
    with pytest.raises(UsageError, match="--batch-sequences"):
        plan_stream(manifest, counts, cal, traffic="poisson:1", hours=0.1,
                    options=dataclasses.replace(OPTIONS, batch_sequences=4))  # fmt: skip
    with pytest.raises(InfeasibleError, match="--slo-ttft") as caught:
        plan_stream(manifest, counts, cal, traffic="poisson:1", hours=0.1,
                    options=dataclasses.replace(OPTIONS, slo_ttft_s=0.01))  # fmt: skip
    assert caught.value.smallest_slo_s is not None and caught.value.smallest_slo_s > 0.01
    assert np.isfinite(caught.value.smallest_slo_s)


def test_slots_can_be_pinned_and_only_for_workers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    manifest, counts = _decoder()
    plan, _ = plan_stream(
        manifest, counts, load_calibration(), traffic="poisson:2", hours=0.25,
        options=OPTIONS, stream=StreamOptions(slots=(3,)),
    )  # fmt: skip
    assert plan.stream is not None and plan.stream.slots == 3
    assert len(plan.stream.step_s) == 3
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app, ["plan", "--shape", "olmoe", "--tokens", "1024", "--slots", "8", "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "--slots sets the stream workers' batch" in result.output
    assert not out.exists()
