"""Bad traces, cluster shapes and options are refused before any replay: exit code 2, a
message naming the problem and its fix, no traceback (issue 25, item 5)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from moelambda.cli import app

HEADER = "job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration"
GOOD = "0,100,1000,bert,5000,64,1,300"


def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(app, ["cluster", "simulate", *args])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "Traceback" not in output and "To fix:" in output
    return output


@pytest.mark.parametrize(
    ("header", "row", "problem"),
    [
        (HEADER.replace(",ddl", ""), "0,100,1000,bert,64,1,300", "no 'ddl' column"),
        (HEADER, "0,100,lots,bert,5000,64,1,300", "iteration 'lots' is not a finite number"),
        (HEADER, "0,100,1000,bert,5000,64,-2,300", "num_gpu -2 is not a whole number"),
        (HEADER, "0,100,1000,bert,5000,64,0,300", "num_gpu 0 is not a whole number"),
        (HEADER, "0,100,1000,bert,50,64,1,300", "the deadline 50 is before the submission 100"),
        (HEADER, f"{GOOD}\n0,200,1000,bert,6000,64,1,300", "job id '0' is also on line 2"),
        (HEADER, "0,100,0,bert,5000,64,1,300", "iteration 0 is not positive"),
    ],
)
def test_a_malformed_trace_is_refused_naming_its_line(  # type: ignore[no-untyped-def]
    tmp_path, header: str, row: str, problem: str
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(f"{header}\n{row}\n")
    output = _refused(["--scheduler", "edf", "--trace", str(trace)])
    assert problem in output


@pytest.mark.parametrize(
    ("shape", "problem"), [("n0g4", "has 0 nodes of 4 GPUs"), ("n4g0", "has 4 nodes of 0 GPUs")]
)
def test_a_cluster_without_nodes_or_gpus_is_refused(shape: str, problem: str) -> None:
    assert problem in _refused(["--cluster", shape])


def test_a_job_the_scheduler_cannot_place_is_refused_before_the_replay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "odd.csv"
    trace.write_text(f"{HEADER}\n0,100,1000,bert,5000,64,3,300\n1,100,1000,bert,5000,64,9,300\n")
    assert "job 0 asks for 3 GPUs; Gandiva places" in _refused(
        ["--scheduler", "gandiva", "--trace", str(trace)]
    )
    assert "job 1 asks for 9 GPUs; the cluster has 8" in _refused(
        ["--scheduler", "tiresias", "--trace", str(trace), "--cluster", "n2g4"]
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--scheduler", "tiresias", "--gpu-type", "A100"], "--gpu-type is not used by tiresias"),
        (["--scheduler", "gandiva", "--gpu-type", "T4"], "--gpu-type is not used by gandiva"),
        (["--scheduler", "rubick", "--gpu-type", "A100"], "--gpu-type is not used by rubick"),
        (["--scheduler", "elasticflow", "--gpu-plan", "p.json"], "--gpu-plan is not used by"),
        (["--scheduler", "edf", "--days", "2"], "--days is not used by edf"),
        (["--scheduler", "lyra", "--slot", "30"], "--slot is not used by lyra"),
        (["--scheduler", "lyra", "--cluster", "n16g4"], "--cluster is not used by lyra"),
    ],
)
def test_an_option_the_scheduler_does_not_use_is_refused(args: list[str], option: str) -> None:
    assert option in _refused(args)


def test_compare_accepts_an_option_one_of_its_schedulers_uses() -> None:
    """`--gpu-type` applies to ElasticFlow and EDF in a comparison with Tiresias; alone with
    schedulers that ignore it, it is refused."""
    runner = CliRunner()
    args = ["cluster", "compare", "--schedulers", "edf,tiresias", "--gpu-type", "T4", "--json"]
    assert runner.invoke(app, args).exit_code == 0
    refused = runner.invoke(app, [*args[:3], "tiresias,gandiva", *args[4:]])
    assert refused.exit_code == 2 and "--gpu-type is not used" in refused.output


def _refused_by(command: list[str]) -> str:
    result = CliRunner().invoke(app, command)
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "Traceback" not in output and "error:" in output and "To fix:" in output
    return output


@pytest.mark.parametrize(
    "command",
    [
        ["cluster", "simulate", "--scheduler", "lyra", "--jobs", "0"],
        ["cluster", "compare", "--schedulers", "lyra,lyra-gandiva", "--jobs", "0"],
        ["bench", "lyra", "--jobs", "0"],
    ],
)
def test_jobs_below_one_is_refused_as_the_option_is_spelled(command: list[str]) -> None:
    """Issue 37: `--jobs 0` said "pass e.g. jobs=50000", the Python keyword, not the option;
    and it was refused only after the replay's progress had started."""
    output = _refused_by(command)
    assert "--jobs 0 is below 1" in output and "pass --jobs N with N >= 1" in output
    assert "jobs=" not in output and "0/" not in output  # no keyword, no progress line


def test_days_that_are_not_positive_are_refused_as_the_option_is_spelled() -> None:
    output = _refused_by(["cluster", "simulate", "--scheduler", "lyra", "--days", "0"])
    assert "--days 0 is not positive" in output and "pass --days D with D > 0" in output
    assert "days=" not in output


def test_a_serverless_plan_given_as_gpu_plan_names_gpu_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: a serverless plan given to `cluster simulate --gpu-plan` was refused as
    "--plan takes a GPU plan"; the hint names --gpu-plan and the file it takes."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"solver": "milp", "layers": [], "totals": {}}')  # `moelambda plan`'s keys
    output = _refused_by(
        ["cluster", "simulate", "--scheduler", "lyra", "--gpu-plan", str(plan), "--peak-rps", "20"]
    )
    assert "is a serverless plan" in output
    assert "but --gpu-plan takes a GPU plan (from `moelambda gpu-plan`)" in output
    assert "for --gpu-plan, give a GPU plan" in output and "--plan takes" not in output


def test_peak_rps_without_a_gpu_plan_is_refused() -> None:
    output = _refused_by(["cluster", "simulate", "--scheduler", "lyra", "--peak-rps", "20"])
    assert "no --gpu-plan was given" in output and "add --gpu-plan FILE" in output


def test_a_file_of_another_kind_given_as_cluster_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A serverless plan or a binary file given as `cluster simulate --cluster` was parsed as a
    cluster-spec CSV: a misleading message, or a UnicodeDecodeError traceback."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"solver": "milp", "layers": [], "totals": {}}')
    output = _refused(["--cluster", str(plan)])
    assert "is a serverless plan" in output and "--cluster takes a shape like n16g4" in output
    binary = tmp_path / "spec.csv"
    binary.write_bytes(b"num_switch\xff\xfe\x00\x82\n")
    assert "cannot read the cluster spec" in _refused(["--cluster", str(binary)])
