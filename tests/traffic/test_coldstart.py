"""Cold starts: the INIT model, the INIT limit, the retry waits, the calibration's traffic
fields, and how `calibrate --cold` turns fresh-process samples into the file's entry."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pytest

from ground.coldstart import THROTTLE_RETRY, InitModel, init_phase, retry_waits, stage_objects
from ground.errors import CalibrationError
from planner import load_calibration
from planner.calibration import ColdStartReference
from planner.traffic.platform import calibrated_cold_document, init_model
from runtime.coldstart import summarise

MODEL = InitModel(
    image_start_s=0.05,
    python_start_s=0.1,
    import_s={"head": 3.0, "layer": 3.0, "expert": 2.0, "tail": 2.5},
    load_fixed_s=1.0,
    load_s_per_byte=1e-8,
    config_objects=4,
    config_bytes=1_000_000,
    s3_delay_s=0.02,
    s3_bandwidth_bytes_per_s=80e6,
    limit_s=10.0,
)


def test_init_is_start_imports_download_and_load_by_hand() -> None:
    # expert, 8 MB: 0.05 + 0.1 + 2.0 + (5 objects * 0.02 + 9 MB / 80 MB/s) + (1.0 + 0.08)
    assert MODEL.seconds("expert", 8e6) == pytest.approx(0.05 + 0.1 + 2.0 + 0.1 + 0.1125 + 1.08)
    # a packed function of 3 experts downloads 3 stage files but sets its loader up once
    packed = MODEL.seconds("expert", 8e6, hosted=3)
    assert packed - MODEL.seconds("expert", 8e6) == pytest.approx(2 * 0.02)
    assert stage_objects("expert", 3) == 3 and stage_objects("head", 3) == 1
    with pytest.raises(ValueError, match="unknown role"):
        stage_objects("gate")


def test_an_expert_downloads_the_manifest_alone_when_the_reference_says_its_size() -> None:
    import dataclasses

    measured = dataclasses.replace(MODEL, manifest_bytes=10_000)
    # expert, 8 MB: 2 objects (manifest, stage) and 10 kB + 8 MB instead of 5 objects and 9 MB
    assert measured.seconds("expert", 8e6) == pytest.approx(
        0.05 + 0.1 + 2.0 + 2 * 0.02 + (10e3 + 8e6) / 80e6 + 1.08
    )
    assert measured.seconds("head", 8e6) == MODEL.seconds("head", 8e6)  # head: config too
    # the packaged reference knows the size: its expert INIT is the smaller one
    ref = load_calibration().cold_start_reference
    assert ref is not None and ref.manifest_bytes is not None
    assert 0 < ref.manifest_bytes < ref.config_bytes


def test_only_the_init_phase_is_under_the_limit() -> None:
    # imports at INIT (0.05 + 0.1 + 2.0), weights on the first call: a 2 GB expert loads for
    # 25+ s without passing the 10 s INIT limit
    phase, load = MODEL.phases("expert", 2e9)
    assert phase == pytest.approx(2.15) and load > 20
    from planner.traffic.simulate import Platform

    platform = Platform(
        init_s=np.array([phase, 12.0]),
        load_s=np.array([load, 1.0]),
        init_limit_s=10.0,
        init_billed=True,
        idle_s=600.0,
        gb_second_usd=1e-5,
        request_usd=2e-7,
        ping_s=0.02,
        scheduler_invocation_usd=1e-6,
        billing_mb_per_gb=1024.0,
    )
    wait, billed = platform.cold_s()
    np.testing.assert_allclose(wait, [phase + load, 10.0 + 12.0 + 1.0])
    np.testing.assert_allclose(billed, wait)


def test_an_init_past_the_limit_is_waited_and_billed_twice() -> None:
    assert init_phase(4.0, 10.0) == (4.0, 4.0)
    assert init_phase(10.0, 10.0) == (10.0, 10.0)
    assert init_phase(12.0, 10.0) == (22.0, 22.0)


def test_retry_waits_are_the_state_machines_mean_full_jitter() -> None:
    from cdk._state_machine import _retry_json

    asl = _retry_json()
    assert asl["IntervalSeconds"] == THROTTLE_RETRY["interval_s"]
    assert asl["MaxAttempts"] == THROTTLE_RETRY["max_attempts"] == len(retry_waits())
    assert asl["BackoffRate"] == THROTTLE_RETRY["backoff_rate"] and asl["JitterStrategy"] == "FULL"
    assert retry_waits() == (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def test_packaged_calibration_has_every_traffic_parameter_with_a_source() -> None:
    cal = load_calibration()
    model = init_model(cal)
    assert model.limit_s == 10 and cal.init_billed is True
    idle = cal.idle_reclaim_s
    assert idle is not None and idle.low_s <= idle.assumed_s <= idle.high_s
    for name in ("init_image_start_s", "idle_reclaim_s", "provisioned_concurrency_prices",
                 "scheduler_invocation_usd", "cold_start_reference"):  # fmt: skip
        entry = cal.provenance[name]
        assert entry.source and entry.as_of


def test_a_calibration_without_the_measured_init_says_what_to_run() -> None:
    cal = load_calibration().model_copy(update={"cold_start_reference": None})
    with pytest.raises(CalibrationError, match="cold_start_reference") as info:
        init_model(cal)
    assert info.value.fix is not None and "calibrate --cold" in info.value.fix


def _samples() -> list[dict[str, float | str]]:
    # load (build - download) = 0.5 s + 2e-8 s per byte exactly, imports per role
    out = []
    for role, size, imp in (("head", 40e6, 3.1), ("layer", 2e6, 3.0), ("expert", 1e6, 2.9),
                            ("tail", 5e3, 2.8)):  # fmt: skip
        for r in range(3):
            download = 0.01 * (r + 1)
            out.append(
                {
                    "role": role,
                    "stage_bytes": size,
                    "import_s": imp + 0.1 * r,
                    "download_s": download,
                    "build_s": download + 0.5 + 2e-8 * size,
                    "python_start_s": 0.05,
                    # an expert downloads the manifest alone (functions.weights)
                    "config_objects": 1 if role == "expert" else 4,
                    "config_bytes": 7e3 if role == "expert" else 7e5,
                    "manifest_bytes": 7e3,
                }
            )
    return out


def test_summarise_fits_fixed_and_per_byte_load() -> None:
    ref = summarise(_samples())
    assert ref["load_fixed_s"] == pytest.approx(0.5, abs=1e-9)
    assert ref["load_s_per_byte"] == pytest.approx(2e-8, rel=1e-9)
    assert ref["import_s"] == pytest.approx(
        {"head": 3.2, "layer": 3.1, "expert": 3.0, "tail": 2.9}
    )
    assert ref["repeats"] == 3 and ref["config_objects"] == 4
    assert ref["config_bytes"] == 700_000 and ref["manifest_bytes"] == 7_000


def test_calibrated_document_changes_only_the_reference(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from planner import compute, default_calibration_path

    document = compute.read_document(default_calibration_path())
    ref = ColdStartReference(**summarise(_samples()), torch_version="t", cpu_model="cpu")
    updated = calibrated_cold_document(document, ref, date(2026, 11, 25))
    before = {k: v for k, v in document["parameters"].items() if k != "cold_start_reference"}
    after = {k: v for k, v in updated["parameters"].items() if k != "cold_start_reference"}
    assert before == after
    entry = updated["parameters"]["cold_start_reference"]
    assert entry["as_of"] == "2026-11-25" and "calibrate --cold" in entry["source"]
    written = compute.write_calibration(updated, tmp_path / "cal.json")
    assert written.cold_start_reference is not None
    assert written.cold_start_reference.load_fixed_s == pytest.approx(0.5, rel=1e-3)
    json.loads((tmp_path / "cal.json").read_text())
