"""Tests of the calibration file and its loader: defaults, CPU share and every validation error."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ground.errors import CalibrationError
from planner import Calibration, default_calibration_path, load_calibration

PAPER_MEMORY_OPTIONS_MB = (128, *range(768, 3072 + 1, 192))

Raw = dict[str, Any]


@pytest.fixture(scope="module")
def default_raw() -> Raw:
    return json.loads(default_calibration_path().read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def calibration() -> Calibration:
    return load_calibration()


def _write(tmp_path: Path, raw: Raw) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def _set(name: str, value: Any) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        raw["parameters"][name]["value"] = value

    return edit


def test_default_file_is_the_packaged_one() -> None:
    path = default_calibration_path()
    assert path.is_file()
    assert path.parts[-3:] == ("planner", "data", "calibration.json")
    assert load_calibration(path) == load_calibration()


def test_default_holds_the_paper_setup(calibration: Calibration) -> None:
    assert calibration.memory_options_mb == PAPER_MEMORY_OPTIONS_MB
    assert len(calibration.memory_options_mb) == 14
    assert calibration.max_replicas == 8
    assert (calibration.lambda_min_memory_mb, calibration.lambda_max_memory_mb) == (128, 10240)
    assert calibration.region == "us-east-1"


def test_default_prices_and_limits(calibration: Calibration) -> None:
    assert calibration.price("x86_64").gb_second_usd == 0.0000166667
    assert calibration.price("arm64").gb_second_usd == 0.0000133334
    assert calibration.price("arm64").request_usd == pytest.approx(0.20 / 1e6)
    assert calibration.s3_put_request_usd == pytest.approx(0.005 / 1000)
    assert calibration.s3_get_request_usd == pytest.approx(0.0004 / 1000)
    assert calibration.step_functions_transition_usd == pytest.approx(0.025 / 1000)
    assert calibration.invoke_payload_bytes == 6 * 2**20
    assert calibration.step_functions_payload_bytes == 256 * 2**10
    assert calibration.max_timeout_s == 900


def test_packaged_compute_times_are_measured_and_monotone(calibration: Calibration) -> None:
    times = calibration.expert_token_compute_s
    assert times is not None and len(times) == len(calibration.memory_options_mb)
    assert all(a >= b for a, b in zip(times, times[1:], strict=False))
    assert calibration.expert_compute_reference is not None


def test_describe_gives_a_source_for_every_value(calibration: Calibration) -> None:
    rows = calibration.describe()
    names = [name for name, _, _, _ in rows]
    exposed = set(Calibration.model_fields) - {"region", "provenance", "source_path"}
    assert set(names) == exposed
    assert all(unit and source for _, _, unit, source in rows)
    assert ("max_replicas", 8) in [(name, value) for name, value, _, _ in rows]


def test_vcpus_follow_the_memory_share(calibration: Calibration) -> None:
    assert calibration.vcpus_at(1769) == 1
    assert calibration.vcpus_at(128) == pytest.approx(128 / 1769)
    # Credit is proportional to memory, so Lambda's largest size gets 5.79 vCPUs of CPU time,
    # not the 6 cores it exposes; the cap only binds beyond Lambda's memory range.
    assert calibration.vcpus_at(10240) == pytest.approx(10240 / 1769)
    assert calibration.vcpus_at(10240) < calibration.max_vcpus == 6
    assert calibration.vcpus_at(20000) == 6


def test_measured_compute_times_load(tmp_path: Path, default_raw: Raw) -> None:
    raw = copy.deepcopy(default_raw)
    times = [0.001 * (14 - j) for j in range(14)]
    _set("expert_token_compute_s", times)(raw)
    assert load_calibration(_write(tmp_path, raw)).expert_token_compute_s == tuple(times)


def _drop(name: str) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        del raw["parameters"][name]

    return edit


def _drop_unit(raw: Raw) -> None:
    del raw["parameters"]["warm_start_s"]["unit"]


def _misspell(raw: Raw) -> None:
    raw["parameters"]["max_replica"] = raw["parameters"].pop("max_replicas")


def _version(raw: Raw) -> None:
    raw["schema_version"] = 2


def _arm_price(raw: Raw) -> None:
    raw["parameters"]["lambda_prices"]["value"]["arm64"]["gb_second_usd"] = 0


def _instance(name: str, **fields: Any) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        raw["parameters"]["ec2_instance_prices"]["value"][name].update(fields)

    return edit


INVALID_EDITS = {
    "unknown schema_version": (_version, "schema_version"),
    "missing parameter": (_drop("warm_start_s"), "parameters.warm_start_s"),
    "missing unit": (_drop_unit, "parameters.warm_start_s.unit"),
    "misspelled parameter": (_misspell, "Did you mean 'max_replicas'?"),
    "options not increasing": (
        _set("memory_options_mb", [128, 960, 768]),
        "parameters.memory_options_mb",
    ),
    "option above Lambda": (_set("memory_options_mb", [128, 10241]), "memory_options_mb"),
    "option below Lambda": (_set("memory_options_mb", [64, 768]), "memory_options_mb"),
    "no options": (_set("memory_options_mb", []), "memory_options_mb"),
    "G below 1": (_set("max_replicas", 0), "parameters.max_replicas"),
    "zero S3 bandwidth": (_set("s3_bandwidth_bytes_per_s", 0), "s3_bandwidth_bytes_per_s"),
    "negative invoke bandwidth": (
        _set("invoke_bandwidth_bytes_per_s", -1),
        "invoke_bandwidth_bytes_per_s",
    ),
    "negative S3 delay": (_set("s3_access_delay_s", -0.02), "s3_access_delay_s"),
    "zero warm start": (_set("warm_start_s", 0), "warm_start_s"),
    "zero arm64 price": (_arm_price, "parameters.lambda_prices.value.arm64.gb_second_usd"),
    "negative S3 PUT price": (_set("s3_put_request_usd", -0.005), "s3_put_request_usd"),
    "zero transition price": (
        _set("step_functions_transition_usd", 0),
        "step_functions_transition_usd",
    ),
    "zero payload limit": (_set("invoke_payload_bytes", 0), "invoke_payload_bytes"),
    "zero timeout": (_set("max_timeout_s", 0), "max_timeout_s"),
    "U_j too short": (_set("expert_token_compute_s", [0.01] * 13), "expert_token_compute_s"),
    "U_j non-positive": (
        _set("expert_token_compute_s", [0.01] * 13 + [0.0]),
        "parameters.expert_token_compute_s.value.13",
    ),
    "GPUs without their memory": (
        _instance("g6.xlarge", gpu_memory_gib=0),
        "parameters.ec2_instance_prices.value.g6.xlarge",
    ),
    "GPUs without their type": (_instance("g6.xlarge", gpu=None), "need their memory"),
    "a GPU type on a CPU type": (_instance("m7i.xlarge", gpu="l4"), "set gpus too"),
    "a GPU type on arm64": (_instance("g6.xlarge", arch="arm64"), "must be x86_64"),
    "negative GPUs": (_instance("g6.xlarge", gpus=-1), "ec2_instance_prices.value.g6.xlarge.gpus"),
    "accelerator sizes not increasing": (
        _set("lambda_accelerator_memory_gib", [3, 12, 6]),
        "parameters.lambda_accelerator_memory_gib",
    ),
    "accelerator size zero": (
        _set("lambda_accelerator_memory_gib", [0, 3]),
        "parameters.lambda_accelerator_memory_gib.value.0",
    ),
    "no accelerator sizes": (_set("lambda_accelerator_memory_gib", []), "at least 1"),
    "GPU utilisation target over 1": (
        _set(
            "managed_instances_scaling",
            {
                "doubling_window_s": 300,
                "cpu_utilization_target": 0.5,
                "gpu_utilization_target": 40,
                "instance_start_s": 300,
            },
        ),
        "managed_instances_scaling.value.gpu_utilization_target",
    ),
}


@pytest.mark.parametrize(("edit", "field"), INVALID_EDITS.values(), ids=INVALID_EDITS.keys())
def test_invalid_file_names_the_field(
    tmp_path: Path, default_raw: Raw, edit: Callable[[Raw], None], field: str
) -> None:
    raw = copy.deepcopy(default_raw)
    edit(raw)
    path = _write(tmp_path, raw)
    with pytest.raises(CalibrationError) as caught:
        load_calibration(path)
    message = str(caught.value)
    assert field in caught.value.problem
    assert "To fix:" in message
    assert str(path) in (caught.value.fix or "")


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text('{"schema_version": 1,\n "region": }', encoding="utf-8")
    with pytest.raises(CalibrationError, match="not valid JSON") as caught:
        load_calibration(path)
    assert "line 2" in (caught.value.fix or "")
    assert str(path) in (caught.value.fix or "")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="Cannot read calibration file"):
        load_calibration(tmp_path / "absent.json")


@pytest.mark.parametrize(("arch", "suggestion"), [("arm", "arm64"), ("x86", "x86_64")])
def test_unknown_architecture_suggests_a_close_name(
    calibration: Calibration, arch: str, suggestion: str
) -> None:
    with pytest.raises(CalibrationError, match="lambda_prices") as caught:
        calibration.price(arch)
    assert f"Did you mean '{suggestion}'?" in caught.value.problem
    assert "To fix:" in str(caught.value)


# Provenance: every entry has a source, a date and a kind of source that can be checked.


def _drop_field(name: str, field: str) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        del raw["parameters"][name][field]

    return edit


def _set_field(name: str, field: str, value: Any) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        raw["parameters"][name][field] = value

    return edit


UNSOURCED_EDITS = {
    "no source": (_drop_field("mb_per_vcpu", "source"), "parameters.mb_per_vcpu.source"),
    "empty source": (_set_field("mb_per_vcpu", "source", ""), "parameters.mb_per_vcpu.source"),
    "no as_of": (_drop_field("lambda_prices", "as_of"), "parameters.lambda_prices.as_of"),
    "as_of not a date": (
        _set_field("lambda_prices", "as_of", "recently"),
        "parameters.lambda_prices.as_of",
    ),
    "unclassifiable source": (
        _set_field("warm_start_s", "source", "a colleague said so"),
        "neither a URL nor starts with measured:",
    ),
    "unknown kind": (
        _set_field("warm_start_s", "source_kind", "hearsay"),
        "parameters.warm_start_s.source_kind",
    ),
    "aws kind without an AWS URL": (
        _set_field("memory_options_mb", "source_kind", "aws"),
        "needs a URL on aws.amazon.com",
    ),
    "secondary kind without the URL read": (
        _set_field("lambda_min_memory_mb", "source_kind", "secondary"),
        "needs the URL it was read at",
    ),
    "derived kind the entry does not explain": (
        _set_field("lambda_min_memory_mb", "source_kind", "derived"),
        "neither the source nor the note says so",
    ),
    "kind against the source's own word": (
        _set_field("warm_start_s", "source_kind", "measured"),
        "but the source says 'assumed'",
    ),
    "kinds per key that miss a key": (
        _set_field("ec2_instance_prices", "source_kind", {"m7g.xlarge": "secondary"}),
        "give one kind per key",
    ),
    "kinds per key of a scalar": (
        _set_field("mb_per_vcpu", "source_kind", {"value": "aws"}),
        "give one kind per key",
    ),
}


@pytest.mark.parametrize(("edit", "problem"), UNSOURCED_EDITS.values(), ids=UNSOURCED_EDITS.keys())
def test_an_entry_without_a_checkable_source_or_date_is_refused(
    tmp_path: Path, default_raw: Raw, edit: Callable[[Raw], None], problem: str
) -> None:
    raw = copy.deepcopy(default_raw)
    edit(raw)
    with pytest.raises(CalibrationError) as caught:
        load_calibration(_write(tmp_path, raw))
    assert problem in caught.value.problem


def test_a_source_kind_is_read_off_the_source_when_not_given(
    tmp_path: Path, default_raw: Raw
) -> None:
    raw = copy.deepcopy(default_raw)
    for entry in raw["parameters"].values():
        del entry["source_kind"]
    raw["parameters"]["s3_get_request_usd"]["source"] = "https://example.org/s3-prices"
    cal = load_calibration(_write(tmp_path, raw))
    assert cal.source_kind("lambda_prices") == "aws"  # https://aws.amazon.com/lambda/pricing/
    assert cal.source_kind("sqs_message_max_bytes") == "aws"  # docs.aws.amazon.com
    assert cal.source_kind("warm_start_s") == "assumed"
    assert cal.source_kind("expert_token_compute_s") == "measured"  # "measured by `calibrate`"
    assert cal.source_kind("s3_get_request_usd") == "secondary"  # a URL not AWS's own


def test_every_packaged_entry_declares_its_kind_of_source(calibration: Calibration) -> None:
    for name, entry in calibration.provenance.items():
        assert entry.source_kind is not None, name
        assert entry.source and entry.as_of, name


def test_managed_instances_prices_say_which_are_not_aws_own(calibration: Calibration) -> None:
    # The Managed Instances fee and request charge were read in a transcription of AWS's page,
    # the xlarge EC2 prices on a blog, and the 2xlarge ones are twice those: none is "aws".
    kind = calibration.source_kind
    assert kind("managed_instances_prices", "request_usd") == "secondary"
    assert kind("managed_instances_prices", "management_fee_fraction") == "secondary"
    assert kind("managed_instances_prices", "default_instances") == "aws"
    assert kind("managed_instances_prices") == "secondary"  # the whole entry: its weakest part
    assert kind("ec2_instance_prices", "m7g.xlarge") == "secondary"
    assert kind("ec2_instance_prices", "m7i.2xlarge") == "derived"
    for name in ("managed_instances_prices", "ec2_instance_prices"):
        entry = calibration.provenance[name]
        assert "https://aws.amazon.com/" in entry.source  # AWS's own page is cited
        assert entry.note is not None and "Secondary source:" in entry.note
    assert "Derived" in (calibration.provenance["ec2_instance_prices"].note or "")
    assert calibration.source_kind("not_a_parameter") is None


def test_gpu_backed_lambda_entries(calibration: Calibration) -> None:
    # AcceleratorMemorySize values from AWS's SAM and API references; GPU types beside the
    # CPU ones in ec2_instance_prices, their prices transcribed (secondary).
    assert calibration.lambda_accelerator_memory_gib == (3, 6, 12, 16, 24, 48)
    assert calibration.source_kind("lambda_accelerator_memory_gib") == "aws"
    note = calibration.provenance["lambda_accelerator_memory_gib"].note or ""
    assert "Image" in note and "x86_64" in note and "2.278.0" in note and "2.275.0" in note
    types = calibration.ec2_instance_prices
    assert types is not None
    gpu_types = {name: t for name, t in types.items() if t.gpus}
    assert set(gpu_types) >= {
        "g6.xlarge", "g6.2xlarge", "g6.4xlarge", "g6.12xlarge", "g6e.xlarge", "g6e.2xlarge",
        "g5.xlarge",
    }  # fmt: skip
    assert gpu_types["g6.12xlarge"].gpus == 4 and gpu_types["g6e.xlarge"].gpu_memory_gib == 48
    for name, t in gpu_types.items():
        assert t.arch == "x86_64" and t.gpu and t.gpu_memory_gib > 0, name
        assert calibration.source_kind("ec2_instance_prices", name) == "secondary", name
    # The largest AcceleratorMemorySize fits some GPU type's GPU.
    assert max(t.gpu_memory_gib for t in gpu_types.values()) >= 48


def test_every_gpu_type_names_a_gpu_of_the_gpu_catalogue(calibration: Calibration) -> None:
    # A GPU instance type's GPU is a type of the GPU catalogue (planner/data/gpu_catalogue.json),
    # of the same memory.
    from planner.hardware.catalogue import load_catalogue

    catalogue = load_catalogue()
    types = calibration.ec2_instance_prices
    assert types is not None
    for name, t in types.items():
        if t.gpus:
            assert t.gpu in catalogue.types, name
            assert catalogue.types[t.gpu].memory_gb == t.gpu_memory_gib, name


def test_managed_instances_scaling_is_sourced_or_assumed(calibration: Calibration) -> None:
    scaling = calibration.managed_instances_scaling
    assert scaling is not None
    assert scaling.doubling_window_s == 300 and scaling.gpu_utilization_target == 0.4
    kind = calibration.source_kind
    assert kind("managed_instances_scaling", "doubling_window_s") == "aws"
    assert kind("managed_instances_scaling", "gpu_utilization_target") == "aws"
    assert kind("managed_instances_scaling", "cpu_utilization_target") == "assumed"
    assert kind("managed_instances_scaling", "instance_start_s") == "assumed"
    # The floor of instances lives in one place: managed_instances_prices.default_instances.
    assert "default_instances" not in type(scaling).model_fields
    assert "default_instances" in (calibration.provenance["managed_instances_scaling"].note or "")


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("invoke_round_trip_s", ["--deployment", "driver"]),
        ("driver_activation_states", ["--deployment", "monolithic"]),
        ("decode_layer_floor_s", ["--deployment", "driver", "--slo-tpot", "5"]),
    ],
)
def test_a_model_needing_a_missing_entry_names_it_and_plans_nothing(
    tmp_path: Path, default_raw: Raw, name: str, args: list[str]
) -> None:
    """No model makes up an entry a plan's calibration lacks (`Calibration.required`)."""
    from typer.testing import CliRunner

    from moelambda.cli import app

    raw = copy.deepcopy(default_raw)
    _drop(name)(raw)
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "--shape",
            "mixtral",
            "--tokens",
            "256",
            "--calibration",
            str(_write(tmp_path, raw)),
        ]
        + ["--out", str(out), *args],
    )
    assert result.exit_code == 2, result.output
    assert f"lacks {name}" in result.output and "packaged calibration file" in result.output
    assert not out.exists()
