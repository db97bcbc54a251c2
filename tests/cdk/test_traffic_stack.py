"""A plan made for traffic deploys its capacity: provisioned concurrency as a version and a
`live` alias that the workflow and the gates invoke, warmers as EventBridge Scheduler
schedules with a role that may invoke only the warmed functions; cdk-nag, cfn-lint and checkov
stay clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ground.plan import Plan
from tests.cdk.test_scanners import CHECKOV, _checkov
from tests.cdk.test_stack import _resources, _synth, small_plan
from tests.traffic.plans import with_traffic


def traffic_plan() -> Plan:
    provisioned = {"head": 2, "layer00/expert01": 1, "layer01/expert00": 1, "layer02/expert02": 2}
    policies: dict[str, dict[str, Any]] = {
        name: {"policy": "provisioned", "provisioned_concurrency": count}
        for name, count in provisioned.items()
    }
    for name in ("tail", "layer01", "layer00/expert00"):
        policies[name] = {"policy": "warmer", "warmer_interval_s": 300.0, "warmer_concurrency": 2}
    return with_traffic(
        small_plan(("s3", "pipelined", "direct")),
        max_batch_tokens=2048,
        max_wait_s=0.5,
        policies=policies,
        spec="poisson:1",
    )


@pytest.fixture(scope="module")
def synthesised(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("traffic-synth")
    summary, template = _synth(tmp, traffic_plan())
    assert summary["cfn_lint"]["ok"], summary["cfn_lint"]["error_messages"]
    return template, Path(summary["template"])


def _ref_id(value: Any) -> str:
    return json.dumps(value)


def test_provisioned_functions_get_a_live_alias(synthesised) -> None:  # type: ignore[no-untyped-def]
    template, _ = synthesised
    aliases = _resources(template, "AWS::Lambda::Alias")
    got = sorted(
        a["Properties"]["ProvisionedConcurrencyConfig"]["ProvisionedConcurrentExecutions"]
        for a in aliases.values()
    )
    assert got == [1, 1, 2, 2]
    assert all(a["Properties"]["Name"] == "live" for a in aliases.values())
    assert len(_resources(template, "AWS::Lambda::Version")) == 4


def test_the_workflow_and_gates_invoke_the_aliases(synthesised) -> None:  # type: ignore[no-untyped-def]
    template, _ = synthesised
    text = json.dumps(template)
    aliases = list(_resources(template, "AWS::Lambda::Alias"))
    for alias in aliases:
        assert text.count(f'"Ref": "{alias}"') >= 1, alias  # referenced, not only declared
    machine = _resources(template, "AWS::StepFunctions::StateMachine")
    definition = json.dumps(next(iter(machine.values()))["Properties"]["DefinitionString"])
    head_alias = next(a for a in aliases if a.startswith("FunctionsHeadLive"))
    assert head_alias in definition
    direct_gate = next(
        f
        for k, f in _resources(template, "AWS::Lambda::Function").items()
        if k.startswith("FunctionsLayer02") and "Expert" not in k
    )
    layer_plan = json.dumps(direct_gate["Properties"]["Environment"]["Variables"])
    assert ":live" in layer_plan  # the direct gate invokes its provisioned expert's alias


def test_warmers_are_schedules_with_a_narrow_role(synthesised) -> None:  # type: ignore[no-untyped-def]
    template, _ = synthesised
    schedules = _resources(template, "AWS::Scheduler::Schedule")
    assert len(schedules) == 3 * 2  # three warmed functions, two concurrent pings each
    for schedule in schedules.values():
        props = schedule["Properties"]
        assert props["ScheduleExpression"] == "rate(5 minutes)"
        assert json.loads(props["Target"]["Input"]) == {"warmer": True}
    roles = [
        r
        for r in _resources(template, "AWS::IAM::Role").values()
        if "scheduler.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    assert len(roles) == 1
    (statement,) = roles[0]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "lambda:InvokeFunction"
    assert len(statement["Resource"]) == 3 and "*" not in json.dumps(statement["Resource"])


@pytest.mark.skipif(not CHECKOV.exists(), reason="checkov's venv is not installed")
def test_checkov_finds_nothing_unexplained(synthesised) -> None:  # type: ignore[no-untyped-def]
    _, path = synthesised
    report = _checkov(path)
    failed = report["results"]["failed_checks"]
    assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]


def test_a_warmer_interval_must_be_whole_minutes() -> None:
    doc = traffic_plan().model_dump()
    for entry in doc["traffic"]["capacity"]:
        if entry["policy"] == "warmer":
            entry["warmer_interval_s"] = 150.0
    with pytest.raises(ValueError, match="whole"):
        Plan.model_validate(doc)


def test_provisioned_beyond_the_reservation_is_refused(tmp_path: Path) -> None:
    from ground.errors import UsageError
    from tests.cdk.test_stack import MAX_REPLICAS

    doc = traffic_plan().model_dump()
    for entry in doc["traffic"]["capacity"]:
        if entry["function"] == "layer02/expert02":
            entry["provisioned_concurrency"] = MAX_REPLICAS[2][2] + 1
    from cdk.app import build_app

    path = Plan.model_validate(doc).save(tmp_path / "plan.json")
    with pytest.raises(UsageError, match="exceeds"):
        build_app(path, tmp_path / "cdk.out")


def _only(template: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    (found,) = _resources(template, kind).items()
    return found


def test_the_front_door_is_a_queue_with_a_dead_letter_queue_and_a_mapping(synthesised) -> None:  # type: ignore[no-untyped-def]
    """The plan's policy (2,048 tokens, 0.5 s) deploys as a 1 s window (whole seconds) and
    2,048 messages per delivery; both queues are encrypted and refuse plain HTTP."""
    from ground.frontdoor import deployed_window_s, records_per_delivery

    template, _ = synthesised
    queues = _resources(template, "AWS::SQS::Queue")
    assert len(queues) == 2
    (main_id,) = [k for k, q in queues.items() if "RedrivePolicy" in q["Properties"]]
    (dlq_id,) = [k for k in queues if k != main_id]
    redrive = queues[main_id]["Properties"]["RedrivePolicy"]
    assert redrive == {
        "deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]},
        "maxReceiveCount": 5,
    }
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    policies = _resources(template, "AWS::SQS::QueuePolicy").values()
    secured = {p["Properties"]["Queues"][0]["Ref"] for p in policies}
    assert secured == set(queues)
    for policy in policies:
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Effect"] == "Deny"
        assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    _, mapping = _only(template, "AWS::Lambda::EventSourceMapping")
    props = mapping["Properties"]
    plan = traffic_plan()
    assert plan.traffic is not None
    window = deployed_window_s(plan.traffic.max_wait_s, 300)
    assert props["MaximumBatchingWindowInSeconds"] == window == 1
    assert props["BatchSize"] == records_per_delivery(
        plan.traffic.max_batch_tokens, window, max_records=10_000, max_records_without_window=10
    )
    assert props["EventSourceArn"] == {"Fn::GetAtt": [main_id, "Arn"]}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    batcher_id = props["FunctionName"]["Ref"]
    batcher = template["Resources"][batcher_id]["Properties"]
    assert batcher["ImageConfig"]["Command"] == ["functions.batcher.handler"]
    assert batcher["Environment"]["Variables"]["MOELAMBDA_MAX_BATCH_TOKENS"] == "2048"
    # Step Functions' 256 KiB less the room the tail's payload needs (it carries the input).
    assert batcher["Environment"]["Variables"]["MOELAMBDA_INPUT_LIMIT"] == str(262144 - 8192)
    # The queue hides a delivered message longer than the batcher may run.
    assert queues[main_id]["Properties"]["VisibilityTimeout"] >= 6 * batcher["Timeout"]


def test_the_batcher_may_only_consume_its_queue_start_its_workflow_and_write_inputs(
    synthesised,  # type: ignore[no-untyped-def]
) -> None:
    from tests.cdk.test_stack import _policies

    template, _ = synthesised
    _, mapping = _only(template, "AWS::Lambda::EventSourceMapping")
    batcher = template["Resources"][mapping["Properties"]["FunctionName"]["Ref"]]
    statements = _policies(template, batcher)
    queue = mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
    machine, _ = _only(template, "AWS::StepFunctions::StateMachine")
    bucket, _ = _only(template, "AWS::S3::Bucket")
    group = batcher["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    got = sorted(
        (
            tuple(sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"])),
            s["Resource"],
        )
        for s in statements
    )
    assert all(s["Effect"] == "Allow" and "Condition" not in s for s in statements)
    assert got == sorted(
        [
            (("s3:PutObject",), f"<{bucket}.Arn>/inputs/fd-*"),
            (
                ("sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:ReceiveMessage"),
                f"<{queue}.Arn>",
            ),
            (("states:StartExecution",), f"<Ref:{machine}>"),
            (("logs:CreateLogStream", "logs:PutLogEvents"), f"<{group}.Arn>:*"),
        ]
    )


def _tail(template: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The tail's state in the workflow and its S3 PutObject resources."""
    from tests.cdk.test_stack import _definition, _policies

    tail = _definition(template)["States"]["Tail"]
    (function,) = [
        r
        for r in _resources(template, "AWS::Lambda::Function").values()
        if r["Properties"].get("ImageConfig", {}).get("Command") == ["functions.tail.handler"]
    ]
    puts = [
        r
        for s in _policies(template, function)
        if "s3:PutObject" in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
    ]
    return tail, puts


def test_the_tail_writes_each_request_s_result_only_behind_the_front_door(
    synthesised,  # type: ignore[no-untyped-def]
) -> None:
    import aws_cdk as cdk

    from cdk.stack import MoeServingStack
    from tests.cdk.test_stack import small_plan

    template, _ = synthesised
    tail, puts = _tail(template)
    assert tail["Parameters"]["Payload"]["input.$"] == "$$.Execution.Input"
    assert any(str(r).endswith("/results/*") for r in puts), puts
    stack = MoeServingStack(cdk.App(), "NoTraffic", plan=small_plan(("s3",)))
    plain, puts = _tail(cdk.assertions.Template.from_stack(stack).to_json())
    assert "input.$" not in plain["Parameters"]["Payload"]
    assert not any("results/" in str(r) for r in puts), puts


def test_a_plan_without_traffic_has_no_front_door() -> None:
    """The small plan's stack (tests/cdk/test_stack.py) as synthesised there, without traffic."""
    import aws_cdk as cdk

    from cdk.stack import MoeServingStack
    from tests.cdk.test_stack import small_plan

    stack = MoeServingStack(cdk.App(), "NoTraffic", plan=small_plan(("s3",)))
    template = cdk.assertions.Template.from_stack(stack).to_json()
    assert stack.front_door is None and stack.functions.batcher is None
    kinds = {r["Type"] for r in template["Resources"].values()}
    assert not kinds & {"AWS::SQS::Queue", "AWS::Lambda::EventSourceMapping"}


def test_cdk_nag_fails_a_wildcard_added_to_the_batcher(tmp_path: Path) -> None:
    """The batcher's one acknowledged wildcard is its `inputs/fd-*` key pattern: a statement
    letting it start any state machine fails synthesis, named at its role."""
    import aws_cdk as cdk
    from aws_cdk import aws_iam as iam

    from cdk.app import add_stack
    from cdk.nag import REPORT, add_checks, findings

    app = cdk.App(outdir=str(tmp_path / "bad"))
    stack = add_stack(app, traffic_plan().save(tmp_path / "plan.json"))
    stack.functions.batcher.role.add_to_principal_policy(
        iam.PolicyStatement(actions=["states:StartExecution"], resources=["*"])
    )
    add_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    found = findings(tmp_path / "bad" / REPORT)
    assert found and all(rule.startswith("AwsSolutions-IAM5") for rule, _ in found)
    assert all("/BatcherRole/" in path for _, path in found)
