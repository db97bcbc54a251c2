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


# F. Text the corpus reader refuses: the message names what is wrong with it (issue 52).


def test_a_one_line_fit_corpus_is_told_to_split_it(tmp_path: Path) -> None:
    """A file of one long line is one document, all of it held out: enough tokens, too few
    documents. Bringing more text would not help; splitting it into documents does."""
    from moe import load_corpus

    one = tmp_path / "one.txt"
    one.write_text(" ".join(" ".join(d.split()) for d in load_corpus("wiki").documents[:1200]))
    args = ["profile", "--fit-corpus", str(one), "--out", str(tmp_path / "t")]
    result = _refused(args, tmp_path, "in 1 document (lines reading)")
    text = " ".join(result.stderr.split())
    assert "split the text into documents" in text and "bring about" not in text


def test_a_corpus_directory_is_named_as_one(tmp_path: Path) -> None:
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("A document.\n")
    for flag in ("--corpus", "--fit-corpus"):
        args = ["profile", flag, str(texts), "--out", str(tmp_path / "t")]
        result = _refused(args, tmp_path, f"corpus path '{texts}' is a directory")
        text = " ".join(result.stderr.split())
        assert "does not exist" not in text and f"pass {flag} the path of one text" in text


# Faults a run-local cannot apply, and a fault name it does not know (issue 52).


def test_a_fault_the_plan_cannot_take_is_refused(tmp_path: Path) -> None:
    """expert-crash on a one-function plan (no expert function to crash) exits 2 before any
    work, naming the shape and the faults that do apply; before, the run went ahead, injected
    nothing and reported success."""
    from planner import load_calibration
    from planner.build import instance_for
    from planner.deployments import plan_driver_shape
    from tests.traffic.plans import counts_of, tiny_manifest

    manifest, cal = tiny_manifest(), load_calibration()
    base = instance_for(manifest, counts_of(2, 4, 2048), cal, tokens=2048)
    plan = plan_driver_shape("monolithic", base, manifest, cal, None, {"test": True})[0]
    path = plan.save(tmp_path / "one.json")
    out = tmp_path / "metrics.jsonl"
    args = ["run-local", "--plan", str(path), "--faults", "expert-crash=1.0"]
    result = _refused([*args, "--metrics-out", str(out)], tmp_path, "cannot apply")
    text = " ".join(result.stderr.split())
    assert "monolithic plan has no expert function" in text
    assert "--deployment driver" in text and "throttle" in text
    assert not out.exists()


def test_an_unknown_fault_is_named_with_the_known_ones(inputs: dict[str, Path]) -> None:
    args = ["run-local", "--plan", str(inputs["plan"]), "--faults", "foo=0.1"]
    result = _refused(args, inputs["plan"].parent, "unknown fault 'foo'")
    text = " ".join(result.stderr.split())
    assert "not a fault=rate item" not in text
    assert "throttle, s3-slowdown, expert-crash, duplicate" in text


# G. A new user's walk through the CLI, round two (issue 52): options the command would drop or
# ignore, input it would misread, and messages whose fix the command refuses.


def _reserving(inputs: dict[str, Path], path: Path, quota: int) -> Path:
    """The tiny plan with every expert function reserving 300 (its calibration's G raised):
    2,400 reserved, over the default quota of 1,000, and `quota` recorded."""
    doc = json.loads(inputs["plan"].read_text())
    doc["calibration"]["max_replicas"] = 300
    for layer in doc["layers"]:
        for expert in layer["experts"]:
            expert["max_replicas"] = 300
    doc["concurrency_quota"] = quota
    path.write_text(json.dumps(doc))
    return path


class _Synthesised(Exception):
    """Stands in for the CDK: reaching it means every check before the synthesis passed."""


def test_synth_checks_the_quota_the_plan_was_made_under(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan made with --concurrency-quota 100000 synthesises without the flag again; one over
    the quota it recorded is refused, naming it. Before, synth checked every plan against
    1,000 unless told again (and a plan recording its quota did not load)."""
    from ground.plan import Plan
    from planner import load_calibration
    from planner.api import PlanningCounts, PlanOptions, plan_deployment
    from tests.traffic.plans import counts_of, tiny_manifest

    planning = PlanningCounts(counts_of(2, 4, 2048), 2048, {"test": True})
    options = PlanOptions(concurrency_quota=100_000)
    planned = plan_deployment(tiny_manifest(), planning, load_calibration(), options=options)
    assert planned.plan.concurrency_quota == 100_000  # the plan records the quota it fits

    def build_app(*args: object, **kwargs: object) -> None:
        raise _Synthesised

    monkeypatch.setattr("cdk.app.build_app", build_app)
    large = _reserving(inputs, tmp_path / "large.json", 100_000)
    assert Plan.load(large).reserved_concurrency() == 2400
    synth = ["synth", "--plan", str(large), "--out", str(tmp_path / "cdk.out"), "--no-lint"]
    result = runner.invoke(app, synth)
    assert isinstance(result.exception, _Synthesised), (result.output, result.exception)
    _refused([*synth, "--concurrency-quota", "1000"], tmp_path, "quota of 1,000.")
    small = _reserving(inputs, tmp_path / "small.json", 2000)
    synth = ["synth", "--plan", str(small), "--out", str(tmp_path / "cdk.out"), "--no-lint"]
    _refused(synth, tmp_path, "quota of 2,000 (the one the plan was made under)")


STREAM = ["--traffic", "poisson:1", "--minutes", "10", "--out", "{tmp}/p.json"]
DROPPED = {
    "--deployment workflow --hardware gpu": (
        ["--deployment", "workflow", "--hardware", "gpu", "--slo-p99", "30"],
        "--deployment workflow with --hardware gpu",
        "pass --hardware cpu to plan the workflow deployment",
    ),
    "--deployment driver, GPU candidates by default": (
        ["--deployment", "driver", "--slo-p99", "30"],
        "--deployment driver with --hardware auto (the default)",
        "drop --deployment",
    ),
    "--tokens with --traffic": (
        ["--tokens", "1024", "--slo-p99", "30", "--hardware", "cpu"],
        "--tokens 1024 with --traffic: the stream's batching decides the batch size",
        "drop --tokens",
    ),
    "--hardware gpu for a generation": (
        ["--hardware", "gpu", "--slo-ttft", "5", "--slo-tpot", "1"],
        "not yet a decoder's generation (--slo-ttft, --slo-tpot)",
        "pass --hardware cpu to plan the generation on CPU functions, or drop --slo-ttft, "
        "--slo-tpot and pass --traffic SPEC --slo-p99 SECONDS",
    ),
}


@pytest.mark.parametrize("case", list(DROPPED))
def test_plan_refuses_an_option_the_stream_or_the_hardware_would_drop(
    case: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    """Before: the GPU-backed candidates ignored --deployment (a monolithic plan for `workflow`),
    a stream planned its own batch size over --tokens without a word, and --hardware gpu with a
    generation's SLOs suggested --slo-p99, which those SLOs refuse."""
    extra, says, fix = DROPPED[case]
    args = _args(["plan", "--counts", "{counts}", *STREAM, *extra], inputs, tmp=tmp_path)
    result = _refused(args, tmp_path, says)
    assert fix in " ".join(result.stderr.split("To fix:")[1].split())


def test_an_encoder_is_told_how_plan_takes_a_decoder() -> None:
    """`plan` has no --model: the fix names the decoder's routing traces (profile --model, then
    plan --traces) or a decoder's --shape."""
    from planner import load_calibration
    from planner.generation import generation_instance
    from tests.traffic.plans import tiny_manifest

    encoder = tiny_manifest()
    with pytest.raises(UsageError, match="is an encoder") as refused:
        generation_instance(encoder, np.full((2, 4), 0.5), load_calibration())
    fix = refused.value.fix or ""
    assert "(--model smollm2" not in fix
    assert "`moelambda profile --model smollm2 --out DIR`, then `plan --traces DIR`" in fix
    assert "`plan --shape mixtral`" in fix


def test_replan_refuses_metrics_of_another_model(tmp_path: Path) -> None:
    """Records of 2 layers for a 4-layer plan: another model's. Before, the 2 layers without a
    record counted as drifted (every share 0) and replan advised on them."""
    plan = tiny_plan(method="direct", tokens=2048, layers=4).save(tmp_path / "plan.json")
    metrics = _record_lines(tmp_path / "m.jsonl", 2, 4, {})
    args = ["replan", "--plan", str(plan), "--metrics", str(metrics)]
    result = _refused([*args, "--out", str(tmp_path / "new.json")], tmp_path, "of 2 of the plan")
    assert "4 layers, none of layers 2-3" in result.stderr
    from ground.plan import Plan
    from planner.drift import replan

    observed = np.zeros((4, 4))  # the API still takes a partial observation: no drift unseen
    observed[:2] = 5.0
    report, _ = replan(Plan.load(plan), observed)
    assert report["drift_per_layer"][2:] == [0.0, 0.0]


@pytest.fixture(scope="module")
def decoder_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A driver plan of a small decoder (no weights): Express, as its generation fits."""
    from planner import load_calibration
    from planner.api import PlanningCounts, PlanOptions, plan_deployment
    from tests.traffic.plans import counts_of, tiny_manifest

    manifest = tiny_manifest(4, 4, hidden=576).model_copy(
        update={"family": "decoder", "model": "smollm2", "model_type": "llama"}
    )
    model = {"model": "smollm2", "experts": 4, "top_k": 2, "seed": 0, "moefy": None}
    planning = PlanningCounts(counts_of(4, 4, 1024), 1024, {"test": True}, model)
    options = PlanOptions(deployment="driver", prompt_tokens=16, new_tokens=16, confidence=0.0)
    plan = plan_deployment(manifest, planning, load_calibration(), options=options).plan
    assert plan.workflow == "express" and plan.generation is not None
    return plan.save(tmp_path_factory.mktemp("decoder") / "plan.json")


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """These refusals come before the model loads: loading it fails the test."""

    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the request was refused")

    monkeypatch.setattr("moelambda.cli.generate.load_with_status", load)


def test_generate_holds_an_express_plan_to_its_duration(
    decoder_plan: Path, tmp_path: Path, no_model: None
) -> None:
    """A generation predicted between the Express limit (the calibration's, 300 s) and Lambda's
    900 s timeout is refused, naming the --max-new-tokens that fits; before, it started."""
    from ground.plan import Plan
    from planner.generation import plan_timing
    from planner.traffic.workflow import manifest_of_plan

    plan = Plan.load(decoder_plan)
    express = plan.calibration["express_max_duration_s"]
    assert express < plan.calibration["max_timeout_s"]
    manifest = manifest_of_plan(plan)

    def run_s(new_tokens: int) -> float:
        ttft, tpot = plan_timing(plan, manifest, [1], new_tokens)
        return ttft + (new_tokens - 1) * tpot

    ttft, tpot = plan_timing(plan, manifest, [1], 2)
    asked = int((2 * express - ttft) / tpot)  # runs about twice the Express limit
    assert express < run_s(asked) < plan.calibration["max_timeout_s"]
    args = ["generate", "--plan", str(decoder_plan), "--prompt", "Hi"]
    result = _refused([*args, "--max-new-tokens", str(asked)], tmp_path, "Express workflow's")
    text = " ".join(result.stderr.split())
    assert f"{express:g} s duration limit" in text
    fits = int(text.split("pass --max-new-tokens ")[1].split()[0].replace(",", ""))
    assert run_s(fits) <= express < run_s(fits + 1)
    assert "--workflow standard" in text


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--top-p", "0.5"], "--top-p 0.5 applies to sampling, and --temperature 0"),
        (["--stop", ""], '--stop "" is empty'),
    ],
)
def test_generate_refuses_an_option_it_would_ignore(
    extra: list[str], says: str, decoder_plan: Path, tmp_path: Path, no_model: None
) -> None:
    args = ["generate", "--plan", str(decoder_plan), "--prompt", "Hi", *extra]
    _refused(args, tmp_path, says)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"prompt": 5}', 'is an object whose "prompt" is the number 5, not text'),
        ('{"text": "Hello"}', 'is an object without "prompt" (its keys: "text")'),
        ('["Hello"]', "is a JSON array"),
    ],
)
def test_generate_refuses_a_prompts_line_it_would_misread(
    line: str, says: str, decoder_plan: Path, tmp_path: Path, no_model: None
) -> None:
    """Before, the raw line (`{"prompt": 5}`) was decoded as the prompt's text."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Fine."}\n\n' + line + "\n")
    args = ["generate", "--plan", str(decoder_plan), "--prompts", str(prompts)]
    result = _refused(args, tmp_path, f"--prompts {prompts}:3 {says}")
    assert '{"prompt": "TEXT"}' in result.stderr.split("To fix:")[1]
