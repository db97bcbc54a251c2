"""Output for people and machines: each command prints a readable summary without `--json`
(not JSON, its key words present, tables not cut when piped) and exactly one JSON object with
it; progress on a stderr that is not a terminal is plain lines with the seconds elapsed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from moelambda.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _width_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check what a command prints when piped with no width given; pytest-xdist's
    workers set $COLUMNS to 80 (and $LINES), which the commands honour as a width the user
    set."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def _run(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def _both_ways(args: list[str], words: list[str], json_args: list[str] | None = None) -> dict:
    """Run `args` without and with --json (`json_args`, default the same arguments); check the
    summary's `words` and the one JSON object, which is returned."""
    readable = _run(*args).stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(readable)
    text = " ".join(readable.split())
    for word in words:
        assert word in text, (word, readable)
    assert "…" not in readable  # nothing cut to fit 80 columns
    machine = _run(*(args if json_args is None else json_args), "--json").stdout
    document = json.loads(machine)  # the whole of stdout: exactly one JSON value
    assert isinstance(document, dict) and machine.strip().startswith("{")
    return document


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("output") / "trace"
    _run("profile", "--experts", "4", "--tokens", "1280", "--out", str(out), "--json")
    return out


@pytest.fixture(scope="module")
def counts(trace: Path) -> Path:
    path = trace.parent / "counts.json"
    _run("predict", "--traces", str(trace), "--eval-tokens", "640", "--counts-out", str(path))
    return path


def test_calibration() -> None:
    _both_ways(["calibration"], ["max_replicas"])


def test_gpu_plan(trace: Path, tmp_path: Path) -> None:
    args = ["gpu-plan", "--traces", str(trace), "--gpus", "4", "--out"]
    summary = _both_ways(
        [*args, str(tmp_path / "a.json")],
        ["GPU plan (aurora)", "a2a rounds", "per million tokens", "Wrote"],
        [*args, str(tmp_path / "b.json")],
    )
    assert summary["scheduler"] == "aurora" and len(summary["layers"]) == 6


def test_compare(counts: Path) -> None:
    summary = _both_ways(
        ["compare", "--counts", str(counts), "--slo", "60", "--rps", "0.5"],
        ["Serverless or GPU", "(cheapest plan)", "Lambda workflow", "GPU (cheapest at", "break"],
    )
    assert summary["gpu"]["latency_s"] <= 60


def test_plan_and_its_pareto_plot(counts: Path, tmp_path: Path) -> None:
    args = ["plan", "--counts", str(counts), "--slo", "30", "--force", "--out"]
    pareto = tmp_path / "pareto.csv"
    summary = _both_ways(
        [*args, str(tmp_path / "a.json"), "--pareto", str(pareto)],
        ["Plan for minilm", "memory MB", "full bill", "pareto.png"],
        [*args, str(tmp_path / "b.json")],
    )
    assert summary["latency_s"] <= 30
    assert pareto.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_bench_predictor_and_gpu(trace: Path) -> None:
    _both_ways(
        ["bench", "predictor", "--traces", str(trace), "--batches", "2", "--predict-batches", "1"],
        ["bench predictor", "build tables", "predict", "Meets the targets"],
    )
    summary = _both_ways(
        ["bench", "gpu", "--traces", str(trace), "--samples", "3"],
        ["Aurora's checks", "BvN makespan", "One all-to-all on layer 0", "aurora"],
    )
    assert summary["bvn_makespan_equals_bound"]


def test_cluster_commands() -> None:
    naive = ["--trace", "naive"]
    summary = _both_ways(
        ["cluster", "simulate", "--scheduler", "rubick", *naive],
        ["cluster simulate: rubick", "average JCT", "GPU utilisation", "wall time"],
    )
    assert summary["jobs"] == 10
    compared = _both_ways(
        ["cluster", "compare", "--schedulers", "rubick,rubick-e", *naive],
        ["naive on n8g8", "rubick-e", "avg JCT h", "GPU util.", "wall s"],
    )
    assert [r["scheduler"] for r in compared["results"]] == ["rubick", "rubick-e"]
    lyra = _both_ways(
        ["bench", "lyra", "--days", "1", "--jobs", "300"],
        ["Lyra vs baseline", "as built", "lead"],
    )
    assert len(lyra["rows"]) == 7


def test_piped_tables_are_full_width() -> None:
    """The compare table is wider than 80 columns; piped, no line of it is cut or folded."""
    stdout = _run("cluster", "compare", "--schedulers", "rubick,rubick-e", "--trace", "naive")
    lines = stdout.stdout.splitlines()
    header = next(line for line in lines if "scheduler" in line)
    assert len(header) > 80 and "wall s" in header


def test_piped_help_is_not_cut_to_80_columns() -> None:
    """`moelambda plan --help | cat`: the help is wider than 80 columns, so the docstring's
    lines stay whole and each option's help is on fewer lines."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    done = subprocess.run(
        [sys.executable, "-c", "from moelambda.cli import main; main()", "plan", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) > 80
    long = "per MoE layer a scatter-gather method and pipeline degree, per expert"  # 70+ chars
    assert any(long in line and len(line) > 80 for line in lines)
    assert "--concurrency-quota" in done.stdout and "…" not in done.stdout


def test_progress_is_plain_lines_with_elapsed_time() -> None:
    result = _run("cluster", "simulate", "--scheduler", "rubick", "--trace", "naive", "--json")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("[") and " s] " in line for line in lines), lines
    assert any("rubick on naive" in line for line in lines)


def test_bench_cluster_and_profiler() -> None:
    summary = _both_ways(
        ["bench", "cluster", "--schedulers", "rubick"],
        ["bench cluster: the other families", "rubick", "workload-base", "avg JCT s"],
    )
    assert list(summary["others"]) == ["rubick"] and summary["runs"] == []
    profiled = _both_ways(
        ["bench", "profiler", "--tokens", "512", "--repeats", "1"],
        ["bench profiler: minilm", "tokens/s (median)", "meets the target"],
    )
    assert profiled["tokens"] == 512


def _rendered(render, summary: dict) -> str:  # type: ignore[no-untyped-def]
    from io import StringIO

    from rich.console import Console

    buffer = StringIO()
    render(Console(file=buffer, width=200), summary)
    return " ".join(buffer.getvalue().split())


def test_slow_commands_summaries() -> None:
    """run-gpu (torch.distributed processes) and bench planner (a paper-scale instance) are too
    slow to run here twice: their renderers on summaries of the shape they print."""
    from moelambda.cli import _render, _render_gpu

    run = {
        "status": "SUCCEEDED",
        "backend": "gloo",
        "gpus": 4,
        "tokens": 1024,
        "max_abs_diff_vs_monolithic": 3e-6,
        "a2a_seconds": {"planned": 0.01, "baseline": 0.02},
        "layer_seconds": [0.1, 0.2],
        "error": None,
    }
    text = _rendered(_render_gpu.run_gpu, run)
    assert "SUCCEEDED" in text and "all-to-all s (planned)" in text and "3e-06" in text
    solver = {"seconds": 0.01, "feasible": True, "cost_usd": 2e-5, "latency_s": 1.0}
    entry = {
        "label": "loose",
        "slo_s": 1.5,
        "solvers": {"exact": solver, "ods": solver, "milp": {**solver, "optimal": True}},
        "packed": {"experts_per_function": 2, "cost_usd": 1e-5, "by_size": {}, "seconds": 0.1},
    }
    planner = {
        "instance": {"layers": 12, "experts": 16, "tokens": 10240},
        "frontier_points": 300,
        "slos": [entry],
        "exact_total_s": 0.1,
        "exact_target_s": 0.25,
        "packed_total_s": 0.3,
        "packed_never_worse": True,
        "ods_total_s": 3.0,
        "exact_speedup_vs_ods": 30.0,
        "speedup_target": 20.0,
        "paper_ods_s": 2.27,
    }
    text = _rendered(_render.bench_planner, planner)
    for word in ("12 layers x 16 experts", "loose (1.500 s)", "milp", "packed", "30x faster"):
        assert word in text, (word, text)
