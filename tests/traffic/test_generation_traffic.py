"""A generating plan over a request stream: GeneratedTokens read and used, TTFT, TPOT and end to
end per request, the bill per input and output token, and the requests refused (900 s, the KV
cache); an encoder's streams and simulation unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.errors import UsageError
from ground.plan import Plan
from moelambda.cli import app
from planner import load_calibration
from planner.api import PlanningCounts, PlanOptions, plan_deployment
from planner.generation import plan_decode
from planner.traffic import Arrivals, load_arrivals, simulate_plan
from planner.traffic.api import plan_generation_traffic
from planner.traffic.generation import generation_limits
from planner.traffic.spec import trace_tokens
from planner.traffic.workflow import manifest_of_plan
from tests.traffic.plans import counts_of, tiny_manifest, tiny_plan

IDLE_GAP_S = 1000.0  # longer than the idle reclaim: every request starts cold


def _decoder() -> tuple:
    manifest = tiny_manifest().model_copy(update={"family": "decoder", "model": "tiny-decoder"})
    return manifest, PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})


@pytest.fixture(scope="module")
def generating() -> Plan:
    """A driver (two of four experts remote per layer) planned to generate 16 tokens for
    64-token prompts."""
    manifest, counts = _decoder()
    options = PlanOptions(deployment="driver", prompt_tokens=64, new_tokens=16, confidence=0.0)
    plan = plan_deployment(manifest, counts, load_calibration(), options=options).plan
    assert plan.generation is not None and plan.deployment == "driver"
    return plan


def _stream(generated: list[int], context: int = 64, gap_s: float = 10.0) -> Arrivals:
    n = len(generated)
    return Arrivals(
        np.arange(n) * gap_s, np.full(n, context), n * gap_s, {"spec": "test"}, np.array(generated)
    )


def test_the_trace_s_generated_tokens_are_read_and_synthetic_draws_keep_their_contexts() -> None:
    trace = load_arrivals("azure-conv")
    assert trace.generated is not None and trace.generated.size == trace.requests
    assert int(trace.generated.sum()) == 4_088_665  # the CSV's GeneratedTokens column
    stream = load_arrivals("poisson:2", hours=0.1, seed=3)
    # the context tokens an encoder is served are the draws the column alone gave before
    rng = np.random.default_rng(3)
    times = np.sort(rng.uniform(0.0, 360.0, size=rng.poisson(2 * 360.0)))
    assert np.array_equal(stream.tokens, rng.choice(trace_tokens(), size=times.size))
    assert stream.generated is not None
    pairs = set(zip(trace.tokens.tolist(), trace.generated.tolist(), strict=True))
    assert all(p in pairs for p in zip(stream.tokens, stream.generated, strict=True))
    window = trace.window(0.0, 600.0)
    assert window.generated is not None and window.generated.size == window.requests


def test_each_request_is_a_prefill_and_its_decode_steps(generating: Plan) -> None:
    generated = [5, 40, 17, 1]
    report = simulate_plan(generating, _stream(generated, gap_s=IDLE_GAP_S))
    tpot, step_usd, _ = plan_decode(generating, manifest_of_plan(generating))
    assert report["served"] == 4 and report["refused"]["total"] == 0
    assert report["tpot_s"]["p50"] == pytest.approx(tpot)
    ttft, e2e = report["ttft_s"], report["e2e_s"]
    assert ttft["p99"] <= e2e["p99"]
    # every request starts cold and waits the same INIT: the longest generation ends last
    assert e2e["max"] == pytest.approx(ttft["max"] + 39 * tpot)
    bill = report["bill_usd"]
    assert bill["decode_usd"] == pytest.approx(step_usd * sum(g - 1 for g in generated))
    assert bill["per_million_output_usd"] == pytest.approx(bill["decode_usd"] / 63 * 1e6)
    assert report["input_tokens"] == 4 * 64 and report["output_tokens"] == sum(generated)
    assert report["cold_starts"]["per_function"]["driver"] == 4


def test_more_generated_tokens_cost_more_output_bill_and_take_longer(generating: Plan) -> None:
    short = simulate_plan(generating, _stream([8] * 6))
    long = simulate_plan(generating, _stream([32] * 6))
    tpot = long["tpot_s"]["p50"]
    assert long["e2e_s"]["p50"] == pytest.approx(short["e2e_s"]["p50"] + 24 * tpot)
    assert long["bill_usd"]["decode_usd"] == pytest.approx(
        short["bill_usd"]["decode_usd"] * 31 / 7
    )
    assert long["bill_usd"]["total_usd"] > short["bill_usd"]["total_usd"]
    # the prefill does not see the generation
    assert long["ttft_s"] == pytest.approx(short["ttft_s"], rel=1e-12)


def test_a_generation_past_one_invocation_or_the_kv_cache_is_refused(generating: Plan) -> None:
    limit, fixed_mb, activations_mb, kv_mb = generation_limits(generating)
    assert limit == 300.0  # an Express workflow: its duration, not Lambda's 900 s
    tpot = simulate_plan(generating, _stream([2]))["tpot_s"]["p50"]
    too_long = int(limit / tpot) + 2
    room = (generating.nonmoe_memory_mb - fixed_mb - 64 * (activations_mb + kv_mb)) / kv_mb
    too_big = max(int(room) + 10, too_long)  # over both: counted once, for its memory
    base = simulate_plan(generating, _stream([8, 8]))
    report = simulate_plan(generating, _stream([8, too_long, 8, too_big]))
    assert report["refused"] == {
        "over_time_limit": 1,
        "over_memory": 1,
        "over_replicas": 0,
        "total": 2,
    }
    assert report["refused_fraction"] == 0.5 and report["served"] == 2
    assert report["output_tokens"] == 16
    assert report["e2e_s"]["max"] < limit
    # refused requests are neither run nor billed
    assert report["bill_usd"]["decode_usd"] == pytest.approx(base["bill_usd"]["decode_usd"])


def test_a_stream_without_generated_tokens_is_refused_by_name(
    generating: Plan, tmp_path: Path
) -> None:
    csv = tmp_path / "trace.csv"
    csv.write_text("time_s,tokens\n0,64\n5,64\n", encoding="utf-8")
    arrivals = load_arrivals(str(csv))
    assert arrivals.generated is None
    with pytest.raises(UsageError, match="GeneratedTokens"):
        simulate_plan(generating, arrivals)
    with pytest.raises(UsageError, match="--max-batch-tokens"):
        simulate_plan(generating, _stream([4]), max_batch_tokens=128)


def test_an_encoder_plan_ignores_what_requests_generate() -> None:
    plan = tiny_plan(tokens=512)
    with_g = _stream([5, 300, 7], context=200)
    without = Arrivals(with_g.times_s, with_g.tokens, with_g.period_s, with_g.source)
    a, b = simulate_plan(plan, with_g), simulate_plan(plan, without)
    for summary in (a, b):
        summary.pop("wall_s"), summary.pop("simulation_s")
    assert a == b
    assert "ttft_s" not in a and a["latency_s"]["p99"] is not None


def test_plan_traffic_sizes_the_plan_for_the_stream_s_long_requests(tmp_path: Path) -> None:
    manifest, counts = _decoder()
    rng = np.random.default_rng(0)
    context, generated = rng.integers(16, 200, 100), rng.integers(2, 60, 100)
    csv = tmp_path / "stream.csv"
    pairs = enumerate(zip(context, generated, strict=True))
    rows = "\n".join(f"{i * 3.0},{c},{g}" for i, (c, g) in pairs)
    csv.write_text(f"time_s,tokens,generated\n{rows}\n", encoding="utf-8")
    plan, summary = plan_generation_traffic(
        manifest,
        counts,
        load_calibration(),
        traffic=str(csv),
        options=PlanOptions(deployment="driver", slo_tpot_s=5.0, confidence=0.0),
    )
    assert plan.generation is not None
    assert plan.generation.prompt_tokens == int(np.quantile(context, 0.99, method="inverted_cdf"))
    assert plan.generation.new_tokens == int(np.quantile(generated, 0.99, method="inverted_cdf"))
    stream = summary["traffic"]
    assert stream["requests"] == 100 and stream["refused"]["over_memory"] <= 1
    assert stream["ttft_s"]["p99"] <= stream["e2e_s"]["p99"]
    assert summary["generation"]["bill_per_million_output_usd"] > 0
    with pytest.raises(UsageError, match="--batch-sequences"):
        plan_generation_traffic(
            manifest,
            counts,
            load_calibration(),
            traffic=str(csv),
            options=PlanOptions(batch_sequences=4, confidence=0.0),
        )


def test_plan_refuses_slo_p99_for_a_generating_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["plan", "--shape", "olmoe", "--slo-tpot", "1", "--traffic", "azure-conv"]
    result = CliRunner().invoke(app, [*args, "--slo-p99", "10", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "--slo-ttft and --slo-tpot" in result.output and not out.exists()
