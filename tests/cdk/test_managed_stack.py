"""A plan whose functions run on Lambda Managed Instances deploys a VPC without a route out,
its endpoints, one capacity provider of the plan's instance type, and each managed function
attached with its fixed pool; cdk-nag, cfn-lint and checkov stay clean; a plan without managed
capacity synthesises exactly as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ground.plan import Plan
from tests.cdk.test_scanners import CHECKOV, _checkov
from tests.cdk.test_stack import _resources, _synth, small_plan
from tests.traffic.plans import with_traffic

MANAGED = {"head": 2, "layer00": 1, "layer00/expert01": 3}


def managed_plan() -> Plan:
    policies = {
        name: {"policy": "managed", "managed_environments": count, "managed_memory_mb": 4096}
        for name, count in MANAGED.items()
    }
    return with_traffic(
        small_plan(("s3", "pipelined", "direct")),
        max_batch_tokens=2048,
        max_wait_s=1.0,
        policies=policies,
        spec="poisson:5",
        managed_instance_type="m7i.xlarge",
        managed_instances=3,
    )


@pytest.fixture(scope="module")
def synthesised(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("managed-synth")
    summary, template = _synth(tmp, managed_plan())
    assert summary["cfn_lint"]["ok"], summary["cfn_lint"]["error_messages"]
    return template, Path(summary["template"])


def test_one_capacity_provider_of_the_plans_instance_type(synthesised) -> None:  # type: ignore[no-untyped-def]
    template, _ = synthesised
    (provider,) = _resources(template, "AWS::Lambda::CapacityProvider").values()
    props = provider["Properties"]
    assert props["InstanceRequirements"]["AllowedInstanceTypes"] == ["m7i.xlarge"]
    assert props["InstanceRequirements"]["Architectures"] == ["x86_64"]
    assert len(props["VpcConfig"]["SubnetIds"]) >= 2
    assert not _resources(template, "AWS::EC2::NatGateway")
    assert not _resources(template, "AWS::EC2::InternetGateway")
    endpoints = _resources(template, "AWS::EC2::VPCEndpoint").values()
    services = sorted(json.dumps(e["Properties"]["ServiceName"]) for e in endpoints)
    assert len(services) == 3
    assert any(".s3" in s for s in services) and any("lambda" in s for s in services)
    assert any("logs" in s for s in services)


def test_managed_functions_attach_with_their_pool(synthesised) -> None:  # type: ignore[no-untyped-def]
    template, _ = synthesised
    attached = {
        k: f["Properties"]
        for k, f in _resources(template, "AWS::Lambda::Function").items()
        if "CapacityProviderConfig" in f["Properties"]
    }
    pools = sorted(
        p["FunctionScalingConfig"]["MinExecutionEnvironments"] for p in attached.values()
    )
    assert pools == sorted(MANAGED.values())
    for props in attached.values():
        config = props["CapacityProviderConfig"]["LambdaManagedInstancesCapacityProviderConfig"]
        assert config["ExecutionEnvironmentMemoryGiBPerVCpu"] == 2
        assert config["PerExecutionEnvironmentMaxConcurrency"] == 1
        scaling = props["FunctionScalingConfig"]
        assert scaling["MinExecutionEnvironments"] == scaling["MaxExecutionEnvironments"]
        assert props["MemorySize"] == 4096
        assert "ReservedConcurrentExecutions" not in props


def test_a_plan_without_managed_capacity_synthesises_as_before(tmp_path: Path) -> None:
    from tests.cdk.test_traffic_stack import traffic_plan

    _, template = _synth(tmp_path, traffic_plan())
    for kind in ("AWS::Lambda::CapacityProvider", "AWS::EC2::VPC", "AWS::EC2::VPCEndpoint"):
        assert not _resources(template, kind)
    assert not any(
        "CapacityProviderConfig" in f["Properties"]
        for f in _resources(template, "AWS::Lambda::Function").values()
    )


@pytest.mark.skipif(not CHECKOV.exists(), reason="checkov's venv is not installed")
def test_checkov_finds_nothing_unexplained(synthesised) -> None:  # type: ignore[no-untyped-def]
    _, path = synthesised
    report = _checkov(path)
    failed = report["results"]["failed_checks"]
    assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]
