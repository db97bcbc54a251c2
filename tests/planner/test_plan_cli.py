"""`moelambda plan`: the contract, solvers agreeing, the Plan's validation, infeasible SLOs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.semantics import max_direct_tokens
from moelambda.cli import app
from planner import Plan, PlanError, load_calibration
from predictor import PredictedCounts

runner = CliRunner()


def _plan(counts: Path, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    """`plan` the workflow (these tests are of its planner; `tests/planner/test_deployments.py`
    weighs the shapes), one expert per function unless `extra` passes --pack."""
    pack = () if "--pack" in extra else ("--pack", "1")
    shape = () if "--deployment" in extra else ("--deployment", "workflow")
    return runner.invoke(
        app, ["plan", "--counts", str(counts), "--out", str(out), *pack, *shape, *extra]
    )


def test_pack_auto_keeps_the_cheapest_grouping_and_never_costs_more(
    counts: Path, tmp_path: Path
) -> None:
    one = _json(_plan(counts, tmp_path / "one.json", "--json"))
    auto = _json(_plan(counts, tmp_path / "auto.json", "--pack", "auto", "--json"))
    assert [t["experts_per_function"] for t in auto["packing"]] == [1, 2, 4]
    costs = {t["experts_per_function"]: t["cost_usd"] for t in auto["packing"]}
    assert costs[1] == pytest.approx(one["objective_usd"], rel=1e-12)
    assert auto["objective_usd"] == min(c for c in costs.values() if c is not None)
    assert auto["objective_usd"] <= one["objective_usd"]
    k = auto["experts_per_function"]
    plan = Plan.load(tmp_path / "auto.json")
    assert auto["functions"] == 6 * 4 // k == sum(len(la.experts) for la in plan.layers)
    assert plan.packed == (k > 1)
    two = _json(_plan(counts, tmp_path / "two.json", "--pack", "2", "--json"))
    assert two["objective_usd"] == pytest.approx(costs[2], rel=1e-12)
    assert [len(e.hosted) for e in Plan.load(tmp_path / "two.json").layers[0].experts] == [2, 2]
    for bad in ("3", "0", "many"):
        refused = _plan(counts, tmp_path / "bad.json", "--pack", bad)
        assert refused.exit_code == 2 and "--pack" in refused.output
        assert not (tmp_path / "bad.json").exists()


def _json(result) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_contract_pareto_and_solvers_agree(counts: Path, tmp_path: Path) -> None:
    cheapest = _json(
        _plan(counts, tmp_path / "p0.json", "--pareto", str(tmp_path / "c.csv"), "--json")
    )
    plan = Plan.load(tmp_path / "p0.json")
    assert plan.totals.moe_cost_usd == pytest.approx(cheapest["moe_cost_usd"])
    assert len(plan.layers) == 6 and all(len(layer.experts) == 4 for layer in plan.layers)
    options = load_calibration().memory_options_mb
    assert all(e.memory_mb in options for layer in plan.layers for e in layer.experts)
    assert plan.totals.bill_usd["total_usd"] > plan.totals.moe_cost_usd
    assert [s.key for s in plan.model.stages if s.role == "expert"][
        0
    ] == "layers/00/experts/00.safetensors"
    with (tmp_path / "c.csv").open() as f:
        rows = [(float(r["slo_s"]), float(r["cost_usd"])) for r in csv.DictReader(f)]
    assert rows[0][0] == pytest.approx(cheapest["smallest_slo_s"], rel=1e-5)
    # latency ascends to the nanosecond (the frontier's resolution), cost strictly descends
    assert all(a[0] <= b[0] + 1e-9 and a[1] > b[1] for a, b in zip(rows, rows[1:], strict=False))
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"

    slo = (cheapest["latency_s"] + cheapest["smallest_slo_s"]) / 2
    results = {}
    for solver in ("exact", "ods", "milp"):
        out = tmp_path / f"{solver}.json"
        results[solver] = _json(
            _plan(counts, out, "--slo", str(slo), "--solver", solver, "--json")
        )
        assert results[solver]["latency_s"] <= slo * (1 + 1e-9)
        assert Plan.load(out).totals.slo_s == slo
    exact = results["exact"]["objective_usd"]
    assert exact > cheapest["objective_usd"]  # the SLO binds
    assert results["milp"]["objective_usd"] == pytest.approx(exact, rel=1e-6)
    assert results["ods"]["objective_usd"] >= exact * (1 - 1e-9)

    forced = _json(_plan(counts, tmp_path / "s3.json", "--method", "s3", "--json"))
    assert {layer["method"] for layer in forced["layers"]} == {"s3"}
    assert forced["objective_usd"] >= cheapest["objective_usd"] * (1 - 1e-9)
    throughput = _json(_plan(counts, tmp_path / "t.json", "--throughput", "900", "--json"))
    assert throughput["slo_s"] == pytest.approx(10240 / 900)


def test_infeasible_slo_names_the_smallest_feasible(counts: Path, tmp_path: Path) -> None:
    result = _plan(counts, tmp_path / "p.json", "--slo", "0.5")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "binding constraint is latency" in text
    assert "pass --slo" in text and not (tmp_path / "p.json").exists()
    # A synchronous Invoke carries 6 MB: about 4,096 of MiniLM's tokens per replica.
    direct = _plan(counts, tmp_path / "p.json", "--method", "direct", "--tokens", "409600")
    assert direct.exit_code == 2 and "payload limit" in " ".join(direct.output.split())
    assert not (tmp_path / "p.json").exists()


def test_bad_input_exits_2_and_writes_nothing(counts: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    uncalibrated = tmp_path / "cal.json"
    document = json.loads(load_calibration().source_path.read_text())
    document["parameters"]["expert_token_compute_s"]["value"] = None
    uncalibrated.write_text(json.dumps(document))
    cases = [
        (["--traces", str(tmp_path), "--counts", str(counts)], "exactly one of"),
        (["--counts", str(counts), "--slo", "1", "--throughput", "5"], "pass only one"),
        (["--counts", str(counts), "--slo", "-1"], "not positive"),
        (["--counts", str(counts), "--solver", "gurobi"], "unknown --solver"),
        (["--counts", str(counts), "--method", "ftp"], "unknown scatter-gather method"),
        (["--counts", str(counts), "--arch", "riscv"], "unknown --arch"),
        (["--counts", str(tmp_path / "missing.json")], "cannot read the counts file"),
        (["--counts", str(counts), "--calibration", str(uncalibrated)], "moelambda calibrate"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["plan", *args, "--out", str(out)])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
        assert not out.exists()
    out.write_text("keep me")
    refused = runner.invoke(app, ["plan", "--counts", str(counts), "--out", str(out)])
    assert refused.exit_code == 2 and out.read_text() == "keep me"


def test_plan_validation_on_load(counts: Path, tmp_path: Path) -> None:
    _json(_plan(counts, tmp_path / "p.json", "--json"))
    good = json.loads((tmp_path / "p.json").read_text())

    def broken(change) -> str:  # type: ignore[no-untyped-def]
        doc = json.loads(json.dumps(good))
        change(doc)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(PlanError) as info:
            Plan.load(path)
        return str(info.value.problem)

    def memory(doc) -> None:  # type: ignore[no-untyped-def]
        doc["layers"][0]["experts"][0]["memory_mb"] = 20000

    def replicas(doc) -> None:  # type: ignore[no-untyped-def]
        doc["layers"][1]["experts"][2]["replicas"] = 9

    limit = max_direct_tokens(good["direct_payload_bytes"], good["model"]["token_bytes_in"])

    def direct(tokens: int):  # type: ignore[no-untyped-def]
        def change(doc) -> None:  # type: ignore[no-untyped-def]
            doc["layers"][0]["method"] = "direct"
            for e, expert in enumerate(doc["layers"][0]["experts"]):
                rows = float(tokens) if e == 0 else 100.0
                expert.update(tokens=rows, replicas=1, max_tokens_per_replica=limit)

        return change

    def express_too_long(doc) -> None:  # type: ignore[no-untyped-def]
        doc["workflow"], doc["totals"]["latency_s"] = "express", 301.0

    assert "outside 128-10240 MB" in broken(memory)
    assert "G = 8" in broken(replicas)
    # Rows travel base64 in the JSON event: 3,071 MiniLM tokens fit 6 MiB, not 4,096.
    assert limit == 3071
    assert "direct event" in broken(direct(limit + 1))
    doc = json.loads(json.dumps(good))
    direct(limit)(doc)
    Plan.model_validate(doc)  # just under the limit: a valid plan
    assert "Express" in broken(express_too_long)


def test_workflow_and_objective(counts: Path, tmp_path: Path) -> None:
    express = _json(_plan(counts, tmp_path / "e.json", "--json"))
    standard = _json(_plan(counts, tmp_path / "s.json", "--workflow", "standard", "--json"))
    paper = _json(_plan(counts, tmp_path / "x.json", "--objective", "experts", "--json"))
    assert Plan.load(tmp_path / "e.json").workflow == "express" == express["workflow"]
    assert Plan.load(tmp_path / "s.json").workflow == "standard"
    assert Plan.load(tmp_path / "x.json").objective == "experts"
    # Standard bills state transitions; Express a request and its duration.
    assert standard["bill_usd"]["workflow_usd"] > express["bill_usd"]["workflow_usd"]
    # The paper's objective finds the cheapest expert functions, not the cheapest bill.
    assert paper["moe_cost_usd"] <= express["moe_cost_usd"] * (1 + 1e-9)
    assert paper["bill_usd"]["total_usd"] >= express["bill_usd"]["total_usd"] * (1 - 1e-9)
    bad = _plan(counts, tmp_path / "b.json", "--workflow", "lambda")
    assert bad.exit_code == 2 and "unknown --workflow" in bad.output


@pytest.mark.parametrize("method", ["pipelined", "s3", "direct"])
def test_a_plan_replayed_on_its_own_counts_reproduces_its_times_and_cost(
    counts: Path, tmp_path: Path, minilm: object, method: str
) -> None:
    from moe import describe_model
    from planner import choice_of, evaluate, function_seconds, instance_of

    _json(_plan(counts, tmp_path / "p.json", "--method", method, "--json"))
    plan = Plan.load(tmp_path / "p.json")
    planned = np.array([[e.tokens for e in layer.experts] for layer in plan.layers])
    inst = instance_of(plan, describe_model(minilm), planned, plan.totals.tokens)  # type: ignore[arg-type]
    choice = choice_of(plan, inst)
    seconds = function_seconds(inst, choice)
    for layer in plan.layers:
        for e in layer.experts:
            name = f"layer{layer.layer:02d}/expert{e.expert:02d}"
            assert seconds[name] == pytest.approx(e.time_s, rel=1e-9)
    ev = evaluate(inst, choice, plan.totals.slo_s)
    assert ev.feasible and ev.experts_usd == pytest.approx(plan.totals.moe_cost_usd, rel=1e-9)
    assert ev.latency == pytest.approx(plan.totals.latency_s, rel=1e-9)
    if method == "direct":  # the gate waits for the experts it invokes
        assert seconds["layer00"] > max(seconds[f"layer00/expert{e:02d}"] for e in range(4))


def test_a_plan_over_the_concurrency_quota_is_refused_and_not_written(
    counts: Path, tmp_path: Path
) -> None:
    """Reservations (every expert's max_replicas) plus Lambda's 100 unreserved must fit the
    account's quota, at plan time and again at synth time; the message names the numbers."""
    made = _plan(counts, tmp_path / "ok.json", "--json")
    assert made.exit_code == 0, made.output
    plan = Plan.load(tmp_path / "ok.json")
    reserved = plan.reserved_concurrency()
    assert reserved == sum(e.max_replicas for layer in plan.layers for e in layer.experts) > 0
    fits = _plan(counts, tmp_path / "edge.json", "--concurrency-quota", str(reserved + 100))
    assert fits.exit_code == 0, fits.output
    out = tmp_path / "over.json"
    over = _plan(counts, out, "--concurrency-quota", str(reserved + 99))
    assert over.exit_code == 2 and not out.exists()
    assert f"reserves {reserved:,} concurrent executions" in over.output
    assert "--no-reserve-concurrency" not in over.output  # plan has no such flag
    assert "--concurrency-quota" in over.output
    synth = runner.invoke(
        app,
        [
            "synth", "--plan", str(tmp_path / "ok.json"), "--out", str(tmp_path / "cdk.out"),
            "--concurrency-quota", str(reserved + 99), "--no-lint",
        ],
    )  # fmt: skip
    assert synth.exit_code == 2 and "concurrency quota" in synth.output
    assert "--no-reserve-concurrency" in synth.output  # synth can drop the reservations
    assert not (tmp_path / "cdk.out").exists()


def test_counts_with_a_distribution_plan_at_confidence_099_by_default(
    counts: Path, tmp_path: Path
) -> None:
    """The default Q is 0.99 when the counts carry a distribution; 0 is the point plan; a
    file without one cannot be planned at a confidence."""
    doc = PredictedCounts.load(counts)
    rng = np.random.default_rng(1)
    # Balanced enough that no expert gets more tokens than the batch has (quantiles stop there).
    mean = (rng.dirichlet(np.full(4, 20.0), size=6) * 20480).round(2)
    assert mean.max() < 10240
    widened = tmp_path / "dist.json"
    doc.model_copy(
        update={
            "counts": mean.tolist(),
            "std": (0.05 * mean + 5).round(3).tolist(),
            "model_error": [0.05] * 6,
            "residual_z": np.sort(rng.standard_t(4, size=200)).round(4).tolist(),
        }
    ).save(widened)
    point = _json(_plan(widened, tmp_path / "p0.json", "--confidence", "0", "--json"))
    slo = (point["latency_s"] + point["smallest_slo_s"]) / 2
    point = _json(
        _plan(
            widened,
            tmp_path / "p0.json",
            "--slo",
            str(slo),
            "--confidence",
            "0",
            "--force",
            "--json",
        )
    )
    assert point["confidence"] is None
    confident = _json(_plan(widened, tmp_path / "p1.json", "--slo", str(slo), "--json"))
    chosen = confident["confidence"]
    assert chosen["confidence"] == 0.99 and chosen["attainment_estimate"] >= 0.99
    assert chosen["quantile_level"] > 0.5 and confident["bill_usd"]["total_usd"] >= (
        point["bill_usd"]["total_usd"] * (1 - 1e-9)
    )
    assert Plan.load(tmp_path / "p1.json").counts_source["confidence"] == chosen
    refused = _plan(counts, tmp_path / "p2.json", "--confidence", "0.99")
    assert refused.exit_code == 2 and "distribution" in refused.output
    assert not (tmp_path / "p2.json").exists()
    bad = _plan(widened, tmp_path / "p3.json", "--confidence", "1")
    assert bad.exit_code == 2 and "not in [0, 1)" in bad.output
