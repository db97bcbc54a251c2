"""`moelambda backtest`: every policy served on held-out batches of a real MiniLM trace; the
oracle never misses the SLO, the confidence policy at Q = 0 is the point plan, bad input
exits 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelambda.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("backtest") / "trace"
    result = runner.invoke(app, ["profile", "--tokens", "5120", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out


def _backtest(traces: Path, *extra: str) -> dict:
    args = ["backtest", "--traces", str(traces), "--tokens", "512", "--batches", "4", "--json"]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_policy_is_served_and_the_oracle_never_misses(traces: Path, tmp_path: Path) -> None:
    plot = tmp_path / "q.png"
    summary = _backtest(traces, "--confidence", "0.9", "--plot", str(plot))
    assert summary["tokens"] == 512 and summary["batches"] == 4 and summary["slo_s"] > 0
    assert summary["pool_tokens"] >= 512 and summary["profile_tokens"] >= 2 * 512
    assert summary["pool_tokens"] + summary["profile_tokens"] == 5120  # disjoint windows
    policies = summary["policies"]
    assert set(policies) == {"point", "confidence", "oracle", "lambdaml"}
    oracle = policies["oracle"]
    assert oracle["slo_attainment"] == 1.0 and oracle["cost_vs_oracle"] == 1.0
    for row in policies.values():
        assert {"slo_attainment", "mean_cost_usd", "cost_vs_oracle", "p99_latency_s"} <= set(row)
        assert 0 <= row["slo_attainment"] <= 1
        if row["cost_vs_oracle"] is not None:  # nothing is cheaper than the oracle's own plan
            assert row["cost_vs_oracle"] >= 1 - 1e-6 or row["slo_attainment"] < 1
    sweep = summary["confidence_sweep"]
    assert {"0", "0.9", "0.99"} <= set(sweep)
    assert sweep["0"] == policies["point"] and sweep["0.9"] == policies["confidence"]
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_confidence_zero_is_the_point_plan_at_a_given_slo(traces: Path) -> None:
    first = _backtest(traces, "--confidence", "0")
    again = _backtest(traces, "--confidence", "0", "--slo", str(first["slo_s"]))
    assert first["policies"]["confidence"] == first["policies"]["point"]
    assert again["policies"] == first["policies"]  # the same batches, plans and verdicts


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tokens", "500"], "whole number of 128-token windows"),
        (["--tokens", "4096"], "too few to hold out"),
        (["--confidence", "1"], "not in \\[0, 1\\)"),
        (["--predictor", "nope"], "nope"),
    ],
)
def test_bad_input_exits_2(traces: Path, extra: list[str], message: str) -> None:
    result = runner.invoke(app, ["backtest", "--traces", str(traces), *extra])
    assert result.exit_code == 2
    assert re.search(message, result.output), result.output


def test_an_slo_no_deployment_meets_exits_2_naming_the_fastest(
    traces: Path, tmp_path: Path
) -> None:
    plot = tmp_path / "b.png"
    args = ["backtest", "--traces", str(traces), "--tokens", "512", "--batches", "2"]
    result = runner.invoke(app, [*args, "--slo", "0.001", "--plot", str(plot)])
    assert result.exit_code == 2, result.output
    assert "the fastest takes" in result.output and "--slo" in result.output
    assert "Traceback" not in result.output and not plot.exists()
