"""The scanners' view of the serving stack: cdk-nag's AwsSolutions rules and checkov's
checks, and each finding the design accepts, with its reason where it is accepted.

`add_checks` registers the rule pack as a policy-validation plugin, so a finding fails
synthesis (`ValidationFailed`, with `validation-report.json` in the cloud assembly) unless it
is acknowledged here, on the narrowest construct it concerns, with the reason written beside
it. tests/cdk checks the IAM statements these acknowledgements cover resource by resource, so
a wildcard beyond the ones named here fails a test even though cdk-nag would not see it.

checkov reads the synthesised template; `skip_checkov` writes its skips into each resource's
Metadata (`checkov.skip`, each with a comment), and tests/cdk runs the pinned checkov on the
template and requires zero failed checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations

from ground.errors import MoelambdaError

__all__ = [
    "REPORT",
    "NagError",
    "acknowledge",
    "add_checks",
    "findings",
    "nag_error",
    "skip_checkov",
]

REPORT = "validation-report.json"  # where CDK writes the findings of a failed validation

_ROLE_WILDCARDS = (
    "Every wildcard is a key pattern of the function's own role (ground.access) that no "
    "narrower pattern can name before run time: the request id in requests/*/<layer>/... is "
    "the hash of each execution's ARN, the shards, minibatches and outputs under a layer's "
    "and expert's prefix are numbered per batch, weights/config/* holds the exported model "
    "config files, inputs/* and outputs/* are by execution name and request id, results/* "
    "by the SQS message id of each front-door or stream request (results/*/final.json, "
    "the answer a stream's worker looks for before admitting one); <log group "
    "ARN>:* are the log streams Lambda creates, and with --tracing '*' is for "
    "xray:PutTraceSegments, which takes no narrower resource. run-local enforces these "
    "policies on every request, and tests/cdk asserts each role's exact resources."
)


class NagError(MoelambdaError):
    """cdk-nag found something in the stack that no acknowledgement covers."""


def findings(report: Path) -> list[tuple[str, str]]:
    """(rule, construct path) of every unacknowledged finding in a validation report."""
    data = json.loads(report.read_text())
    return [
        (v["ruleName"], c["constructPath"])
        for plugin in data.get("pluginReports", [])
        for v in plugin.get("violations", [])
        for c in v.get("violatingConstructs", [])
    ]


def nag_error(outdir: Path) -> NagError:
    """The error for a synthesis that cdk-nag failed, naming the first findings."""
    found = findings(outdir / REPORT)
    shown = "; ".join(f"{rule} at {path}" for rule, path in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return NagError(
        f"cdk-nag's AwsSolutions rules found {len(found)} unacknowledged finding(s): "
        f"{shown}{more} (full report: {outdir / REPORT}).",
        "fix the construct, or acknowledge the finding in cdk/nag.py with the reason the "
        "design accepts it.",
    )


def add_checks(app: Any) -> None:
    """Run the AwsSolutions pack on everything in `app` when it is synthesised."""
    from cdk_nag import AwsSolutionsChecks

    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(stack: Any, *, tracing: bool) -> None:
    """Acknowledge the findings the design accepts, each with its reason, on `stack`'s parts.

    IAM5 findings are acknowledged one resource pattern at a time (cdk-nag names each
    `AwsSolutions-IAM5[Resource::<LogicalId.Arn>/pattern]`), so a new wildcard still fails.
    """
    streams = [f"<{_logical_id(g)}.Arn>:*" for g in stack.functions.log_groups()]
    xray = ["*"] if tracing else []  # xray:PutTraceSegments accepts no narrower resource
    for fn in stack.functions.all():
        access = stack.functions.access[fn.node.id]
        patterns = {*access.read, *access.write, *access.delete}
        # A nested stack names the bucket by its own parameter (cdk._functions).
        nested = Stack.of(fn) is not stack
        bucket = "<BucketArn>" if nested else f"<{_logical_id(stack.bucket)}.Arn>"
        keys = [f"{bucket}/{p}" for p in sorted(patterns) if "*" in p]
        _accept(fn.role, [_iam5(r) for r in keys + streams + xray], _ROLE_WILDCARDS)
    _accept(
        stack.bucket,
        ["AwsSolutions-S1"],
        "Server access logs would need a second bucket for short-lived request "
        "intermediates; reads and writes are auditable with CloudTrail data events instead.",
    )
    _acknowledge_managed(stack)
    if stack.workflow is None:  # a stream plan: its workers are its front door
        return
    machine = stack.workflow.state_machine
    _accept(
        machine.role,
        [_iam5(f"<{_logical_id(fn)}.Arn>:*") for fn in stack.functions.tasks()] + [_iam5("*")],
        "CDK's LambdaInvoke tasks grant <function ARN>:* (versions of the head, gates, tail, "
        "driver and cleanup), and log delivery and X-Ray need Resource '*' (CloudWatch Logs' "
        "CreateLogDelivery family and xray:PutTraceSegments accept no narrower resource).",
    )
    _accept(
        machine,
        ["AwsSolutions-SF1"],
        "The workflow logs ERROR events: logging ALL would bill every state of every "
        "request and record request keys; errors are what an operator needs.",
    )
    if not tracing:
        _accept(
            machine,
            ["AwsSolutions-SF2"],
            "X-Ray is opt-in (moelambda synth --tracing, cdk -c tracing=true): traces "
            "are billed per request.",
        )


def _acknowledge_managed(stack: Any) -> None:
    managed = stack.functions.managed
    if managed is not None:
        _accept(
            managed.provider.node.find_child("OperatorRole"),
            [
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                "AWSLambdaManagedEC2ResourceOperator]"
            ],
            "The capacity provider's operator role: Lambda assumes it to launch and manage the "
            "EC2 instances of Lambda Managed Instances, and AWS maintains this policy for "
            "exactly that (CDK's CapacityProvider attaches it); a copy would not follow "
            "the service's changes.",
        )


_CHECKOV_FUNCTION = {
    "CKV_AWS_116": "Invoked synchronously (the workflow's Tasks and Maps, a direct gate's "
    "RequestResponse Invoke); a dead-letter queue applies only to asynchronous invocations.",
    "CKV_AWS_117": "Reaches only S3 and Lambda through their public endpoints under IAM; a VPC "
    "would add NAT or endpoints, cold-start latency and cost, and guard nothing private.",
    "CKV_AWS_173": "The environment holds no secret (bucket name, weights prefix, layer plan, "
    "thread count); Lambda encrypts it at rest with its service key.",
    "CKV_AWS_115": "Experts reserve their max_replicas unless --no-reserve-concurrency; head, "
    "gates, tail and cleanup run once per request, and a reservation would take quota from "
    "the experts (throttling is retried by the workflow).",
}
_CHECKOV_BATCHER = {
    "CKV_AWS_116": "Invoked synchronously by its SQS event source mapping; a message it fails "
    "returns to the queue and, after 5 receives, moves to the queue's dead-letter queue, which "
    "is where a failed request is kept (a function DLQ applies only to asynchronous invokes).",
    "CKV_AWS_117": "Reaches only SQS, S3 and Step Functions through their public endpoints under "
    "IAM; a VPC would add NAT or endpoints, cold-start latency and cost, and guard nothing.",
    "CKV_AWS_173": "The environment holds no secret (bucket name, state machine ARN, batch cap); "
    "Lambda encrypts it at rest with its service key.",
    "CKV_AWS_115": "Its concurrency is the event source mapping's pollers' (one delivery per "
    "invocation); a reservation would take quota from the experts and throttle the pollers.",
}
_CHECKOV_QUEUE = {
    "CKV_AWS_27": "Encrypted at rest with SQS-managed server-side encryption (SSE-SQS, "
    "SqsManagedSseEnabled), which checkov 3.3.30 does not recognise (it looks for "
    "KmsMasterKeyId); a KMS key would bill its API calls and need kms:Decrypt for every client "
    "and the batcher, and protect nothing more from the roles that may read the queue.",
}
_CHECKOV_WORKER = {
    "CKV_AWS_116": "Invoked synchronously by its SQS event source mapping, and it deletes each "
    "message itself once the answer is written; a request whose worker fails reappears after "
    "the visibility timeout and, after 5 receives, moves to the queue's dead-letter queue (a "
    "function DLQ applies only to asynchronous invokes).",
    "CKV_AWS_117": "Reaches only SQS, S3 and Lambda (its remote experts) through their public "
    "endpoints under IAM; a VPC would add NAT or endpoints, cold-start latency and cost, and "
    "guard nothing private.",
    "CKV_AWS_173": "The environment holds no secret (bucket name, queue URL, the stream's "
    "settings, local experts, remote expert names); Lambda encrypts it at rest with its "
    "service key.",
}
_CHECKOV_ENDPOINT = {
    "CKV_AWS_116": "Invoked synchronously through its Function URL (SigV4-signed, AWS_IAM); a "
    "dead-letter queue applies only to asynchronous invocations.",
    "CKV_AWS_117": "Reaches only SQS and S3 through their public endpoints under IAM; a VPC "
    "would add NAT or endpoints, cold-start latency and cost, and guard nothing private.",
    "CKV_AWS_173": "The environment holds no secret (bucket name, queue URL, model id, the "
    "stream's settings); Lambda encrypts it at rest with its service key.",
    "CKV_AWS_115": "One invocation per client request, waiting on its answer: a reservation "
    "would take quota from the workers and experts and refuse clients beyond it; the workers' "
    "reservation is what bounds the stream's compute.",
}
_CHECKOV_LOGS = {
    "CKV_AWS_158": "Error logs of the handlers and the workflow, with no tensors or execution "
    "data; CloudWatch Logs encrypts them at rest, and a customer key would add a billed key.",
}
_CHECKOV_FLOW_LOGS = {
    "CKV_AWS_158": "The managed instances' VPC flow logs: addresses and ports of their "
    "connections to the endpoints, no payload; CloudWatch Logs encrypts them at rest, and a "
    "customer key would add a billed key.",
}
_CHECKOV_MANAGED = _CHECKOV_FUNCTION | {
    "CKV_AWS_117": "Runs on Lambda Managed Instances, in the stack's VPC: the capacity "
    "provider carries the subnets and security group (cdk/_managed.py), not the function's "
    "own VpcConfig, which is what checkov reads.",
}
_CHECKOV_BUCKET = {
    "CKV_AWS_18": "Server access logs would need a second bucket for short-lived request "
    "intermediates; CloudTrail data events audit reads and writes instead.",
    "CKV_AWS_21": "Intermediates live for one request and are deleted by it; versioning would "
    "keep every deleted intermediate. Weights are exported under a new prefix, not replaced.",
}


def skip_checkov(stack: Any) -> None:
    """Record, in each resource's Metadata, the checkov checks the design accepts and why."""
    functions = stack.functions
    managed = functions.managed
    on_instances = [] if managed is None else managed.functions
    own = {
        id(f): checks
        for f, checks in (
            (functions.batcher, _CHECKOV_BATCHER),
            (functions.worker, _CHECKOV_WORKER),
            (functions.endpoint, _CHECKOV_ENDPOINT),
        )
        if f is not None
    }
    for fn in functions.all():
        checks = _CHECKOV_MANAGED if fn in on_instances else _CHECKOV_FUNCTION
        _skip(fn, own.get(id(fn), checks))
    if managed is not None:
        _skip(managed.flow_logs, _CHECKOV_FLOW_LOGS)
    for door in (stack.front_door, stack.stream):
        if door is not None:
            _skip(door.queue, _CHECKOV_QUEUE)
            _skip(door.dead_letters, _CHECKOV_QUEUE)
    workflow = [] if stack.workflow is None else [stack.workflow.log_group]
    for group in [*functions.log_groups(), *workflow]:
        _skip(group, _CHECKOV_LOGS)
    _skip(stack.bucket, _CHECKOV_BUCKET)


def _skip(construct: Any, checks: dict[str, str]) -> None:
    skips = [{"id": check, "comment": why} for check, why in checks.items()]
    construct.node.default_child.add_metadata("checkov", {"skip": skips})


def _iam5(resource: str) -> str:
    return f"AwsSolutions-IAM5[Resource::{resource}]"


def _logical_id(construct: Any) -> str:
    """The CloudFormation logical ID of `construct`'s resource in its own (maybe nested)
    stack, as cdk-nag names it."""
    stack = Stack.of(construct)
    return str(stack.resolve(stack.get_logical_id(construct.node.default_child)))


def _accept(construct: Any, rules: list[str], reason: str) -> None:
    Validations.of(construct).acknowledge(*(Acknowledgment(id=r, reason=reason) for r in rules))
