"""Generation: the decode semantics, the decode-step model, its solver against a brute force,
and `plan --slo-ttft/--slo-tpot`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from ground.errors import CalibrationError, InfeasibleError, UsageError
from ground.generation import (
    decode_invokes,
    expected_remote_hits,
    hit_probability,
    rows_per_hit,
)
from ground.manifest import Manifest
from moelambda.cli import app
from planner import Plan, load_calibration
from planner.api import PlanOptions, plan_deployment, shape_counts_for_plan
from planner.generation import (
    GenerationChoice,
    GenerationInstance,
    decode_step,
    evaluate_generation,
    generation_instance,
)
from planner.generation_solver import GenerationGrid, plan_generation
from planner.shapes import load_shape
from tests.planner.test_driver import small_driver

runner = CliRunner()
Shape = tuple[Manifest, np.ndarray]  # a shape's manifest and routing shares


def test_decode_invokes_counts_remote_experts_hit_per_step_and_layer() -> None:
    counts = np.zeros((2, 2, 3), dtype=int)  # (steps, layers, experts)
    counts[0, 0] = [2, 0, 1]
    counts[0, 1] = [0, 3, 0]
    counts[1, 0] = [1, 1, 1]
    counts[1, 1] = [0, 0, 0]
    local = np.array([[True, False, False], [False, False, False]])
    # step 0: layer 0 experts 2 (1 is idle, 0 local), layer 1 expert 1; step 1: experts 1, 2
    assert decode_invokes(counts, local) == 4
    assert decode_invokes(counts, np.ones((2, 3), bool)) == 0
    assert decode_invokes(counts, np.zeros((2, 3), bool)) == 6
    with pytest.raises(ValueError, match="steps, L, E"):
        decode_invokes(counts[0], local)


def _route(rng: np.random.Generator, weights: np.ndarray, top_k: int, shape: tuple) -> np.ndarray:
    """Experts picked by independent tokens, top_k distinct each (Gumbel top-k), as 0/1."""
    keys = np.log(weights) + rng.gumbel(size=(*shape, weights.size))
    picked = np.argsort(-keys, axis=-1)[..., :top_k]
    onehot = np.zeros((*shape, weights.size), dtype=int)
    np.put_along_axis(onehot, picked, 1, axis=-1)
    return onehot


def test_expected_hits_match_sampled_routing_and_the_metered_count() -> None:
    """Sequences routed independently, top-2 of 6 skewed experts: the formula's hits and rows
    per hit are what a sampled decode meters, and `decode_invokes` counts them."""
    rng = np.random.default_rng(0)
    weights = np.array([8.0, 4.0, 2.0, 1.0, 0.5, 0.25])
    steps, sequences = 20_000, 4
    rows = _route(rng, weights, 2, (steps, sequences)).sum(axis=1)  # (steps, E)
    share = _route(rng, weights, 2, (200_000,)).mean(axis=0)[None]  # (1, E) q per token
    hit = (rows > 0).mean(axis=0)
    np.testing.assert_allclose(hit, hit_probability(share, sequences)[0], atol=0.01)
    per_hit = rows.sum(axis=0) / (rows > 0).sum(axis=0)
    np.testing.assert_allclose(per_hit, rows_per_hit(share, sequences)[0], rtol=0.02)
    local = np.array([[True, True, False, False, False, False]])
    expected = expected_remote_hits(share, local, sequences)[0] * steps
    assert decode_invokes(rows[:, None, :], local) == pytest.approx(expected, rel=0.01)


def small_generation(seed: int, *, new_tokens: int = 20) -> GenerationInstance:
    """A generation problem small enough to enumerate, on the driver tests' small prefill."""
    rng = np.random.default_rng(2000 + seed)
    prefill = small_driver(seed)
    share = prefill.base.counts / prefill.base.tokens
    return GenerationInstance(
        prefill=prefill,
        share=share,
        sequences=4,
        prompt_tokens=prefill.base.tokens // 4,
        new_tokens=new_tokens,
        round_trip_s=0.03,
        layer_floor_s=0.003,
        kv_bytes_per_token=float(rng.choice([1e4, 1e6, 3e6])),  # the KV cache may bind
    )


def _every_choice(ginst: GenerationInstance) -> list[GenerationChoice]:
    b = ginst.prefill.base
    return [
        GenerationChoice(d, k, j, g)
        for d, k, j, g in itertools.product(
            range(ginst.prefill.memory_mb.size),
            range(ginst.experts + 1),
            range(b.memory_mb.size),
            range(1, b.max_replicas + 1),
        )
    ]


@pytest.mark.parametrize("seed", range(10))
def test_the_grid_prices_every_choice_as_the_reference_does(seed: int) -> None:
    ginst = small_generation(seed)
    grid = GenerationGrid.make(ginst)
    for c in _every_choice(ginst):
        ev = evaluate_generation(ginst, c)
        at = (c.memory, c.local_per_layer, c.remote_memory, c.replicas - 1)
        assert grid.ttft[at] == pytest.approx(ev.ttft_s, rel=1e-9)
        assert grid.tpot[at] == pytest.approx(ev.tpot_s, rel=1e-9)
        assert grid.total[at] == pytest.approx(ev.total_usd, rel=1e-9)
        fits = grid.limits_ok[at] and grid.run[at] <= ginst.prefill.base.max_timeout_s
        assert fits == ev.feasible, ev.violations


@pytest.mark.parametrize(("seed", "new_tokens"), [(s, 20) for s in range(10)] + [(0, 1), (1, 1)])
def test_solver_equals_a_brute_force_at_loose_and_binding_slos(seed: int, new_tokens: int) -> None:
    """Every shape and SLO; with one new token there is no decode step, and TPOT binds not."""
    ginst = small_generation(seed, new_tokens=new_tokens)
    choices = _every_choice(ginst)
    fine = [ev for ev in (evaluate_generation(ginst, c) for c in choices) if ev.feasible]
    ttfts = sorted({ev.ttft_s for ev in fine}) or [1.0]
    tpots = sorted({ev.tpot_s for ev in fine}) or [1.0]
    slos = [(None, None), (ttfts[len(ttfts) // 3], tpots[len(tpots) // 4]), (ttfts[0], None)]
    grid = GenerationGrid.make(ginst)
    for deployment, (slo_ttft, slo_tpot) in itertools.product(("driver", "monolithic"), slos):

        def of_shape(k: int, deployment: str = deployment) -> bool:
            return (k == ginst.experts) == (deployment == "monolithic")

        totals = [
            ev.total_usd
            for c in choices
            if of_shape(c.local_per_layer)
            and (ev := evaluate_generation(ginst, c, slo_ttft, slo_tpot)).feasible
        ]
        if not totals:
            with pytest.raises(InfeasibleError):
                grid.best(deployment, slo_ttft, slo_tpot)
            continue
        best = grid.best(deployment, slo_ttft, slo_tpot)
        assert best.evaluation.feasible, best.evaluation.violations
        assert best.evaluation.total_usd == pytest.approx(min(totals), rel=1e-9)
        assert of_shape(best.choice.local_per_layer)


@pytest.fixture(scope="module")
def olmoe() -> Shape:
    planning = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=10240)
    return planning.manifest, planning.counts / planning.tokens


def test_more_local_experts_mean_fewer_invokes(olmoe: Shape) -> None:
    manifest, share = olmoe
    ginst = generation_instance(manifest, share, load_calibration(), sequences=4)
    hits = [expected_remote_hits(share, ginst.local(k), 4).sum() for k in range(65)]
    assert all(a > b for a, b in zip(hits, hits[1:], strict=False))  # every expert has tokens
    assert hits[-1] == 0.0
    d = ginst.prefill.memory_mb.size - 1
    invokes = [decode_step(ginst, d, ginst.local(k), 1)[2] for k in (0, 8, 32)]
    assert invokes == pytest.approx([hits[0], hits[8], hits[32]])


def test_tpot_grows_with_the_batch_and_its_cost_per_token_falls(olmoe: Shape) -> None:
    manifest, share = olmoe
    cal = load_calibration()
    tpots, per_token = [], []
    for sequences in (1, 2, 4, 16, 64):
        ginst = generation_instance(manifest, share, cal, sequences=sequences, prompt_tokens=64)
        tpot, usd, _ = decode_step(ginst, ginst.prefill.memory_mb.size - 1, ginst.local(4), 1)
        tpots.append(tpot)
        per_token.append(usd / sequences)
    assert all(a < b for a, b in zip(tpots, tpots[1:], strict=False))
    assert all(a > b for a, b in zip(per_token, per_token[1:], strict=False))


def test_an_infeasible_tpot_names_the_smallest_that_a_plan_meets(olmoe: Shape) -> None:
    manifest, share = olmoe
    cal = load_calibration()
    with pytest.raises(InfeasibleError, match="--slo-tpot") as caught:
        plan_generation(manifest, share, cal, deployment="driver", slo_tpot_s=0.01)
    smallest = caught.value.smallest_slo_s
    assert smallest is not None and smallest > 0.01
    _, best = plan_generation(manifest, share, cal, deployment="driver", slo_tpot_s=smallest)
    assert best.evaluation.tpot_s == pytest.approx(smallest, rel=1e-9)
    with pytest.raises(InfeasibleError, match="--slo-ttft"):
        plan_generation(manifest, share, cal, deployment="driver", slo_ttft_s=0.01)
    with pytest.raises(InfeasibleError, match="--deployment driver"):  # 14 GB of weights
        plan_generation(manifest, share, cal, deployment="monolithic")


def test_generation_needs_a_decoder_and_the_round_trip(olmoe: Shape) -> None:
    manifest, share = olmoe
    cal = load_calibration()
    encoder = manifest.model_copy(update={"family": "bert", "model_type": "bert"})
    with pytest.raises(UsageError, match="encoder"):
        generation_instance(encoder, share, cal)
    with pytest.raises(CalibrationError, match="invoke_round_trip_s"):
        generation_instance(manifest, share, cal.model_copy(update={"invoke_round_trip_s": None}))
    with pytest.raises(UsageError, match="--new-tokens"):
        generation_instance(manifest, share, cal, new_tokens=0)


def test_the_calibration_sources_the_round_trip_and_a_managed_price() -> None:
    cal = load_calibration()
    assert cal.invoke_round_trip_s is not None
    assert cal.invoke_round_trip_s > cal.warm_start_s  # the callee's start is inside it
    price = (cal.managed_api_prices or {})["Mixtral-8x7B-v0.1"]
    assert price.provider.startswith("Amazon Bedrock")
    assert 0 < price.input_per_million_usd < price.output_per_million_usd
    for name in ("invoke_round_trip_s", "managed_api_prices"):
        assert cal.provenance[name].source and cal.provenance[name].as_of


def _plan_cli(out: Path, *extra: str) -> Result:
    return runner.invoke(
        app,
        [
            *("plan", "--shape", "olmoe", "--tokens", "1024", "--out", str(out), "--json"),
            *("--concurrency-quota", "100000", *extra),
        ],
    )


def test_plan_reports_generation_and_its_plan_loads(tmp_path: Path) -> None:
    out = tmp_path / "gen.json"
    args = ("--slo-ttft", "60", "--slo-tpot", "2", "--batch-sequences", "2")
    result = _plan_cli(out, *args, "--prompt-tokens", "256", "--new-tokens", "33")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    gen = summary["generation"]
    for key in (
        "ttft_s",
        "tpot_s",
        "bill_per_million_input_usd",
        "bill_per_million_output_usd",
        "local",
    ):
        assert key in gen
    assert (gen["batch_sequences"], gen["prompt_tokens"], gen["new_tokens"]) == (2, 256, 33)
    assert gen["ttft_s"] <= 60 and gen["tpot_s"] <= 2
    assert [c["deployment"] for c in summary["candidates"]] == ["monolithic", "driver"]
    assert summary["deployment"] == "driver"
    plan = Plan.load(out)
    assert plan.generation is not None and plan.driver is not None
    assert plan.driver.local == gen["local"]
    assert plan.totals.tokens == 2 * 256 and plan.totals.slo_s == 60
    assert plan.driver.time_s == pytest.approx(gen["ttft_s"] + 32 * gen["tpot_s"])
    prefill = plan.totals.bill_usd["total_usd"]
    assert plan.generation.bill_per_million_input_usd == pytest.approx(prefill / 512 * 1e6)
    assert plan.generation.bill_per_million_output_usd == pytest.approx(
        32 * gen["step_usd"] / 66 * 1e6
    )
    # a plan made before generation (no block) loads, and means no generation
    old = json.loads(out.read_text())
    del old["generation"]
    old["driver"]["time_s"] = old["totals"]["latency_s"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Plan.load(tmp_path / "old.json").generation is None
    # an Express workflow must cover the whole generation, not only its prefill
    long = json.loads(out.read_text())
    long["workflow"] = "express"
    long["generation"]["tpot_s"] = 10.0
    with pytest.raises(ValueError, match="Express"):
        Plan.model_validate(long)


def test_the_readable_summary_says_ttft_tpot_and_the_bills(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            *("plan", "--shape", "olmoe", "--tokens", "1024", "--out", str(tmp_path / "p.json")),
            *("--concurrency-quota", "100000", "--slo-tpot", "2", "--new-tokens", "9"),
        ],
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)
    for words in ("TTFT", "TPOT SLO 2.000 s", "per million output tokens", "driver (chosen)"):
        assert words in text, words


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--slo-tpot", "1", "--deployment", "workflow"), "does not generate"),
        (("--slo-tpot", "1", "--slo", "30"), "--slo-ttft"),
        (("--slo-tpot", "0"), "--slo-tpot"),
        (("--new-tokens", "0"), "--new-tokens"),
        (("--slo-tpot", "1", "--method", "s3"), "--method"),
        (("--slo-tpot", "1", "--traffic", "azure-conv", "--slo-p99", "5"), "--traffic"),
    ],
)
def test_bad_generation_options_exit_2_and_write_nothing(
    tmp_path: Path, extra: tuple[str, ...], says: str
) -> None:
    out = tmp_path / "bad.json"
    result = _plan_cli(out, *extra)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not out.exists()


def test_an_encoder_plan_refuses_generation(counts: Path, tmp_path: Path) -> None:
    out = tmp_path / "minilm.json"
    result = runner.invoke(
        app, ["plan", "--counts", str(counts), "--out", str(out), "--slo-tpot", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "encoder" in result.output and "--slo S" in result.output
    assert not out.exists()


def test_plan_deployment_plans_generation_in_one_call(olmoe: Shape) -> None:
    manifest, share = olmoe
    planning = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024)
    options = PlanOptions(slo_tpot_s=2.0, new_tokens=9, concurrency_quota=None)
    planned = plan_deployment(planning.manifest, planning, load_calibration(), options=options)
    assert planned.plan.generation is not None
    assert planned.summary["generation"]["tpot_s"] <= 2.0
    # the solver's plan, with the shape's exact KV cache
    _, best = plan_generation(
        manifest,
        planning.counts / planning.tokens,
        load_calibration(),
        deployment="driver",
        slo_tpot_s=2.0,
        new_tokens=9,
        kv_bytes_per_token=load_shape("olmoe").kv_bytes_per_token(),
    )
    assert planned.plan.generation.tpot_s == pytest.approx(best.evaluation.tpot_s)
    assert best.choice.local_per_layer == planned.summary["generation"]["local_per_layer"]
