"""Planning real-scale models by their shape: plan and bench planner end to end, and the limits
that bind at that scale named in the error."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ground.plan import Plan
from moelambda.cli import app

runner = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


def test_plan_a_shape_without_weights(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, text = _invoke(
        "plan",
        "--shape",
        "olmoe",
        "--tokens",
        "1024",
        "--popularity",
        "zipf:1.2",
        "--concurrency-quota",
        "100000",
        "--pack",
        "1",
        "--deployment",
        "workflow",
        "--out",
        str(out),
    )
    assert code == 0, text
    summary = json.loads(text)
    plan = Plan.load(out)
    assert summary["model"] == "OLMoE-1B-7B-0924" and len(plan.layers) == 16
    assert all(len(layer.experts) == 64 for layer in plan.layers)
    # 64 experts exceed a Map's 40 concurrent iterations: every layer fans out directly.
    assert {layer.method for layer in plan.layers} == {"direct"}
    assert plan.counts_source["synthetic"] is True and plan.counts_source["shape"]
    assert all(
        e.time_s <= plan.calibration["max_timeout_s"] for la in plan.layers for e in la.experts
    )
    code, text = _invoke("run-local", "--plan", str(out))
    assert code == 2 and "has no weights to run" in text


def test_the_binding_limits_are_named_and_packing_lifts_them(tmp_path: Path) -> None:
    """Unpacked, OLMoE at 10,240 tokens has no plan (64 experts: only direct fans out, and
    its events exceed 6 MB); packed, its functions fit an inline Map."""
    args = ["plan", "--shape", "olmoe", "--deployment", "workflow"]
    args += ["--out", str(tmp_path / "p.json")]
    large = ["--tokens", "10240", "--concurrency-quota", "100000"]
    code, text = _invoke(*args, *large, "--pack", "1")
    assert code == 2 and "exceed an inline Map's 40 concurrent iterations" in text
    assert "payload limit" in text
    code, text = _invoke(*args, "--tokens", "1024", "--pack", "1")
    assert code == 2 and "concurrency quota of 1,000" in text
    code, text = _invoke(*args, *large)
    assert code == 0, text
    summary = json.loads(text)
    assert summary["packing"][0] == {
        "experts_per_function": 1,
        "cost_usd": None,
        "why": summary["packing"][0]["why"],
    }
    assert "payload limit" in summary["packing"][0]["why"]
    k = summary["experts_per_function"]
    assert k > 1 and summary["functions"] == 16 * 64 // k
    plan = Plan.load(tmp_path / "p.json")
    assert all(len(e.hosted) == k for la in plan.layers for e in la.experts)
    (tmp_path / "p.json").unlink()
    code, text = _invoke("plan", "--shape", "gpt-moe-huge", "--out", str(tmp_path / "q.json"))
    assert code == 2 and "olmoe" in text.lower()
    assert not any(tmp_path.iterdir())


def test_bench_planner_on_a_shape() -> None:
    code, text = _invoke("bench", "planner", "--shape", "mixtral", "--tokens", "512")
    assert code == 0, text
    summary = json.loads(text)
    assert summary["instance"]["layers"] == 32 and summary["instance"]["experts"] == 8
    assert summary["exact_target_s"] == 5.0 and summary["exact_total_s"] > 0
    for entry in summary["slos"]:
        assert set(entry["solvers"]) == {"exact"}
        exact = entry["solvers"]["exact"]
        assert exact["feasible"] and exact["latency_s"] <= entry["slo_s"] * (1 + 1e-9)
