"""A driver plan whose driver and one remote expert run on GPU-backed Lambda Managed Instances:
each of exactly those functions carries its planned `AcceleratorConfig`, the capacity provider
allows only the planned GPU type on x86_64 and scales on GPU utilisation at the planned target
within the planned instances' vCPUs; cdk-nag, cfn-lint and checkov stay clean, cfn-lint's one
gap (its schema predates AcceleratorConfig) is ignored on those functions only, and so is the
same gap of aws-cdk-lib's synth-time validation (F3002), acknowledged with its reason. A CPU
pool with a target scales on CPU utilisation; a pool under the smallest vCPU cap CDK takes, and a
plan Lambda cannot run (a GPU on arm64, a size Lambda does not offer), are refused by name."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ground.plan import Plan
from moelambda.cli import app
from moelambda.cli.synth import lint_template
from tests.cdk.test_driver_stack import _by_handler, driver_plan
from tests.cdk.test_managed_stack import managed_plan
from tests.cdk.test_scanners import CHECKOV, _checkov
from tests.cdk.test_stack import _resources, _synth, runner
from tests.traffic.plans import with_traffic

ACCELERATOR_GIB = {"driver": 24, "layer01/expert00": 6}
ENVIRONMENTS = {"driver": 1, "layer01/expert00": 2}
INSTANCE_TYPE, INSTANCES, TARGET = "g6.xlarge", 3, 0.6


def gpu_plan(
    accelerators: dict[str, int] = ACCELERATOR_GIB,
    *,
    arch: str = "x86_64",
    instance_listed: bool = True,
) -> Plan:
    """The driver plan with its driver and one remote expert managed on `INSTANCE_TYPE`s, each
    with its GPU memory from `accelerators`, scaling to `TARGET` GPU utilisation; the packaged
    calibration's sizes and instance types (without `INSTANCE_TYPE` unless `instance_listed`)."""
    base = driver_plan(arch=arch)
    calibration = dict(base.calibration)
    prices = dict(calibration["ec2_instance_prices"])
    if not instance_listed:
        del prices[INSTANCE_TYPE]
    calibration["ec2_instance_prices"] = prices
    policies = {
        name: {
            "policy": "managed",
            "managed_environments": ENVIRONMENTS[name],
            "managed_memory_mb": 8192 if name == "driver" else 4096,
            "accelerator_memory_gib": gib,
        }
        for name, gib in accelerators.items()
    }
    return with_traffic(
        base.model_copy(update={"calibration": calibration}),
        max_batch_tokens=2048,
        max_wait_s=1.0,
        policies=policies,
        spec="poisson:5",
        managed_instance_type=INSTANCE_TYPE,
        managed_instances=INSTANCES,
        managed_target_utilisation=TARGET,
    )


@pytest.fixture(scope="module")
def synthesised(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    summary, template = _synth(tmp_path_factory.mktemp("gpu-synth"), gpu_plan())
    return summary, template, Path(summary["template"])


def _accelerators(template: dict[str, Any]) -> dict[str, int]:
    """Each function's AcceleratorMemorySize, by its logical ID (functions with none left out)."""
    return {
        key: fn["Properties"]["AcceleratorConfig"]["AcceleratorMemorySize"]
        for key, fn in _resources(template, "AWS::Lambda::Function").items()
        if "AcceleratorConfig" in fn["Properties"]
    }


def test_exactly_the_planned_functions_get_their_gpu_memory(synthesised) -> None:  # type: ignore[no-untyped-def]
    _, template, _ = synthesised
    (driver,) = _by_handler(template, "driver")
    (expert,) = [
        key
        for key, fn in _by_handler(template, "expert").items()
        if fn["Properties"]["Environment"]["Variables"]["MOELAMBDA_LAYER"] == "1"
        and fn["Properties"]["Environment"]["Variables"]["MOELAMBDA_EXPERT"] == "0"
    ]
    assert _accelerators(template) == {driver: 24, expert: 6}
    for key in (driver, expert):
        props = template["Resources"][key]["Properties"]
        assert props["PackageType"] == "Image" and props["Architectures"] == ["x86_64"]
        assert "CapacityProviderConfig" in props
        pool = props["FunctionScalingConfig"]
        assert pool["MinExecutionEnvironments"] == pool["MaxExecutionEnvironments"]
    pools = sorted(
        f["Properties"]["FunctionScalingConfig"]["MinExecutionEnvironments"]
        for f in _resources(template, "AWS::Lambda::Function").values()
        if "CapacityProviderConfig" in f["Properties"]
    )
    assert pools == sorted(ENVIRONMENTS.values())  # the GPU functions, and only they


def _image_build_args(template: dict[str, Any], cdk_out: Path) -> dict[str, dict[str, str]]:
    """Each function's image build arguments (its asset's, from the cloud assembly's asset
    manifest), by its logical ID."""
    images = json.loads((cdk_out / "MoeLambda.assets.json").read_text())["dockerImages"]
    out = {}
    for key, fn in _resources(template, "AWS::Lambda::Function").items():
        uri = fn["Properties"]["Code"]["ImageUri"]["Fn::Sub"]
        out[key] = images[uri.rsplit(":", 1)[1]]["source"].get("dockerBuildArgs", {})
    return out


def test_exactly_the_gpu_functions_run_cuda_torch_on_their_device(synthesised) -> None:  # type: ignore[no-untyped-def]
    """A GPU-backed function's image is Dockerfile.expert built with DEVICE=cuda and its
    handler places its stages on the device at bfloat16 (`ground.placement.GPU`); every other
    function keeps the CPU image and the CPU placement."""
    _, template, path = synthesised
    args = _image_build_args(template, path.parent)
    gpu = set(_accelerators(template))
    assert len(gpu) == 2
    for key, fn in _resources(template, "AWS::Lambda::Function").items():
        variables = fn["Properties"].get("Environment", {}).get("Variables", {})
        placed = {k: variables.get(k) for k in ("MOELAMBDA_DEVICE", "MOELAMBDA_DTYPE")}
        if key in gpu:
            assert args[key] == {"DEVICE": "cuda"}, key
            assert placed == {"MOELAMBDA_DEVICE": "cuda", "MOELAMBDA_DTYPE": "bfloat16"}
        else:
            assert "DEVICE" not in args[key], key
            assert placed == {"MOELAMBDA_DEVICE": None, "MOELAMBDA_DTYPE": None}, key


def test_the_provider_runs_the_planned_gpu_type_and_scales_on_gpu_utilisation(  # type: ignore[no-untyped-def]
    synthesised,
) -> None:
    _, template, _ = synthesised
    vcpus = gpu_plan().calibration["ec2_instance_prices"][INSTANCE_TYPE]["vcpus"]
    (provider,) = _resources(template, "AWS::Lambda::CapacityProvider").values()
    props = provider["Properties"]
    assert props["InstanceRequirements"] == {
        "AllowedInstanceTypes": [INSTANCE_TYPE],
        "Architectures": ["x86_64"],
    }
    assert props["CapacityProviderScalingConfig"] == {
        "MaxVCpuCount": INSTANCES * vcpus,
        "ScalingMode": "Manual",
        "ScalingPolicies": [
            {
                "PredefinedMetricType": "LambdaCapacityProviderAverageGPUUtilization",
                "TargetValue": 60,  # TARGET as a percentage
            }
        ],
    }


def test_no_vcpu_cap_is_invented_for_a_type_the_calibration_does_not_list(
    tmp_path: Path,
) -> None:
    _, template = _synth(tmp_path, gpu_plan(instance_listed=False), "--no-lint")
    (provider,) = _resources(template, "AWS::Lambda::CapacityProvider").values()
    scaling = provider["Properties"]["CapacityProviderScalingConfig"]
    assert "MaxVCpuCount" not in scaling
    assert scaling["ScalingPolicies"][0]["TargetValue"] == 60


def test_a_cpu_pool_with_a_target_scales_on_cpu_utilisation(tmp_path: Path) -> None:
    plan = managed_plan()
    assert plan.traffic is not None
    traffic = plan.traffic.model_copy(update={"managed_target_utilisation": 0.7})
    _, template = _synth(tmp_path, plan.model_copy(update={"traffic": traffic}), "--no-lint")
    (provider,) = _resources(template, "AWS::Lambda::CapacityProvider").values()
    assert provider["Properties"]["CapacityProviderScalingConfig"] == {
        "MaxVCpuCount": 3 * 4,  # 3 m7i.xlarge, as the packaged calibration lists it
        "ScalingMode": "Manual",
        "ScalingPolicies": [
            {
                "PredefinedMetricType": "LambdaCapacityProviderAverageCPUUtilization",
                "TargetValue": 70,
            }
        ],
    }
    assert not _accelerators(template)


def test_a_pool_under_cdks_smallest_vcpu_cap_is_refused_by_name(tmp_path: Path) -> None:
    plan = gpu_plan()
    assert plan.traffic is not None
    traffic = plan.traffic.model_copy(update={"managed_instances": 2})
    path = plan.model_copy(update={"traffic": traffic}).save(tmp_path / "plan.json")
    result = runner.invoke(app, ["synth", "--plan", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "2 g6.xlarge instances, 8 vCPUs" in result.output
    assert "at least 3 instances" in result.output


def test_cdk_nag_and_cfn_lint_pass_and_the_lint_ignore_hides_only_accelerator_config(  # type: ignore[no-untyped-def]
    synthesised, tmp_path: Path
) -> None:
    summary, template, _ = synthesised
    assert summary["cdk_nag"]["unacknowledged"] == 0  # else synthesis had failed
    assert summary["cfn_lint"]["ok"], summary["cfn_lint"]["error_messages"]
    ignoring = {
        key for key, r in template["Resources"].items() if "cfn-lint" in r.get("Metadata", {})
    }
    assert ignoring == set(_accelerators(template))
    for key in ignoring:
        assert template["Resources"][key]["Metadata"]["cfn-lint"] == {
            "config": {"ignore_checks": ["E3002"]}
        }
        del template["Resources"][key]["Metadata"]["cfn-lint"]
    bare = tmp_path / "without-ignores.json"
    bare.write_text(json.dumps(template))
    messages = lint_template(bare)["error_messages"]
    assert len(messages) == len(ignoring), messages
    for message in messages:
        assert message.startswith("E3002 ") and "'AcceleratorConfig'" in message, message
    assert {m.rsplit("(", 1)[1].split("/")[1] for m in messages} == ignoring


def test_synth_validation_prints_no_accelerator_config_warning(synthesised) -> None:  # type: ignore[no-untyped-def]
    """aws-cdk-lib's own synth-time validation (CloudFormation Validate) reads a schema without
    AcceleratorConfig and warned F3002 on every GPU function: each acknowledges it, with its
    reason, so the report synth prints (and writes beside the template) holds no violation."""
    from cdk._managed import ACCELERATOR_SCHEMA_REASON, ACCELERATOR_SCHEMA_RULE

    _, template, path = synthesised
    report = json.loads((path.parent / "validation-report.json").read_text())
    (validate,) = report["pluginReports"]
    assert validate["violations"] == [], validate["violations"]
    suppressed = validate["suppressedViolations"]
    assert {v["ruleName"] for v in suppressed} == {"F3002"}
    assert {v["acknowledgedId"] for v in suppressed} == {ACCELERATOR_SCHEMA_RULE}
    assert {v["reason"] for v in suppressed} == {ACCELERATOR_SCHEMA_REASON}
    assert all("'AcceleratorConfig'" in v["description"] for v in suppressed)
    acknowledged = {
        c["cloudFormationResource"]["logicalId"]
        for v in suppressed
        for c in v["violatingConstructs"]
    }
    assert acknowledged == set(_accelerators(template))  # those functions only


@pytest.mark.skipif(not CHECKOV.exists(), reason="checkov's venv is not installed")
def test_checkov_finds_nothing_unexplained(synthesised) -> None:  # type: ignore[no-untyped-def]
    _, _, path = synthesised
    report = _checkov(path)
    failed = report["results"]["failed_checks"]
    assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]


@pytest.mark.parametrize(
    ("arch", "accelerators", "message"),
    [
        ("arm64", ACCELERATOR_GIB, "GPU-backed functions run on x86_64 only"),
        ("x86_64", {"driver": 8, "layer01/expert00": 6},
         r"driver: accelerator_memory_gib 8 is not one of Lambda's AcceleratorMemorySize"),
    ],
)  # fmt: skip
def test_a_gpu_plan_lambda_cannot_run_is_refused(
    arch: str, accelerators: dict[str, int], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        gpu_plan(accelerators, arch=arch)


def test_a_planned_gpu_function_synthesises_with_its_accelerator(tmp_path: Path) -> None:
    """`planner.hardware.gpu_plan.plan_document`'s OLMoE in one GPU function, end to end to the
    template."""
    from tests.planner.test_gpu_plan import _planned

    plan, candidate = _planned("olmoe", "gpu")
    assert plan is not None
    summary, template = _synth(tmp_path, plan)
    assert summary["cfn_lint"]["ok"], summary["cfn_lint"]["error_messages"]
    assert sorted(_accelerators(template).values()) == [candidate.detail["driver_accelerator_gib"]]
    (provider,) = _resources(template, "AWS::Lambda::CapacityProvider").values()
    allowed = provider["Properties"]["InstanceRequirements"]["AllowedInstanceTypes"]
    assert allowed == [candidate.detail["instance_type"]]


def test_gpu_check_dry_names_the_plan_image_and_placement_and_refuses_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """scripts/gpu-check's dry form reads back from the synthesised stack what each GPU-backed
    function would run: the CUDA image and its placement, at its planned accelerator size.
    Without --dry, on a machine whose torch sees no GPU, it says so and exits 2."""
    import torch

    from runtime import gpu_check

    path = gpu_plan().save(tmp_path / "gpu-plan.json")
    assert gpu_check.main(["--plan", str(path), "--dry", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)["dry"]
    assert dry["instance_type"] == INSTANCE_TYPE and dry["instances"] == INSTANCES
    assert {f["function"]: f["accelerator_gib"] for f in dry["functions"]} == ACCELERATOR_GIB
    for f in dry["functions"]:
        assert f["placement"] == "cuda bfloat16"
        assert f["image"] == {"dockerfile": "Dockerfile.expert", "build_args": {"DEVICE": "cuda"}}
    if not torch.cuda.is_available():
        assert gpu_check.main(["--plan", str(path)]) == 2
        assert "no GPU here" in capsys.readouterr().err
    cpu = driver_plan().save(tmp_path / "cpu-plan.json")
    script = Path(__file__).parents[2] / "scripts" / "gpu-check"  # the command itself
    done = subprocess.run(
        [str(script), "--plan", str(cpu), "--dry"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "no GPU-backed function" in done.stderr, done.stderr
