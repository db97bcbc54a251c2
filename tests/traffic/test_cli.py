"""`moelambda traffic`, `calibrate --cold` and `plan --traffic` at the command line: the JSON
contract, and bad inputs exiting 2 with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelambda.cli import app
from tests.traffic.plans import tiny_plan

runner = CliRunner()


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("traffic") / "plan.json"
    tiny_plan(method="s3", tokens=2048).save(path)
    return path


def _json(result) -> dict:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_traffic_json_has_the_issues_keys(plan_path: Path) -> None:
    out = _json(
        runner.invoke(
            app,
            [
                "traffic",
                "--plan",
                str(plan_path),
                "--traffic",
                "poisson:0.2",
                "--hours",
                "1",
                "--slo",
                "30",
                "--json",
            ],  # fmt: skip
        )
    )
    for key in ("requests", "batches", "latency_s", "cold_starts", "slo_attainment",
                "bill_usd", "wall_s"):  # fmt: skip
        assert key in out
    assert set(out["latency_s"]) == {"p50", "p95", "p99", "max"}
    assert set(out["cold_starts"]) == {"count", "per_function"}
    for key in ("init_usd", "provisioned_usd", "warmers_usd", "managed_instances_usd",
                "total_usd", "per_million_tokens_usd"):  # fmt: skip
        assert key in out["bill_usd"]
    bill = out["bill_usd"]
    parts = sum(v for k, v in bill.items() if k not in ("total_usd", "per_million_tokens_usd"))
    assert bill["total_usd"] == pytest.approx(parts, rel=1e-12)
    assert bill["per_million_tokens_usd"] == pytest.approx(
        bill["total_usd"] / out["tokens"] * 1e6, rel=1e-12
    )
    assert 600 < out["requests"] < 840  # 0.2/s over an hour: 720 expected
    assert out["batches"] == out["requests"]  # a steady-state plan: one execution per request
    assert out["cold_starts"]["count"] >= len(out["init_s"])  # every function starts once
    assert 0 <= out["slo_attainment"] <= 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--traffic", "poisson:-1"], "not a positive number"),
        (["--traffic", "nosuchfile.csv"], "neither a file nor a spec"),
        (["--traffic", "diurnal:1"], "PEAK,TROUGH"),
        (["--scale", "0"], "--scale"),
        (["--hours", "-2"], "--hours"),
        (["--idle-s", "0"], "--idle-s"),
        (["--max-batch-tokens", "0"], "--max-batch-tokens"),
        (["--minutes", "6"], "both give the period"),
    ],
)
def test_traffic_bad_inputs_exit_2(plan_path: Path, args: list[str], says: str) -> None:
    base = ["traffic", "--plan", str(plan_path), "--traffic", "poisson:1", "--hours", "0.1"]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2, result.output
    assert says in result.output and "To fix" in result.output


def test_traffic_takes_the_period_in_minutes_as_run_local_does(plan_path: Path) -> None:
    base = ["traffic", "--plan", str(plan_path), "--traffic", "poisson:1", "--json"]
    in_hours = _json(runner.invoke(app, [*base, "--hours", "0.1"]))
    in_minutes = _json(runner.invoke(app, [*base, "--minutes", "6"]))
    assert in_minutes["requests"] == in_hours["requests"] > 0
    assert in_minutes["traffic"] == in_hours["traffic"]
    result = runner.invoke(app, [*base, "--minutes", "-1"])
    assert result.exit_code == 2 and "--minutes -1" in result.output


def test_traffic_bad_plan_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{}")
    result = runner.invoke(app, ["traffic", "--plan", str(bad), "--traffic", "poisson:1"])
    assert result.exit_code == 2, result.output


def test_plan_traffic_needs_slo_p99(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["plan", "--traffic", "poisson:1", "--out", str(tmp_path / "p.json")]
    )
    assert result.exit_code == 2 and "--slo-p99" in result.output


@pytest.mark.parametrize("flag", [["--hours", "2"], ["--minutes", "5"], ["--scale", "0.5"]])
def test_plan_refuses_a_traffic_option_without_traffic(tmp_path: Path, flag: list[str]) -> None:
    result = runner.invoke(app, ["plan", *flag, "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and f"{flag[0]} needs --traffic" in result.output
    assert not (tmp_path / "p.json").exists()


def test_calibrate_cold_writes_the_measured_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's plumbing, with the fresh processes replaced by fixed samples (the real
    measurement imports torch in 12 processes: minutes on this machine)."""
    import runtime.coldstart as cold
    from tests.traffic.test_coldstart import _samples

    monkeypatch.setattr(cold, "reference_export", lambda out, progress=None: out)
    monkeypatch.setattr(cold, "measure_cold", lambda root, repeats, progress=None: _samples())
    target = tmp_path / "cal.json"
    out = _json(runner.invoke(app, ["calibrate", "--cold", "--out", str(target), "--json"]))
    assert out["file"] == str(target) and out["repeats"] == 3
    assert out["load_fixed_s"] == pytest.approx(0.5, rel=1e-3)
    written = json.loads(target.read_text())["parameters"]["cold_start_reference"]
    assert written["value"]["import_s"]["head"] == pytest.approx(3.2)
    bad = runner.invoke(app, ["calibrate", "--cold", "--cold-repeats", "0", "--out",
                              str(tmp_path / "x.json")])  # fmt: skip
    assert bad.exit_code == 2 and "--cold-repeats" in bad.output


def test_traffic_without_reserved_concurrency_throttles_nothing(plan_path: Path) -> None:
    base = ["traffic", "--plan", str(plan_path), "--traffic", "poisson:5", "--hours", "0.2",
            "--json"]  # fmt: skip
    reserved = _json(runner.invoke(app, base))
    free = _json(runner.invoke(app, [*base, "--no-reserve-concurrency"]))
    assert reserved["reserved_concurrency"] and not free["reserved_concurrency"]
    assert free["reserved_concurrency_reached"] == {} and free["failed_batches"] == 0
    assert free["requests"] == reserved["requests"]
