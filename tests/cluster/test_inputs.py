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
