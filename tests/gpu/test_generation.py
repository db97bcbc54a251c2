"""The GPU backend's per-token model of a decoder (`gpu.generation`), `compare --slo-ttft/
--slo-tpot` (Lambda, GPUs, a managed API's list price) and `bench generate`'s report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gpu.cluster import load_catalogue
from gpu.compare import gpu_options
from gpu.estimate import ModelWork
from gpu.generation import decode_step_s, gpu_generation
from gpu.generation_compare import (
    GenerationModel,
    bench_generate,
    compare_generation,
    shape_model,
)
from ground.errors import UsageError
from moelambda.cli import app
from planner import load_calibration
from planner.api import PlanningCounts, PlanOptions
from tests.traffic.plans import counts_of, tiny_manifest

runner = CliRunner()


@pytest.fixture(scope="module")
def mixtral() -> GenerationModel:
    return shape_model("mixtral")


def _share(model: GenerationModel) -> np.ndarray:
    return model.counts.counts / model.counts.tokens


def test_a_decode_step_reads_the_weights_it_uses_and_batching_amortises_them(
    mixtral: GenerationModel,
) -> None:
    catalogue = load_catalogue()
    a100 = catalogue.types["a100"]
    work = ModelWork.of(mixtral.manifest)
    share = _share(mixtral)
    one = decode_step_s(work, share, a100, 1, 1.0, catalogue)
    # one token reads every non-MoE weight and top_k of each layer's experts at least
    active = work.nonmoe_flops.sum() + work.tail_flops + (share * work.expert_flops).sum()
    assert one >= active / (a100.memory_gbps * 1e9)  # bf16: as many bytes as FLOPs / 2 x 2
    steps = [decode_step_s(work, share, a100, 4, b, catalogue) for b in (1.0, 4.0, 16.0, 64.0)]
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False))
    per_token = [s / b for s, b in zip(steps, (1, 4, 16, 64), strict=True)]
    assert all(a > b for a, b in zip(per_token, per_token[1:], strict=False))


def test_gpus_cost_less_per_output_token_the_busier_they_are(mixtral: GenerationModel) -> None:
    catalogue = load_catalogue()
    share, manifest = _share(mixtral), mixtral.manifest
    rates = (1 / 60, 1.0, 10.0)
    runs = [
        gpu_generation(share, manifest, catalogue, rps=r, prompt_tokens=1020, new_tokens=129)
        for r in rates
    ]
    costs = [g.per_million_output_usd for g in runs]
    assert all(a > b for a, b in zip(costs, costs[1:], strict=False))
    quiet = runs[0]
    # at one request a minute one copy idles: the hour over the tokens of the hour
    assert quiet.copies == 1 and quiet.utilisation < 0.2
    hourly_tokens = 60 * 129
    assert quiet.per_million_output_usd < quiet.usd_per_hour / hourly_tokens * 1e6
    # its TTFT is the batch model's prefill of one prompt on that deployment
    prefill = {
        (o.gpu_type, o.gpus): o.latency_s for o in gpu_options(share * 1020, manifest, catalogue)
    }
    assert quiet.ttft_s == pytest.approx(prefill[(quiet.gpu_type, quiet.gpus)], rel=1e-9)
    # a TPOT SLO below the fastest single-sequence step is met by none
    with pytest.raises(UsageError, match="--slo-tpot"):
        gpu_generation(
            share,
            manifest,
            catalogue,
            rps=1.0,
            prompt_tokens=1020,
            new_tokens=129,
            slo_tpot_s=1e-6,
        )


def test_a_larger_kv_cache_needs_more_copies(mixtral: GenerationModel) -> None:
    catalogue = load_catalogue()
    share, manifest = _share(mixtral), mixtral.manifest
    small, large = (
        gpu_generation(
            share,
            manifest,
            catalogue,
            rps=10.0,
            prompt_tokens=1020,
            new_tokens=129,
            kv_bytes_per_token=kv,
        )
        for kv in (1e3, 1e7)
    )
    assert large.batch < small.batch
    assert large.usd_per_hour > small.usd_per_hour


def test_compare_sets_the_plan_beside_gpus_and_the_list_price(mixtral: GenerationModel) -> None:
    cal = load_calibration()
    options = PlanOptions(slo_ttft_s=300, slo_tpot_s=5, concurrency_quota=100_000, confidence=0.0)
    summary = compare_generation(mixtral.manifest, mixtral.counts, cal, rps=1.0, options=options)
    lam, gpu, managed = summary["rows"]
    assert [r["backend"] for r in summary["rows"]] == ["lambda", "gpu", "managed api"]
    price = cal.managed_api_prices["Mixtral-8x7B-v0.1"]
    assert managed["per_million_output_usd"] == price.output_per_million_usd
    assert managed["per_million_input_usd"] == price.input_per_million_usd
    assert "bedrock" in managed["source"].lower()
    assert lam["per_million_output_usd"] > 0 and lam["tpot_s"] <= 5
    assert gpu["per_million_output_usd"] == summary["gpu"]["per_million_output_usd"]
    olmoe = shape_model("olmoe")
    other = compare_generation(olmoe.manifest, olmoe.counts, cal, rps=1.0, options=options)
    assert other["managed_api"]["list_price"] is False
    assert other["rows"][2]["per_million_output_usd"] is None
    assert other["rows"][2]["source"] == "no list price"


def test_compare_cli_for_a_decoder_and_its_refusals() -> None:
    args = ["compare", "--shape", "mixtral", "--rps", "1", "--concurrency-quota", "100000"]
    result = runner.invoke(app, [*args, "--slo-ttft", "300", "--slo-tpot", "5", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"][2]["per_million_output_usd"] == 0.7
    refused = runner.invoke(app, [*args, "--slo-tpot", "5", "--slo", "60"])
    assert refused.exit_code == 2 and "--slo" in refused.output
    batch = runner.invoke(app, ["compare", "--shape", "mixtral", "--rps", "1"])
    assert batch.exit_code == 2 and "--counts" in batch.output


def test_bench_generate_reports_each_backend_per_rate() -> None:
    manifest = tiny_manifest().model_copy(update={"family": "decoder", "model": "tiny-decoder"})
    counts = PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})
    model = GenerationModel("tiny", "tiny decoder", manifest, counts)
    options = PlanOptions(slo_tpot_s=5.0, confidence=0.0)
    report = bench_generate(
        [model],
        load_calibration(),
        options=options,
        rates=((1 / 60, 2.0), (1.0, 0.05)),
        workers=False,
    )
    json.dumps(report)
    assert report["trace"] == "azure-conv" and report["reserved_concurrency"] is False
    (row,) = report["models"]
    assert row["managed_api"]["source"] == "no list price"
    assert [r["rate_per_s"] for r in row["runs"]] == [1 / 60, 1.0]
    for run in row["runs"]:
        lam, gpu = run["lambda"], run["gpu"]
        for key in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "per_million_output_usd"):
            assert lam[key] is not None and lam[key] > 0, key
        assert lam["ttft_p99_s"] <= lam["e2e_p99_s"]
        for key in ("ttft_p99_s", "tpot_p99_s", "per_million_output_usd"):
            assert gpu[key] > 0, key
        assert run["planned_for"]["new_tokens"] > 129  # the stream's p99 generation
    quiet, busy = row["runs"]
    assert busy["gpu"]["per_million_output_usd"] < quiet["gpu"]["per_million_output_usd"]


def test_bench_generate_needs_smollm2_counts() -> None:
    result = runner.invoke(app, ["bench", "generate", "--models", "smollm2,mixtral"])
    assert result.exit_code == 2 and "--smollm2-counts" in result.output
