"""Weight precision as a plan dimension (`--weights`): a shape's stage sizes, hidden states and
KV cache follow the precision, parameters are recovered per stage kind, CPU compute and the
decode floor scale by the calibration's `weights_speed`, and a kind that does not compute a
precision (bf16 on CPU Lambda, int8 on a GPU) is refused with its reason, never chosen."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.errors import CalibrationError, InfeasibleError, UsageError
from ground.plan import Plan
from ground.precision import Weights, parse_weights
from moelambda.cli import app
from planner import hardware, load_calibration
from planner.api import PlanOptions, plan_deployment, shape_counts_for_plan
from planner.build import instance_for
from planner.calibration import WeightsSpeed
from planner.generation import generation_instance
from planner.hardware.gpu_plan import plan_traffic_on_hardware
from planner.shapes import load_shape
from planner.traffic.workflow import manifest_of_plan

runner = CliRunner()

# OLMoE-1B-7B: hidden 2048, 64 experts of FFN width 1024 (SwiGLU), 16 MoE layers, 16 heads of
# 128 with as many KV heads, vocabulary 50,304, untied embeddings.
EXPERT_PARAMS = 3 * 2048 * 1024
EXPERT_ROWS = 2 * 1024 + 2048  # gate and up give 1,024 output channels each, down 2,048
LAYER_PARAMS = (
    4 * 2048 * 2048 + 2 * 2048 + 2 * 2048 + 64 * 2048
)  # q/k/v/o, q/k norms, norms, router
LAYER_ROWS = 3 * 2048 + 2048 + 64  # q, k, v; o; the router
TAIL_PARAMS = 50304 * 2048 + 2048


def _stage(manifest, role: str) -> int:
    return next(s.bytes for s in manifest.stages if s.role == role)


@pytest.mark.parametrize(
    ("spec", "expert", "layer", "token"),
    [
        ("fp32", 4 * EXPERT_PARAMS, 4 * LAYER_PARAMS, 4 * 2048),
        ("bf16", 2 * EXPERT_PARAMS, 2 * LAYER_PARAMS, 2 * 2048),
        ("int8", EXPERT_PARAMS + 4 * EXPERT_ROWS, LAYER_PARAMS + 4 * LAYER_ROWS, 4 * 2048),
        ("stack=bf16,experts=int8", EXPERT_PARAMS + 4 * EXPERT_ROWS, 2 * LAYER_PARAMS, 2 * 2048),
    ],
)
def test_shape_stage_bytes_follow_the_precision(
    spec: str, expert: int, layer: int, token: int
) -> None:
    shape = load_shape("olmoe")
    assert (shape.expert_params, shape.layer_params) == (EXPERT_PARAMS, LAYER_PARAMS)
    manifest = shape.manifest(parse_weights(spec))
    assert (_stage(manifest, "expert"), _stage(manifest, "layer")) == (expert, layer)
    assert manifest.token_bytes_in == manifest.token_bytes_out == token
    assert manifest.weights == parse_weights(spec).label()
    assert manifest.precision == parse_weights(spec)
    tail_width = 2 if spec.startswith(("bf16", "stack=bf16")) else {"fp32": 4, "int8": 1}[spec]
    assert _stage(manifest, "tail") == TAIL_PARAMS * tail_width + 4 * 50304 * (spec == "int8")


def test_a_shape_defaults_to_its_published_precision() -> None:
    mixtral = load_shape("mixtral")
    assert mixtral.dtype == "bfloat16"
    assert mixtral.manifest() == mixtral.manifest(parse_weights("bf16"))
    assert mixtral.manifest().token_bytes_in == 2 * mixtral.hidden
    fp32 = mixtral.model_copy(update={"dtype": "float32"})
    assert fp32.manifest().weights == "fp32" and fp32.manifest().token_bytes_in == 4 * 4096


def _params(spec: str) -> float:
    manifest = load_shape("olmoe").manifest(parse_weights(spec))
    return sum(manifest.params(stage) for stage in manifest.stages)


def test_parameters_are_recovered_alike_at_every_precision() -> None:
    shape = load_shape("olmoe")
    specs = ("fp32", "bf16", "int8", "stack=bf16,experts=int8", "stack=fp32,experts=bf16")
    params = {spec: _params(spec) for spec in specs}
    exact = shape.total_params()  # untied: the tail's LM head is a weight of its own
    assert params["fp32"] == params["bf16"] == params["stack=fp32,experts=bf16"] == exact
    # int8 counts its per-channel scales as values: a quarter percent more
    assert exact < params["stack=bf16,experts=int8"] < params["int8"] < exact * 1.003


def test_the_kv_cache_follows_the_stack() -> None:
    shape = load_shape("olmoe")
    per_layer = 2 * 16 * 128  # keys and values of 16 heads of 128
    assert shape.kv_bytes_per_token(parse_weights("fp32")) == 16 * per_layer * 4
    assert shape.kv_bytes_per_token(parse_weights("int8")) == 16 * per_layer * 4
    assert shape.kv_bytes_per_token() == shape.kv_bytes_per_token(parse_weights("bf16"))
    assert shape.kv_bytes_per_token(parse_weights("stack=bf16,experts=int8")) == 16 * per_layer * 2


def _instance(spec: str, calibration=None):
    counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024, weights=spec)
    assert counts.manifest is not None
    cal = calibration or load_calibration()
    return instance_for(counts.manifest, counts.counts, cal, tokens=1024)


def test_cpu_compute_scales_by_the_precision_speed() -> None:
    cal = load_calibration()
    speed = cal.weights_speed
    assert speed is not None
    ratio = speed["int8"].compute
    assert 0 < ratio < 1  # measured: int8 computes an expert faster than fp32 here
    fp32, int8 = _instance("fp32"), _instance("int8")
    # the same weights, timed at int8's speed (its scales add a quarter percent of FLOPs)
    np.testing.assert_allclose(int8.compute_s, fp32.compute_s * ratio, rtol=3e-3)
    assert (int8.layer_s < fp32.layer_s).all()  # the layer stages compute at int8's speed too
    mixed = _instance("stack=fp32,experts=int8")
    np.testing.assert_allclose(mixed.compute_s, int8.compute_s)
    np.testing.assert_allclose(mixed.layer_s, fp32.layer_s)


def test_the_decode_floor_scales_by_the_stack_precision() -> None:
    cal = load_calibration()
    floor = cal.decode_layer_floor_s
    assert floor is not None
    assert cal.weights_speed is not None
    int8 = cal.weights_speed["int8"].decode_floor
    for spec, ratio in (("fp32", 1.0), ("int8", int8), ("stack=fp32,experts=int8", 1.0)):
        counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024, weights=spec)
        assert counts.manifest is not None
        ginst = generation_instance(counts.manifest, counts.counts / 1024, cal)
        assert ginst.layer_floor_s == pytest.approx(floor * ratio)


def test_a_precision_the_calibration_does_not_time_is_refused() -> None:
    cal = load_calibration()
    only_bf16 = cal.model_copy(
        update={"weights_speed": {"bf16": WeightsSpeed(compute=1.0, decode_floor=1.0)}}
    )
    with pytest.raises(CalibrationError, match="no weights_speed for int8") as caught:
        _instance("int8", only_bf16)
    assert "moelambda calibrate" in str(caught.value.fix)
    _instance("fp32", cal.model_copy(update={"weights_speed": None}))  # fp32 needs none


def test_the_calibration_stores_no_speed_for_fp32(tmp_path: Path) -> None:
    from planner.calibration import default_calibration_path

    raw = json.loads(default_calibration_path().read_text())
    raw["parameters"]["weights_speed"]["value"]["fp32"] = {"compute": 1, "decode_floor": 1}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="fp32"):
        load_calibration(path)


def test_olmoe_at_int8_is_weighed_in_one_function() -> None:
    """At bf16 OLMoE's 13.8 GB do not fit Lambda's 10,240 MB; at int8 its 6.9 GB do, and one
    function holding them wins a 1,024-token batch, each shape's verdict saying why."""
    cal = load_calibration()
    options = PlanOptions(concurrency_quota=None, pack="1")  # one expert a function: quick
    bf16 = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024)
    assert bf16.manifest is not None
    alone = dataclasses.replace(options, deployment="monolithic")
    with pytest.raises(InfeasibleError, match=r"weights 13\.8 GB > 10,240 MB"):
        plan_deployment(bf16.manifest, bf16, cal, options=alone)
    int8 = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024, weights="int8")
    assert int8.manifest is not None
    planned = plan_deployment(int8.manifest, int8, cal, options=options)
    assert planned.summary["weights"] == "int8" and planned.plan.model.weights == "int8"
    listed = {c["deployment"]: c for c in planned.summary["candidates"]}
    assert set(listed) == {"monolithic", "driver", "workflow"}
    whole = listed["monolithic"]
    assert whole["weights_mb"] == pytest.approx(6.937e9 / 2**20, rel=1e-3)
    assert whole["feasible"] and whole["bill_usd"] > 0
    assert whole["verdict"] == "chosen: the cheapest feasible shape"
    assert planned.summary["deployment"] == "monolithic"
    for other in ("driver", "workflow"):
        assert listed[other]["verdict"].startswith("not chosen: $")
        assert listed[other]["verdict"].endswith("a batch more than the monolithic")
    # at 10,240 tokens the weights still fit, a batch's activations do not: said as such
    big = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=10240, weights="int8")
    assert big.manifest is not None
    with pytest.raises(InfeasibleError, match=r"weights 6\.9 GB, the runtime and a batch's") as e:
        plan_deployment(big.manifest, big, cal, options=alone)
    assert "fewer --tokens" in e.value.fix


def test_why_not_names_the_precision_a_kind_does_not_compute() -> None:
    cal = load_calibration()
    bf16, int8 = parse_weights("bf16"), parse_weights("int8")
    assert "lambda_cpu_bf16" in hardware.why_not("cpu", bf16, cal)
    assert hardware.why_not("cpu", int8, cal) is None
    assert "no int8 kernel" in hardware.why_not("gpu", int8, cal)
    assert hardware.why_not("gpu", bf16, cal) is None
    # a GPU driver runs the stack and its local experts, the CPU functions the other experts
    assert hardware.why_not("gpu+cpu", Weights(stack="bf16", experts="fp32"), cal) is None
    assert "lambda_cpu_bf16" in hardware.why_not("gpu+cpu", bf16, cal)
    assert "no int8 kernel" in hardware.why_not("gpu+cpu", Weights(experts="int8"), cal)
    computes = cal.model_copy(update={"lambda_cpu_bf16": {"x86_64": True, "arm64": False}})
    assert hardware.why_not("cpu", bf16, computes) is None
    assert hardware.why_not("cpu", bf16, computes, arch="arm64") is not None


STREAM = {"traffic": "poisson:2", "slo_p99_s": 30.0, "hours": 0.25}


def test_gpu_functions_with_int8_weights_are_never_chosen() -> None:
    counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1000, weights="int8")
    assert counts.manifest is not None
    with pytest.raises(InfeasibleError, match="no int8 kernel") as caught:
        plan_traffic_on_hardware(
            counts.manifest, counts, load_calibration(), hardware="gpu", **STREAM
        )
    assert "--weights" in str(caught.value.fix)


def test_cpu_functions_with_bf16_weights_are_never_chosen() -> None:
    """bf16 (OLMoE's published precision): the CPU row is refused with its reason, not
    planned for the stream, and a GPU-backed plan is chosen."""
    counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1000)
    assert counts.manifest is not None and counts.manifest.weights == "bf16"
    plan, summary = plan_traffic_on_hardware(
        counts.manifest, counts, load_calibration(), hardware="auto", **STREAM
    )
    cpu = summary["hardware"]["cpu"]
    assert not cpu["deployable"] and "lambda_cpu_bf16" in cpu["not_chosen_because"]
    assert summary["hardware_chosen"] != "cpu" and summary["weights"] == "bf16"
    assert plan.traffic is not None and plan.traffic.accelerated
    assert plan.model.weights == "bf16"


def test_a_real_export_cpu_lambda_cannot_run_is_refused_a_shape_is_priced_with_a_note() -> None:
    counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024)
    assert counts.manifest is not None
    cal = load_calibration()
    options = PlanOptions(deployment="workflow", concurrency_quota=None)
    priced = plan_deployment(counts.manifest, counts, cal, options=options)
    assert "lambda_cpu_bf16" in priced.summary["weights_note"]
    exported = counts.manifest.model_copy(update={"family": "decoder", "model_type": "olmoe"})
    with pytest.raises(UsageError, match="cannot run on CPU Lambda") as caught:
        plan_deployment(exported, counts, cal, options=options)
    assert "--weights fp32 or int8" in str(caught.value.fix)
    assert "--hardware gpu" in str(caught.value.fix)
    fp32 = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024, weights="fp32")
    assert fp32.manifest is not None
    runs = fp32.manifest.model_copy(update={"family": "decoder", "model_type": "olmoe"})
    assert plan_deployment(runs, fp32, cal, options=options).summary["weights_note"] is None


def test_a_plan_records_its_weights_and_is_read_back_at_them(tmp_path: Path) -> None:
    counts = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024, weights="int8")
    assert counts.manifest is not None
    options = PlanOptions(deployment="workflow", concurrency_quota=None)
    planned = plan_deployment(counts.manifest, counts, load_calibration(), options=options)
    path = tmp_path / "plan.json"
    planned.plan.save(path)
    loaded = Plan.load(path)
    assert loaded.model.weights == "int8"
    assert manifest_of_plan(loaded) == counts.manifest
    old = json.loads(path.read_text())
    del old["model"]["weights"]  # a plan made before precisions: its shape's published one
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert manifest_of_plan(Plan.load(tmp_path / "old.json")).weights == "bf16"


def test_plan_refuses_an_unknown_precision_with_exit_2() -> None:
    result = runner.invoke(app, ["plan", "--shape", "olmoe", "--weights", "bogus"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "'bogus' is not a precision" in text and "fp32, bf16, int8" in text


def test_plan_refuses_weights_without_a_shape(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["plan", "--counts", str(tmp_path / "c.json"), "--weights", "int8"]
    )
    assert result.exit_code == 2
    assert "moelambda profile" in " ".join(result.output.split())


def test_plan_a_shape_at_int8_names_its_weights(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app,
        [
            *("plan", "--shape", "olmoe", "--weights", "int8", "--tokens", "1024"),
            *("--pack", "1", "--out", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "(int8 weights)" in text and "6,616 MB" in text
    assert "monolithic (chosen)" in text
    assert json.loads(out.read_text())["model"]["weights"] == "int8"
