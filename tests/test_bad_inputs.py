"""A new user's bad inputs (issue 37): every one exits 2 with an `error:` and a `To fix:` line,
no traceback, nothing written, and before any slow work (no model is loaded here); a stream the
simulator only partly serves says why in words."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from functions.metrics import emit, expert_counts_record
from ground.errors import UsageError
from ground.files import write_atomically, write_file_atomically
from moelambda.cli import app
from predictor import PredictedCounts
from tests.traffic.plans import tiny_plan

runner = CliRunner()
BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe"  # the start of a PNG: not UTF-8 text


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A plan (the tiny model's, no weights), MiniLM counts, metrics for the plan, and a binary
    file: everything a command reads before it would load a model."""
    root = tmp_path_factory.mktemp("inputs")
    plan = tiny_plan(method="direct", tokens=2048)
    plan.save(root / "plan.json")
    shares = np.random.default_rng(0).dirichlet(np.full(4, 0.8), size=6)
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=10240,
        method="test",
        counts=(shares * 20480).round(2).tolist(),
    ).save(root / "counts.json")
    metrics = root / "metrics.jsonl"
    for layer in range(plan.model.num_layers):
        emit(expert_counts_record(layer, np.full(plan.model.experts, 5), "r0"), str(metrics))
    (root / "binary.csv").write_bytes(BINARY)
    return {
        "plan": root / "plan.json",
        "counts": root / "counts.json",
        "metrics": metrics,
        "binary": root / "binary.csv",
    }


def _args(template: list[str], inputs: dict[str, Path], **more: Path) -> list[str]:
    """`template` with {plan}, {counts}, {metrics}, {binary} and `more` filled in."""
    values = {k: str(v) for k, v in (inputs | more).items()}
    return [arg.format(**values) for arg in template]


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(args: list[str], where: Path, says: str) -> Result:
    """Run `args`; check exit 2, the error and fix lines, no traceback, `where` unchanged."""
    before = _files(where)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert "error:" in result.stderr and "To fix:" in result.stderr, (args, result.stderr)
    assert says in result.stderr, (args, result.stderr)
    assert "Traceback" not in result.output
    assert _files(where) == before, args  # nothing written, nothing changed
    return result


# A. An output path that cannot be written: refused before any work, naming the path.

OUTPUTS = {
    "plan --out": ["plan", "--counts", "{counts}", "--out", "{blocked}/x.json"],
    "plan --traffic --out": [
        "plan", "--counts", "{counts}", "--traffic", "azure-conv", "--slo-p99", "15",
        "--scale", "0.01", "--hours", "1", "--out", "{blocked}/x.json",
    ],
    "plan --pareto": [
        "plan", "--counts", "{counts}", "--out", "{tmp}/ok.json", "--pareto", "{blocked}/p.csv",
    ],
    "choose --out": ["choose", "--min-cosine", "0.9", "--out", "{blocked}/sub"],
    "replan --out": [
        "replan", "--plan", "{plan}", "--metrics", "{metrics}", "--out", "{blocked}/n.json",
    ],
    "gpu-plan --out": ["gpu-plan", "--gpus", "8", "--traces", "{tmp}/t", "--out", "{blocked}/g"],
    "cluster compare --plot": [
        "cluster", "compare", "--schedulers", "elasticflow,edf", "--plot", "{blocked}/x.png",
    ],
    "compare --plot": [
        "compare", "--rps", "1", "--counts", "{counts}", "--slo", "30", "--plot", "{blocked}/c",
    ],
    "predict --counts-out": ["predict", "--traces", "{tmp}/t", "--counts-out", "{blocked}/c"],
    "predict --plot": ["predict", "--traces", "{tmp}/t", "--plot", "{blocked}/p.png"],
    "predict --tables-out": ["predict", "--traces", "{tmp}/t", "--tables-out", "{blocked}/t"],
    "backtest --plot": ["backtest", "--traces", "{tmp}/t", "--plot", "{blocked}/b.png"],
    "bench shapes --plot": ["bench", "shapes", "--plot", "{blocked}/s.png"],
    "bench traffic --plot": ["bench", "traffic", "--counts", "{counts}", "--plot", "{blocked}/t"],
    "profile --out": ["profile", "--out", "{blocked}/trace"],
    "export --out": ["export", "--out", "{blocked}/weights"],
    "synth --out": ["synth", "--plan", "{plan}", "--out", "{blocked}/cdk.out"],
    "run-local --metrics-out": ["run-local", "--plan", "{plan}", "--metrics-out", "{blocked}/m"],
    "calibrate --out": ["calibrate", "--out", "{blocked}/cal.json"],
    "calibrate --cold --out": ["calibrate", "--cold", "--out", "{blocked}/cal.json"],
}  # fmt: skip


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_an_output_under_a_file_is_refused_before_any_work(
    case: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    blocked = tmp_path / "README.md"  # a file where a directory would have to be
    blocked.write_text("# a file, not a directory\n")
    args = _args(OUTPUTS[case], inputs, blocked=blocked, tmp=tmp_path)
    result = _refused(args, tmp_path, "cannot be written")
    assert f"'{blocked}' is a file, not a directory" in result.stderr
    template = OUTPUTS[case]
    flag = next(f for f, v in zip(template, template[1:], strict=False) if "{blocked}" in v)
    assert flag in result.stderr.split("To fix:")[1]  # the fix names the option to change


def test_an_existing_file_output_is_refused_as_a_directory_would_be(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "dir.json").mkdir()
    _refused(
        ["plan", "--counts", str(inputs["counts"]), "--out", str(tmp_path / "dir.json")],
        tmp_path,
        "is a directory",
    )
    (tmp_path / "kept.json").write_text("precious")
    _refused(
        ["replan", "--plan", str(inputs["plan"]), "--metrics", str(inputs["metrics"])]
        + ["--out", str(tmp_path / "kept.json")],
        tmp_path,
        "already exists",
    )


def test_a_failed_write_is_an_error_naming_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(UsageError, match="is a file, not a directory"):
        write_file_atomically(blocked / "x.json", lambda tmp: tmp.write_text("{}"), force=False)
    with pytest.raises(UsageError, match="is a file, not a directory"):
        write_atomically(blocked / "d", lambda tmp: None, force=False)

    def full(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "sub" / "plan.json"
    with pytest.raises(UsageError, match=r"cannot write .*plan\.json': No space left on device"):
        write_file_atomically(out, full, force=False)
    with pytest.raises(UsageError, match="No space left on device"):
        write_atomically(tmp_path / "dir", full, force=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file", "sub"]  # no temporary left


# B. A file that is not UTF-8 text: the file is named, and what it must be.


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["traffic", "--plan", "{plan}", "--traffic", "{binary}"], "is not UTF-8 text"),
        (["replan", "--plan", "{plan}", "--metrics", "{binary}"], "is not UTF-8 text"),
        (
            ["plan", "--counts", "{counts}", "--traffic", "{binary}", "--slo-p99", "10"]
            + ["--out", "{tmp}/p.json"],
            "is not UTF-8 text",
        ),
        (["run-local", "--plan", "{plan}", "--traffic", "{binary}"], "is not UTF-8 text"),
    ],
)
def test_a_binary_input_file_is_named(
    args: list[str], says: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    result = _refused(_args(args, inputs, tmp=tmp_path), tmp_path, says)
    assert str(inputs["binary"]) in result.stderr and "0x89" in result.stderr
    assert "CSV" in result.stderr or "JSON lines" in result.stderr


# C. The period and the stream are bounded before anything is drawn or simulated.


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["traffic", "--traffic", "azure-conv", "--hours", "100000"], "--hours 100000 is longer"),
        (["traffic", "--traffic", "azure-conv", "--minutes", "100000"], "--minutes 100000"),
        (["traffic", "--traffic", "azure-conv", "--hours", "745"], "744 hours (31 days)"),
        (["traffic", "--traffic", "azure-conv", "--scale", "1000", "--hours", "24"], "20,000,000"),
        (["traffic", "--traffic", "poisson:1e9", "--hours", "1"], "at most 20,000,000"),
        (["traffic", "--traffic", "diurnal:1e9,1", "--hours", "1"], "at most 20,000,000"),
        (["run-local", "--traffic", "azure-conv", "--hours", "100000"], "--hours 100000"),
        (
            ["plan", "--counts", "{counts}", "--traffic", "azure-conv", "--slo-p99", "15"]
            + ["--hours", "1000", "--out", "{tmp}/p.json"],
            "744 hours",
        ),
    ],
)
def test_the_period_and_the_requests_are_bounded(
    args: list[str], says: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    args = _args(args, inputs, tmp=tmp_path)
    if args[0] in ("traffic", "run-local"):
        args += ["--plan", str(inputs["plan"])]
    _refused(args, tmp_path, says)


# D. Contradictory or out-of-range values.


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["run-local", "--plan", "{plan}", "--front-door", "4", "--traffic", "azure-conv"]
            + ["--minutes", "1"],
            "not both",
        ),
        (["run-local", "--plan", "{plan}", "--front-door", "2", "--tokens", "0"], "--tokens 0"),
        (["run-local", "--plan", "{plan}", "--front-door", "2", "--max-tokens", "1"], "--max"),
        (["run-local", "--plan", "{plan}", "--front-door", "1", "--text", " "], "--text is empty"),
        (
            ["run-local", "--plan", "{plan}", "--front-door", "2", "--hours", "1"],
            "needs --traffic",
        ),
        (["traffic", "--plan", "{plan}", "--traffic", "poisson:1", "--slo", "-1"], "--slo -1"),
        (["traffic", "--plan", "{plan}", "--traffic", "poisson:1", "--slo", "0"], "--slo 0"),
        (
            ["plan", "--counts", "{counts}", "--traffic", "poisson:1", "--slo-p99", "-1"]
            + ["--out", "{tmp}/p.json"],
            "--slo-p99 -1 is not positive",
        ),
        (
            ["plan", "--counts", "{counts}", "--slo-ttft", "-1", "--slo-tpot", "5"]
            + ["--out", "{tmp}/p.json"],
            "--slo-ttft -1 is not positive",
        ),
        (
            ["plan", "--counts", "{counts}", "--slo-ttft", "100", "--slo-tpot", "0"]
            + ["--out", "{tmp}/p.json"],
            "--slo-tpot 0 is not positive",
        ),
        (
            ["plan", "--counts", "{counts}", "--slo-ttft", "100", "--new-tokens", "0"]
            + ["--out", "{tmp}/p.json"],
            "--new-tokens 0 is not positive",
        ),
        (
            ["bench", "traffic", "--counts", "{counts}", "--slo-p99", "-1", "--plot", "{tmp}/t"],
            "--slo-p99 -1",
        ),
        (
            ["bench", "traffic", "--counts", "{counts}", "--rates", "0", "--plot", "{tmp}/t"],
            "--rates 0",
        ),
    ],
)
def test_contradictory_or_out_of_range_values_are_refused(
    args: list[str], says: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    _refused(_args(args, inputs, tmp=tmp_path), tmp_path, says)


def _record_lines(path: Path, layers: int, experts: int, change: dict[str, object]) -> Path:
    lines = []
    for layer in range(layers):
        record = expert_counts_record(layer, np.full(experts, 5), "r0")
        if layer == 1:
            record |= change
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"Expert02Tokens": [-7.0]}, "Expert02Tokens of layer 1 is -7; a token count is 0"),
        ({"Expert02Tokens": -1}, "is -1; a token count is 0 or more"),
        ({"Expert00Tokens": ["many"]}, "line 2 is a routing record that does not parse"),
        ({"Layer": "one"}, "line 2 is a routing record that does not parse"),
    ],
)
def test_replan_refuses_negative_or_malformed_counts(
    change: dict[str, object], says: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    plan = json.loads(inputs["plan"].read_text())["model"]
    metrics = _record_lines(tmp_path / "m.jsonl", plan["num_layers"], plan["experts"], change)
    args = ["replan", "--plan", str(inputs["plan"]), "--metrics", str(metrics)]
    _refused([*args, "--out", str(tmp_path / "new.json")], tmp_path, says)


# E. Requests the plan does not serve: the latency is unbounded, and the reason is said.


def test_a_refused_batch_is_explained(inputs: dict[str, Path], tmp_path: Path) -> None:
    stream = tmp_path / "stream.csv"  # the second request is larger than the plan serves
    stream.write_text("time_s,tokens\n0,1000\n1,1000000\n")
    args = ["traffic", "--plan", str(inputs["plan"]), "--traffic", str(stream)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "refused s" not in text and "p99 unbounded" in text
    summary = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    largest = summary["largest_batch_served"]
    assert summary["refused_batches"] == 1 and 1000 < largest < 1_000_000
    assert f"Refused: 1 of 2 batches held more than the {largest:,} tokens" in text
    assert "max_replicas" in text and "moelambda plan --traffic" in text


def test_a_failed_batch_is_explained(inputs: dict[str, Path]) -> None:
    from moelambda.cli import _render_traffic

    args = ["traffic", "--plan", str(inputs["plan"]), "--traffic", "poisson:1", "--minutes", "1"]
    summary = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    summary["failed_batches"] = 5
    summary["latency_s"] = dict.fromkeys(summary["latency_s"])
    summary["reserved_concurrency_reached"] = {
        f"layer00/expert0{e}": {"peak": 8, "reserved": 8} for e in range(4)
    }
    console = Console(record=True, width=300)
    _render_traffic.traffic(console, summary)
    text = console.export_text()
    assert "latency p50 unbounded, p95 unbounded" in text
    assert f"Failed: 5 of {summary['batches']:,} batches were still throttled" in text
    assert "layer00/expert00 8 of 8" in text and "and 1 more" in text
    assert "--no-reserve-concurrency" in text


def test_a_huge_request_costs_no_memory_beyond_what_the_plan_serves() -> None:
    """The replica table stops at the largest batch served: a 100,000,000-token request in a
    stream would otherwise ask for gigabytes (8 bytes per function per token)."""
    from planner.traffic.workflow import workflow_model

    model = workflow_model(tiny_plan(method="direct", tokens=2048), 1_000_000)
    assert model.feasible_tokens < 1_000_000
    assert model.replicas.shape[0] == model.feasible_tokens + 1


def test_a_non_utf8_calibration_file_is_named(tmp_path: Path) -> None:
    from ground.errors import CalibrationError
    from planner.calibration import load_calibration

    binary = tmp_path / "b.json"
    binary.write_bytes(b"\x89PNG\r\n")
    with pytest.raises(CalibrationError, match="not UTF-8 text") as refused:
        load_calibration(binary)
    assert "calibrate --out" in (refused.value.fix or "")
