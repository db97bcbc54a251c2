"""Tests of U_j: the CPU-share model, FLOP scaling, the timing, the file it writes and the CLI.

The CLI tests replace the reference expert (MiniLM's, which takes seconds to MoEfy in a fresh
cache) by a small random one of the same kind; `moelambda calibrate` itself runs unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ground.errors import CalibrationError
from moe import ExpertStage
from moelambda.cli import app
from planner import Calibration, compute, default_calibration_path, load_calibration
from planner.calibration import ExpertComputeReference

runner = CliRunner()
T1 = 1e-5  # seconds per token on one thread, for the model tests


@pytest.fixture(scope="module")
def calibration() -> Calibration:
    return load_calibration()


@pytest.fixture()
def calibration_copy(tmp_path: Path) -> Path:
    path = tmp_path / "calibration.json"
    shutil.copyfile(default_calibration_path(), path)
    return path


def _small_expert(hidden: int = 64, width: int = 64) -> ExpertStage:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w_in": torch.randn(width, hidden, generator=g),
        "b_in": torch.randn(width, generator=g),
        "w_out": torch.randn(hidden, width, generator=g),
    }
    return ExpertStage(tensors, "mlp", "gelu")


def _reference(flops_per_token: int = 590_592) -> ExpertComputeReference:
    return ExpertComputeReference(
        hidden=384,
        width=384,
        flops_per_token=flops_per_token,
        threads_efficiency=0.8,
        t1_s_per_token=T1,
        batch_tokens=1024,
        torch_version="2.13.0+cpu",
        cpu_model="Test CPU",
    )


def _with_options(calibration: Calibration, *options: int) -> Calibration:
    return calibration.model_copy(update={"memory_options_mb": options})


# The U_j model


@pytest.mark.parametrize("efficiency", [0.3, 0.5, 0.75, 1.0])
def test_compute_time_never_grows_with_memory(calibration: Calibration, efficiency: float) -> None:
    u = compute.token_compute_s(calibration, T1, efficiency)
    assert u.shape == (len(calibration.memory_options_mb),)
    assert np.all(u > 0)
    assert np.all(np.diff(u) <= 0)


def test_below_one_vcpu_the_time_scales_by_the_share(calibration: Calibration) -> None:
    u = compute.token_compute_s(calibration, T1, 0.8)
    below = np.array(calibration.memory_options_mb) < calibration.mb_per_vcpu
    assert below.sum() == 7
    expected = [T1 * calibration.mb_per_vcpu / m for m in np.array(calibration.memory_options_mb)]
    np.testing.assert_allclose(u[below], np.array(expected)[below], rtol=1e-12)


def test_above_one_vcpu_the_efficiency_decides(calibration: Calibration) -> None:
    two = _with_options(calibration, 1769, 2 * 1769, 3 * 1769)
    t2 = 0.6 * T1
    efficiency = compute.parallel_efficiency(T1, t2)
    # At 2 vCPUs the model gives back the two-thread time it was measured from.
    np.testing.assert_allclose(
        compute.token_compute_s(two, T1, efficiency), [T1, t2, T1 / (3 * efficiency)]
    )
    # A second thread that gains nothing leaves a whole core's time, never worse.
    np.testing.assert_allclose(compute.token_compute_s(two, T1, 0.4), [T1, T1, T1 / 1.2])


def test_parallel_efficiency_is_clipped_to_one() -> None:
    assert compute.parallel_efficiency(1.0, 0.5) == 1.0
    assert compute.parallel_efficiency(1.0, 0.4) == 1.0
    assert compute.parallel_efficiency(1.0, 1.0) == 0.5


def test_flops_per_token_counts_the_matmuls_and_elementwise_work() -> None:
    assert compute.ffn_flops_per_token(384, 384, "mlp") == 4 * 384 * 384 + 2 * 384
    assert compute.ffn_flops_per_token(576, 384, "glu") == 6 * 576 * 384 + 2 * 384


def test_expert_time_scales_linearly_with_flops(calibration: Calibration) -> None:
    times = compute.token_compute_s(calibration, T1, 0.8)
    reference = _reference()
    measured = calibration.model_copy(
        update={"expert_token_compute_s": tuple(times), "expert_compute_reference": reference}
    )
    flops = reference.flops_per_token
    for factor in (1.0, 3.0, 0.5):
        scaled = compute.expert_compute_s(measured, factor * flops)
        np.testing.assert_allclose(scaled, factor * times, rtol=1e-12)


def test_expert_time_needs_a_measurement(calibration: Calibration) -> None:
    unmeasured = calibration.model_copy(
        update={"expert_token_compute_s": None, "expert_compute_reference": None}
    )
    with pytest.raises(CalibrationError, match="moelambda calibrate"):
        compute.expert_compute_s(unmeasured, 1e6)


# Measuring


def test_measurement_times_both_thread_counts_and_restores_threads() -> None:
    threads = torch.get_num_threads()
    stage = _small_expert()
    timing = compute.measure_expert(stage, tokens=64, repeats=3)
    assert torch.get_num_threads() == threads
    assert timing.batch_tokens == 64
    assert timing.t1_s_per_token > 0 and timing.t2_s_per_token > 0
    assert 0 < timing.threads_efficiency <= 1
    reference = compute.expert_reference(stage, timing)
    assert (reference.hidden, reference.width) == (64, 64)
    assert reference.flops_per_token == compute.ffn_flops_per_token(64, 64, "mlp")
    assert reference.torch_version == torch.__version__ and reference.cpu_model


def test_background_load_counts_other_processes_only() -> None:
    now = compute.CpuTimes(busy_s=100.0, total_s=400.0, own_s=10.0)
    cores = os.cpu_count() or 1
    # Over 2 s of wall time, 1.5 CPU-seconds were busy and 0.5 of them were this process's.
    later = compute.CpuTimes(busy_s=101.5, total_s=400.0 + 2.0 * cores, own_s=10.5)
    assert compute.background_cpus(now, later) == pytest.approx(0.5)
    # /proc/stat counts 10-ms ticks: a short window cannot tell, and says so.
    assert compute.background_cpus(now, now) is None
    assert compute.background_cpus(None, later) is None


# Writing the calibration file


def test_layout_round_trips_the_packaged_file() -> None:
    path = default_calibration_path()
    text = path.read_text(encoding="utf-8")
    assert compute.dump_document(compute.read_document(path)) + "\n" == text


def test_written_file_validates_and_keeps_every_other_parameter(
    calibration: Calibration, calibration_copy: Path
) -> None:
    before = load_calibration(calibration_copy)
    times = compute.token_compute_s(calibration, T1, 0.8)
    document = compute.calibrated_document(
        compute.read_document(calibration_copy), times, _reference(), date(2030, 1, 2)
    )
    written = compute.write_calibration(document, calibration_copy)
    after = load_calibration(calibration_copy)
    assert written == after
    assert after.expert_token_compute_s == pytest.approx(tuple(times), rel=1e-3)
    assert after.expert_compute_reference == _reference()
    changed = {"expert_token_compute_s", "expert_compute_reference"}
    for name in changed:
        entry = after.provenance[name]
        assert entry.as_of == date(2030, 1, 2)
        assert entry.source == "measured by `moelambda calibrate` on Test CPU, torch 2.13.0+cpu"
        assert (entry.unit, entry.note) == (
            before.provenance[name].unit,
            before.provenance[name].note,
        )
    assert list(after.provenance) == list(before.provenance)
    for name in set(before.provenance) - changed:
        assert after.provenance[name] == before.provenance[name]


def test_invalid_document_leaves_the_file_alone(calibration_copy: Path) -> None:
    original = calibration_copy.read_bytes()
    document = compute.calibrated_document(
        compute.read_document(calibration_copy), np.full(3, T1), _reference(), date.today()
    )
    with pytest.raises(CalibrationError, match="expert_token_compute_s"):
        compute.write_calibration(document, calibration_copy)
    assert calibration_copy.read_bytes() == original
    assert list(calibration_copy.parent.iterdir()) == [calibration_copy]


# The command


@pytest.fixture()
def small_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compute, "reference_expert", lambda progress=None: _small_expert())


@pytest.mark.usefixtures("small_reference")
def test_calibrate_json_writes_out_and_keeps_the_source(
    calibration_copy: Path, tmp_path: Path
) -> None:
    source = calibration_copy.read_bytes()
    out = tmp_path / "measured.json"
    result = runner.invoke(
        app,
        ["calibrate", "--calibration", str(calibration_copy), "--out", str(out), "--tokens", "64"]
        + ["--repeats", "3", "--json"],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert calibration_copy.read_bytes() == source
    written = load_calibration(out)
    assert summary["file"] == str(out)
    assert (summary["batch_tokens"], summary["hidden"], summary["width"]) == (64, 64, 64)
    assert summary["threads_efficiency"] == compute.parallel_efficiency(
        summary["t1_s_per_token"], summary["t2_s_per_token"]
    )
    assert [row["memory_mb"] for row in summary["options"]] == list(written.memory_options_mb)
    assert [row["expert_token_compute_s"] for row in summary["options"]] == list(
        written.expert_token_compute_s or ()
    )
    assert written.expert_compute_reference is not None
    assert written.expert_compute_reference.batch_tokens == 64


@pytest.mark.usefixtures("small_reference")
def test_calibrate_updates_in_place_by_default(calibration_copy: Path) -> None:
    result = runner.invoke(
        app,
        ["calibrate", "--calibration", str(calibration_copy), "--tokens", "32"]
        + ["--repeats", "2"],
    )
    assert result.exit_code == 0, result.output
    assert "U_j written to" in result.stdout and "3072" in result.stdout
    assert load_calibration(calibration_copy).expert_compute_reference is not None


@pytest.mark.usefixtures("small_reference")
def test_calibrate_from_python(calibration_copy: Path, tmp_path: Path) -> None:
    """`planner.calibrate.calibrate_compute` is the command: the same summary, the file it
    names written with it."""
    from planner.calibrate import calibrate_compute

    lines: list[str] = []
    summary = calibrate_compute(
        calibration_copy, tmp_path / "api.json", tokens=32, repeats=2, progress=lines.append
    )
    written = load_calibration(tmp_path / "api.json")
    assert summary["file"] == str(tmp_path / "api.json") and lines
    assert [row["expert_token_compute_s"] for row in summary["options"]] == list(
        written.expert_token_compute_s or ()
    )
    printed = runner.invoke(
        app,
        ["calibrate", "--calibration", str(calibration_copy), "--out", str(tmp_path / "cli.json")]
        + ["--tokens", "32", "--repeats", "2", "--json"],
    )
    assert sorted(json.loads(printed.stdout)) == sorted(summary)


def _not_json(path: Path) -> Path:
    path.write_text('{"schema_version": 1,', encoding="utf-8")
    return path


BAD_INPUTS = {
    "no tokens": (["--tokens", "0"], "--tokens"),
    "negative tokens": (["--tokens", "-5"], "--tokens"),
    "no repeats": (["--repeats", "0"], "--repeats"),
    "missing calibration": (["--calibration", "{tmp}/absent.json"], "Cannot read"),
    "calibration not JSON": (["--calibration", "{tmp}/broken.json"], "not valid JSON"),
    "out is a directory": (["--out", "{tmp}"], "is a directory"),
}


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_exits_2_and_writes_nothing(
    calibration_copy: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    def no_measuring(progress: object = None) -> ExpertStage:
        raise AssertionError("bad input must fail before the measurement")

    monkeypatch.setattr(compute, "reference_expert", no_measuring)
    _not_json(tmp_path / "broken.json")
    original = calibration_copy.read_bytes()
    listing = sorted(tmp_path.iterdir())
    options = ["--calibration", str(calibration_copy), "--out", str(calibration_copy)]
    result = runner.invoke(
        app, ["calibrate", *options, *[a.format(tmp=tmp_path) for a in args], "--json"]
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "To fix:" in result.stderr
    assert result.stdout == ""
    assert calibration_copy.read_bytes() == original
    assert sorted(tmp_path.iterdir()) == listing
