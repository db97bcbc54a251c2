"""The GPU commands end to end on a real (short) MiniLM trace: JSON contracts, the plan file,
consistency between schedulers, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu.plan import GpuPlan
from moelambda.cli import app

runner = CliRunner()


def _run(*args: str, code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if code == 0 else {"output": result.output}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu")
    out = {}
    for name, seed, tokens in (("a", "0", "2560"), ("b", "1", "640")):
        out[name] = root / name
        args = ["--experts", "4", "--tokens", tokens, "--seed", seed, "--out", str(out[name])]
        _run("profile", *args)
    return out


def test_gpu_plan_every_scheduler(traces: dict[str, Path], tmp_path: Path) -> None:
    results = {}
    for scheduler in ("aurora", "vanilla", "lina"):
        out = tmp_path / f"{scheduler}.json"
        summary = _run(
            "gpu-plan",
            "--traces",
            str(traces["a"]),
            "--gpus",
            "4",
            "--scheduler",
            scheduler,
            "--out",
            str(out),
        )
        plan = GpuPlan.load(out)
        assert summary["scheduler"] == scheduler and summary["gpus"] == 4 == plan.gpus
        assert len(summary["layers"]) == 6 == len(plan.layers)
        for row in summary["layers"]:
            assert row["a2a_s"] >= row["lower_bound_s"] * (1 - 1e-9) > 0
            assert row["layer_s"] > row["a2a_s"]
            assert sorted(e for gpu in row["placement"] for e, _ in gpu) == (
                [0, 1, 2, 3]
                if scheduler != "lina"
                else sorted(e for gpu in row["placement"] for e, _ in gpu)
            )
        assert summary["total_s"] == pytest.approx(plan.total_s)
        results[scheduler] = summary
    aurora = results["aurora"]["layers"]
    assert all(row["a2a_s"] == pytest.approx(row["lower_bound_s"]) for row in aurora)
    assert all(row["a2a_rounds"] >= 1 for row in aurora)
    assert results["aurora"]["total_s"] < results["vanilla"]["total_s"]
    lina = results["lina"]["lina"]
    assert 0 < lina["path_persistence"]["k1"] <= lina["path_persistence"]["k2"] <= 1
    assert set(lina["reschedule_rate"]) == {"lina-path", "bayes-pos-soft"}
    for balance in lina["busiest_gpu_over_mean"].values():
        assert balance["static"] >= balance["two_phase"] >= 1  # Lina never balances worse


def test_gpu_plan_colocation(traces: dict[str, Path], tmp_path: Path) -> None:
    summary = _run(
        "gpu-plan",
        "--traces",
        str(traces["a"]),
        "--gpus",
        "4",
        "--colocate",
        str(traces["b"]),
        "--out",
        str(tmp_path / "p.json"),
    )
    for layer in summary["colocate"]["layers"]:
        assert sorted(layer["pairing"]) == [0, 1, 2, 3] == layer["gpu_of_pair"]
        # Theorem 6.1: on identical GPUs the bottleneck pairing gives the shortest cycle.
        assert 0 < layer["cycle_s"] <= layer["same_index_cycle_s"] * (1 + 1e-9)


def test_gpu_plan_errors(traces: dict[str, Path], tmp_path: Path) -> None:
    out = _run(
        "gpu-plan",
        "--traces",
        str(traces["a"]),
        "--gpus",
        "3",
        "--out",
        str(tmp_path / "x"),
        code=2,
    )["output"]
    assert "one expert per GPU" in out and "--gpus 4" in out
    out = _run(
        "gpu-plan",
        "--traces",
        str(traces["a"]),
        "--gpus",
        "4",
        "--scheduler",
        "magic",
        "--out",
        str(tmp_path / "y"),
        code=2,
    )["output"]
    assert "unknown --scheduler" in out
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_gpu_plan_refuses_a_serverless_plan_as_cluster(
    traces: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 37: `gpu-plan --cluster out/plan.json` dumped 17 pydantic errors."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"solver": "milp", "layers": [], "totals": {}}))
    out = tmp_path / "g.json"
    args = ["gpu-plan", "--traces", str(traces["a"]), "--gpus", "4", "--cluster", str(plan)]
    output = _run(*args, "--out", str(out), code=2)["output"]
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[0].startswith(f"error: '{plan}' is a serverless plan") and len(lines) == 2
    assert "--cluster takes a JSON file of GPU groups" in lines[0]
    assert lines[1].startswith("To fix: pass it as --plan to `moelambda synth`")
    assert "Traceback" not in output and not out.exists()


def test_compare(traces: dict[str, Path], tmp_path: Path) -> None:
    counts = tmp_path / "counts.json"
    _run(
        "predict",
        "--traces",
        str(traces["a"]),
        "--eval-tokens",
        "640",
        "--counts-out",
        str(counts),
    )
    plot = tmp_path / "compare.png"
    summary = _run(
        "compare", "--counts", str(counts), "--slo", "60", "--rps", "0.5", "--plot", str(plot)
    )
    assert plot.stat().st_size > 0 and summary["plot"] == str(plot)
    lam, gpu = summary["serverless"], summary["gpu"]
    assert lam["cost_per_million_tokens_usd"] > 0 and lam["latency_s"] <= 60
    assert gpu["latency_s"] <= 60 and gpu["gpus"] >= 1 and gpu["copies"] == 1
    rate = summary["breakeven_rps"]
    assert rate is not None
    # Below the break-even rate the GPUs cost more per token than Lambda, above it less.
    slower = _run("compare", "--counts", str(counts), "--slo", "60", "--rps", str(rate / 2))
    faster = _run("compare", "--counts", str(counts), "--slo", "60", "--rps", str(rate * 2))
    assert slower["gpu"]["cost_per_million_tokens_usd"] > lam["cost_per_million_tokens_usd"]
    assert faster["gpu"]["cost_per_million_tokens_usd"] < lam["cost_per_million_tokens_usd"]
