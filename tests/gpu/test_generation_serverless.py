"""The GPU platform billed per second (`gpu.serverless`): its prices and sources, the memory
check, continuous batching over containers against hand-computed cases, and `bench generate`'s
report with every platform's block on a tiny configuration."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gpu.cluster import load_catalogue
from gpu.generation_compare import GenerationModel, bench_generate
from gpu.serverless import fit, load_platform, serverless_generation, simulate_containers
from ground.errors import UsageError
from planner import load_calibration
from planner.api import PlanningCounts, PlanOptions
from planner.shapes import load_shape
from planner.traffic.spec import Arrivals
from tests.traffic.plans import counts_of, tiny_manifest


def _flat(seconds: float):  # a prefill of any prompt takes `seconds`
    return lambda prompt: np.full(len(prompt), seconds)


def test_every_price_has_a_source_and_a_kind() -> None:
    modal = load_platform("modal")
    assert set(modal.gpus) == {"l4", "l40s"}
    assert modal.gpus["l4"].value == 0.000222 and modal.gpus["l40s"].value == 0.000542
    for figure in (*modal.gpus.values(), modal.cpu_core_usd_per_s, modal.memory_gib_usd_per_s):
        assert figure.source_kind == "list-price" and "modal.com/pricing" in figure.source
    assert modal.idle_timeout_s.value == 60 and modal.idle_timeout_s.source_kind == "vendor"
    assert modal.container_cpu_cores.source_kind == "assumed"
    # a container's second: its GPU, 2 cores and 16 GiB of host memory
    assert modal.usd_per_second("l4") == pytest.approx(0.000222 + 2 * 1.31e-5 + 16 * 2.22e-6)
    assert modal.usd_per_second("l40s", 4) - modal.usd_per_second("l40s") == pytest.approx(
        3 * 0.000542
    )
    with pytest.raises(UsageError, match="modal"):
        load_platform("runpod")


def test_two_arrivals_far_apart_each_pay_a_cold_start_and_the_idle_window() -> None:
    """Arrivals at 0 and 1,000 s, 100-token prompts generating 11 tokens; a 10 s cold start,
    a 2 s prefill, a 0.5 s step, 60 s idle: each request starts its own container, gets its
    first token at 10 + 2 = 12 s and its last 10 steps later (17 s); each container is up
    17 + 60 = 77 s."""
    run = simulate_containers(
        np.array([0.0, 1000.0]),
        np.array([100, 100]),
        np.array([11, 11]),
        prefill_s=_flat(2.0),
        step_s=np.array([0.0, 0.5, 0.6]),
        slots=2,
        cold_start_s=10.0,
        idle_timeout_s=60.0,
    )
    np.testing.assert_allclose(run.ttft_s, [12.0, 12.0])
    np.testing.assert_allclose(run.tpot_s, [0.5, 0.5])
    np.testing.assert_allclose(run.e2e_s, [17.0, 17.0])
    np.testing.assert_array_equal(run.container, [0, 1])
    np.testing.assert_allclose(run.end_s - run.start_s, [77.0, 77.0])
    assert (run.prefill_busy_s, run.decode_busy_s, run.peak_containers) == (4.0, 10.0, 1)


def test_an_arrival_within_the_idle_window_reuses_the_warm_container() -> None:
    """The second request arrives at 50 s, 33 s into the first container's idle window: no
    cold start (TTFT 2 s), and the container stays up until 60 s after the second is done."""
    run = simulate_containers(
        np.array([0.0, 50.0]),
        np.array([100, 100]),
        np.array([11, 11]),
        prefill_s=_flat(2.0),
        step_s=np.array([0.0, 0.5]),
        slots=1,
        cold_start_s=10.0,
        idle_timeout_s=60.0,
    )
    np.testing.assert_allclose(run.ttft_s, [12.0, 2.0])
    assert run.start_s.size == 1 and run.end_s[0] == pytest.approx(50 + 7 + 60)


def test_sequences_batch_and_a_prefill_pauses_the_running_decode() -> None:
    """Two requests at 0 and 3 s on one warm container (cold start 0): the first decodes
    alone at 1 s a step from 1 s; the second's 1 s prefill (3 to 4 s) pauses it; then both
    decode together at 1.5 s a step. The first has 2 of its 5 steps done by 3 s, finishes its
    other 3 at 4 + 4.5 = 8.5 s; the second has 1 step left then, alone again: 9.5 s."""
    run = simulate_containers(
        np.array([0.0, 3.0]),
        np.array([10, 10]),
        np.array([6, 5]),
        prefill_s=_flat(1.0),
        step_s=np.array([0.0, 1.0, 1.5]),
        slots=2,
        cold_start_s=0.0,
        idle_timeout_s=5.0,
    )
    np.testing.assert_allclose(run.ttft_s, [1.0, 1.0])
    np.testing.assert_allclose(run.e2e_s, [8.5, 9.5 - 3.0])
    np.testing.assert_allclose(run.tpot_s, [(8.5 - 1.0) / 5, (9.5 - 4.0) / 4])
    assert run.start_s.size == 1 and run.end_s[0] == pytest.approx(9.5 + 5.0)
    # a third request finding both slots taken starts a second container
    full = simulate_containers(
        np.array([0.0, 0.0, 0.0]),
        np.array([10, 10, 10]),
        np.array([3, 3, 3]),
        prefill_s=_flat(1.0),
        step_s=np.array([0.0, 1.0, 1.5]),
        slots=2,
        cold_start_s=4.0,
        idle_timeout_s=5.0,
    )
    np.testing.assert_array_equal(full.container, [0, 0, 1])
    assert full.peak_containers == 2


def test_which_gpu_holds_which_model() -> None:
    catalogue, cal = load_catalogue(), load_calibration()
    l4, l40s = catalogue.types["l4"], catalogue.types["l40s"]
    kw = {"runtime_gib": cal.gpu_runtime_gib, "context": 2048}
    olmoe, mixtral = load_shape("olmoe"), load_shape("mixtral")
    kv = olmoe.kv_bytes_per_token()
    assert fit(olmoe.manifest(), l4, kv_bytes_per_token=kv, **kw).fits  # 12.9 GiB in bf16
    big = fit(mixtral.manifest(), l40s, kv_bytes_per_token=mixtral.kv_bytes_per_token(), **kw)
    assert not big.fits and "does not fit 1 x NVIDIA L40S" in big.reason
    four = fit(mixtral.manifest(), l40s, kv_bytes_per_token=1e5, gpus=4, **kw)
    assert four.fits and four.weight_gib < 45
    gpt = load_shape("gpt-oss-20b")  # 39 GiB in bf16: an L40S holds it, an L4 does not
    gkv = gpt.kv_bytes_per_token()
    assert not fit(gpt.manifest(), l4, kv_bytes_per_token=gkv, **kw).fits
    assert fit(gpt.manifest(), l40s, kv_bytes_per_token=gkv, **kw).fits


def _tiny_arrivals(times: list[float], prompt: int, generated: int) -> Arrivals:
    n = len(times)
    return Arrivals(
        times_s=np.array(times),
        tokens=np.full(n, prompt),
        period_s=max(times) + 1.0,
        generated=np.full(n, generated),
    )


def test_the_bill_is_the_containers_seconds_at_the_list_price() -> None:
    manifest = tiny_manifest()
    share = counts_of(2, 4, 2048) / 2048
    modal = load_platform()
    arrivals = _tiny_arrivals([0.0, 5000.0], 100, 11)
    rows = serverless_generation(
        share, manifest, arrivals, load_catalogue(), modal, runtime_gib=1.0,
        kv_bytes_per_token=1000.0,
    )  # fmt: skip
    for row in rows:
        assert row["fits"] and row["gpus"] == 1 and row["containers"] == 2
        # two cold, lone requests: each container up its cold start, prefill, 10 steps, 60 s
        assert row["billed_s"] >= 2 * (60 + row["cold_start_s"])
        up = row["billed_s"] / 2
        assert up == math.ceil(up)  # whole seconds
        assert row["total_usd"] == pytest.approx(
            row["billed_s"] * modal.usd_per_second(row["gpu"])
        )
        assert row["per_million_output_usd"] * 22 / 1e6 <= row["total_usd"]
        assert row["ttft_p99_s"] >= row["cold_start_s"]
        assert row["basis"].startswith("predicted")


def test_bench_generate_reports_every_platform_per_rate() -> None:
    manifest = tiny_manifest().model_copy(update={"family": "decoder", "model": "tiny-decoder"})
    counts = PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})
    model = GenerationModel("tiny", "tiny decoder", manifest, counts)
    options = PlanOptions(slo_tpot_s=5.0, confidence=0.0)
    report = bench_generate(
        [model],
        load_calibration(),
        options=options,
        rates=((1 / 60, 1.0), (10.0, 0.01)),
        workers=False,
    )
    json.dumps(report)
    assert report["gpu_serverless_platform"]["name"] == "Modal"
    (row,) = report["models"]
    assert [r["rate_per_s"] for r in row["runs"]] == [1 / 60, 10.0]
    for run in row["runs"]:
        assert run["lambda"]["basis"].startswith("predicted")
        assert run["gpu"]["basis"].startswith("predicted")
        assert run["worker_cpu"]["status"] == "skipped"
        assert run["worker_gpu"]["status"] == "not built"
        assert [p["gpu"] for p in run["gpu_serverless"]] == ["l4", "l40s"]
        for platform in run["gpu_serverless"]:
            assert platform["per_million_output_usd"] > 0 and platform["tpot_p99_s"] > 0
    quiet, busy = row["runs"]
    for a, b in zip(quiet["gpu_serverless"], busy["gpu_serverless"], strict=True):
        assert b["per_million_output_usd"] < a["per_million_output_usd"]  # busier, cheaper


def test_bench_generate_sets_the_workers_beside_the_per_request_driver() -> None:
    manifest = tiny_manifest().model_copy(update={"family": "decoder", "model": "tiny-decoder"})
    counts = PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})
    model = GenerationModel("tiny", "tiny decoder", manifest, counts)
    options = PlanOptions(slo_ttft_s=60.0, slo_tpot_s=5.0, confidence=0.0)
    report = bench_generate([model], load_calibration(), options=options, rates=((1.0, 0.02),))
    (run,) = report["models"][0]["runs"]
    workers = run["worker_cpu"]
    assert workers["status"] in ("planned", "infeasible"), workers
    assert workers["basis"].startswith("predicted")
    if workers["status"] == "planned":
        assert workers["slots"] >= 1 and workers["per_million_output_usd"] > 0
        assert workers["tpot_p99_s"] <= 5.0


def test_bench_generate_renders_one_line_per_platform() -> None:
    from rich.console import Console

    from moelambda.cli import _render_gpu

    manifest = tiny_manifest().model_copy(update={"family": "decoder", "model": "tiny-decoder"})
    counts = PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})
    model = GenerationModel("tiny", "tiny decoder", manifest, counts)
    options = PlanOptions(slo_tpot_s=5.0, confidence=0.0)
    report = bench_generate(
        [model], load_calibration(), options=options, rates=((1.0, 0.02),), workers=False
    )
    console = Console(record=True, width=240)
    _render_gpu.bench_generate(console, report)
    text = console.export_text()
    for platform in ("a driver per request", "workers, CPU", "workers, GPU", "Modal L4"):
        assert platform in text
    assert "Modal L40S" in text and "simulated" in text and "not built" in text
