"""The stack of a stream plan (`cdk._stream`): a request queue, the generation worker (the
plan's driver, `functions.worker`), its event source mapping and the endpoint behind a Function
URL, instead of a workflow; least privilege, enforced by the local evaluator too; refusals;
cfn-lint, cdk-nag and checkov clean."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from cdk._stream import ESM_MIN_CONCURRENCY, settings
from ground.driver import decode_local
from ground.plan import Plan
from moelambda.cli import app
from pipeline.iam import Policies, queue_arn, sqs_request
from tests.cdk.test_driver_stack import LOCAL, _by_handler, _policy, driver_plan
from tests.cdk.test_scanners import _checkov
from tests.cdk.test_stack import _render, _resources, _synth

runner = CliRunner()
MAX_TIMEOUT_S = 900  # the calibration's max_timeout_s

STREAM = {
    "traffic": {"spec": "poisson:1/s", "seconds": 600},
    "slots": 4,
    "workers": 3,
    "idle_exit_s": 30.0,
    "prefill_chunk_tokens": 256,
    "flush_tokens": 8,
    "poll_s": 0.5,
    "max_prompt_tokens": 1024,
    "max_new_tokens": 256,
    "visibility_timeout_s": 900,
    "step_s": [0.1, 0.11, 0.12, 0.13],
    "prefill_token_s": 0.002,
    "slo_ttft_s": 5.0,
    "slo_tpot_s": 0.25,
    "simulated": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.13},
}


def stream_plan(deployment: str = "driver", **change: Any) -> Plan:
    """`test_driver_stack.driver_plan` (layer 0: expert 1 remote, layer 1: all remote, layer 2
    all local; or monolithic) generating, with a stream block as the planner would add it."""
    base = driver_plan(deployment, workflow="standard").model_dump(mode="json")
    base["generation"] = {
        "batch_sequences": 1,
        "prompt_tokens": 64,
        "new_tokens": 32,
        "ttft_s": 1.0,
        "tpot_s": 0.1,
        "bill_per_million_input_usd": 1.0,
        "bill_per_million_output_usd": 1.0,
        "invokes_per_step": 1.0,
        "kv_cache_mb": 1.0,
    }
    base["stream"] = STREAM | change
    return Plan.model_validate(base)


@pytest.fixture(scope="module")
def synthesised(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict]:
    return _synth(tmp_path_factory.mktemp("stream"), stream_plan())


@pytest.fixture(scope="module")
def template(synthesised: tuple[dict[str, Any], dict]) -> dict[str, Any]:
    return synthesised[1]


def _one(template: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    ((logical, resource),) = _resources(template, kind).items()
    return logical, resource


def _queues(template: dict[str, Any]) -> tuple[tuple[str, dict], tuple[str, dict]]:
    """(requests, dead letters), each (logical id, resource)."""
    queues = _resources(template, "AWS::SQS::Queue")
    (requests,) = [(k, q) for k, q in queues.items() if "RedrivePolicy" in q["Properties"]]
    (dead,) = [(k, q) for k, q in queues.items() if k != requests[0]]
    return requests, dead


def _worker(template: dict[str, Any]) -> dict[str, Any]:
    (worker,) = _by_handler(template, "worker").values()
    return worker


def _endpoint(template: dict[str, Any]) -> dict[str, Any]:
    (endpoint,) = _by_handler(template, "endpoint").values()
    return endpoint


def test_a_stream_plan_is_a_queue_its_workers_and_an_endpoint_not_a_workflow(
    synthesised: tuple[dict[str, Any], dict],
) -> None:
    summary, template = synthesised
    assert summary["within_limits"]
    lint = summary["cfn_lint"]
    assert lint["ok"] and lint["errors"] == 0, lint["error_messages"]
    assert not _resources(template, "AWS::StepFunctions::StateMachine")
    handlers = sorted(
        f["Properties"]["ImageConfig"]["Command"][0]
        for f in _resources(template, "AWS::Lambda::Function").values()
    )
    # no driver, no cleanup (nothing would invoke it): the worker, the endpoint, 4 experts
    assert handlers == ["functions.endpoint.handler"] + ["functions.expert.handler"] * 4 + [
        "functions.worker.handler"
    ]
    outputs = template["Outputs"]
    assert "StateMachineArn" not in outputs
    requests, _ = _queues(template)
    assert outputs["RequestQueueUrl"]["Value"] == {"Ref": requests[0]}
    url, _ = _one(template, "AWS::Lambda::Url")
    assert outputs["EndpointUrl"]["Value"] == {"Fn::GetAtt": [url, "FunctionUrl"]}


def test_the_queue_hides_a_request_for_the_planned_timeout_and_keeps_failures(
    template: dict[str, Any],
) -> None:
    (requests, queue), (dead, dead_letters) = _queues(template)
    props = queue["Properties"]
    assert props["VisibilityTimeout"] == STREAM["visibility_timeout_s"]
    assert props["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": [dead, "Arn"]},
        "maxReceiveCount": 5,
    }
    assert dead_letters["Properties"]["MessageRetentionPeriod"] == 14 * 86400
    for logical, q in ((requests, queue), (dead, dead_letters)):
        assert q["Properties"]["SqsManagedSseEnabled"] is True
        (policy,) = [
            p
            for p in _resources(template, "AWS::SQS::QueuePolicy").values()
            if p["Properties"]["Queues"] == [{"Ref": logical}]
        ]
        (deny,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert deny["Effect"] == "Deny"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_the_worker_is_the_driver_serving_the_queue(template: dict[str, Any]) -> None:
    props = _worker(template)["Properties"]
    plan = stream_plan()
    assert props["MemorySize"] == plan.nonmoe_memory_mb and props["Architectures"] == ["x86_64"]
    assert props["Timeout"] == MAX_TIMEOUT_S
    assert props["ReservedConcurrentExecutions"] == 3
    env = props["Environment"]["Variables"]
    assert set(env) == {
        "MOELAMBDA_BUCKET",
        "MOELAMBDA_WEIGHTS_PREFIX",
        "MOELAMBDA_THREADS",
        "MOELAMBDA_DRIVER_LOCAL",
        "MOELAMBDA_PAYLOAD_LIMIT",
        "MOELAMBDA_QUEUE_URL",
        "MOELAMBDA_STREAM",
        "MOELAMBDA_REMOTE",
    }
    requests, _ = _queues(template)
    assert env["MOELAMBDA_QUEUE_URL"] == {"Ref": requests[0]}
    assert decode_local(env["MOELAMBDA_DRIVER_LOCAL"]) == LOCAL
    stream = json.loads(env["MOELAMBDA_STREAM"])
    assert stream == {k: STREAM[k] for k in stream} and set(stream) == {
        "slots", "idle_exit_s", "prefill_chunk_tokens", "flush_tokens", "poll_s",
        "max_prompt_tokens", "max_new_tokens", "step_s", "prefill_token_s",
    }  # fmt: skip
    assert env["MOELAMBDA_STREAM"] == settings(plan.stream)  # type: ignore[arg-type]
    # the remote table the workflow's driver Task would carry: each function's Ref in place
    remote = json.loads(re.sub(r"<Ref:(\w+)>", r"\1", _render(env["MOELAMBDA_REMOTE"])))
    experts = _by_handler(template, "expert")
    assert [[e[0] for e in layer] for layer in remote] == [[1], [0, 1, 2], []]
    assert {e[1] for layer in remote for e in layer} == set(experts)
    assert remote[1][0][2:] == [2, 8, 64]  # replicas, cap, rows per replica
    assert props["ImageConfig"]["Command"] == ["functions.worker.handler"]


def test_the_mapping_starts_a_worker_per_message_up_to_the_planned_workers(
    template: dict[str, Any],
) -> None:
    _, mapping = _one(template, "AWS::Lambda::EventSourceMapping")
    props = mapping["Properties"]
    requests, _ = _queues(template)
    (worker_id,) = _by_handler(template, "worker")
    assert props["EventSourceArn"] == {"Fn::GetAtt": [requests[0], "Arn"]}
    assert props["FunctionName"] == {"Ref": worker_id}
    assert props["BatchSize"] == 1
    assert props["ScalingConfig"] == {"MaximumConcurrency": 3}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    role = _worker(template)["Properties"]["Role"]["Fn::GetAtt"][0]
    assert role in mapping["DependsOn"]  # it polls with the worker's role


def test_the_endpoint_sends_and_reads_behind_a_signed_buffered_url(
    template: dict[str, Any],
) -> None:
    endpoint = _endpoint(template)
    props = endpoint["Properties"]
    assert props["MemorySize"] == 512 and props["Timeout"] == MAX_TIMEOUT_S
    assert "ReservedConcurrentExecutions" not in props
    env = props["Environment"]["Variables"]
    assert set(env) == {
        "MOELAMBDA_BUCKET",
        "MOELAMBDA_QUEUE_URL",
        "MOELAMBDA_WEIGHTS_PREFIX",
        "MOELAMBDA_MODEL_ID",
        "MOELAMBDA_STREAM",
        "MOELAMBDA_THREADS",
    }
    assert env["MOELAMBDA_MODEL_ID"] == "tiny" and env["MOELAMBDA_WEIGHTS_PREFIX"] == "weights/"
    assert (
        env["MOELAMBDA_STREAM"]
        == _worker(template)["Properties"]["Environment"]["Variables"]["MOELAMBDA_STREAM"]
    )
    _, url = _one(template, "AWS::Lambda::Url")
    (endpoint_id,) = _by_handler(template, "endpoint")
    assert url["Properties"] == {
        "AuthType": "AWS_IAM",
        "InvokeMode": "BUFFERED",
        "TargetFunctionArn": {"Fn::GetAtt": [endpoint_id, "Arn"]},
    }  # no Cors
    # nobody is granted the URL: no resource policy, no public permission
    assert not _resources(template, "AWS::Lambda::Permission")


def _actions(statements: list[dict[str, Any]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for s in statements:
        found.setdefault(s["Action"], []).extend(s["Resource"])
    return found


def _keys(resources: list[str]) -> set[str]:
    return {r.split("/", 1)[1] for r in resources}


def test_worker_least_privilege(template: dict[str, Any]) -> None:
    worker = _worker(template)
    actions = _actions(_policy(template, worker))
    requests, _ = _queues(template)
    queue = f"<{requests[0]}.Arn>"
    assert set(actions) == {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:ListBucket",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
        "lambda:InvokeFunction",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }  # fmt: skip  (no sqs:SendMessage)
    for action in actions:
        if action.startswith("sqs:"):
            assert actions[action] == [queue]
    reads = _keys(actions["s3:GetObject"])
    assert {"results/*/final.json", "requests/*/00/out/*", "requests/*/01/out/*"} <= reads
    assert "results/*" not in reads and "inputs/*" not in reads
    # its weights as the driver's: manifest, config, head, tail, three layers, local experts
    assert len({r for r in reads if r.startswith("weights/")}) == 2 + 2 + 3 + 5
    assert _keys(actions["s3:PutObject"]) == {"results/*", "requests/*/00/in/*",
                                              "requests/*/01/in/*"}  # fmt: skip
    assert _keys(actions["s3:DeleteObject"]) == {"requests/*"}
    experts = _by_handler(template, "expert")
    invoked = {r.strip("<").split(".")[0] for r in actions["lambda:InvokeFunction"]}
    assert invoked == set(experts)


def test_endpoint_least_privilege(template: dict[str, Any]) -> None:
    actions = _actions(_policy(template, _endpoint(template)))
    requests, _ = _queues(template)
    assert set(actions) == {
        "s3:GetObject",
        "s3:ListBucket",
        "sqs:SendMessage",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }  # fmt: skip  (no PutObject, no DeleteObject, no Receive, no Invoke)
    assert actions["sqs:SendMessage"] == [f"<{requests[0]}.Arn>"]
    # the tokenizer through the export's loader (manifest.json, then config/): no stage
    assert _keys(actions["s3:GetObject"]) == {
        "results/*",
        "weights/manifest.json",
        "weights/config/*",
    }


def test_the_experts_are_as_a_driver_plans(template: dict[str, Any]) -> None:
    for fn in _by_handler(template, "expert").values():
        actions = _actions(_policy(template, fn))
        assert not any(a.startswith(("sqs:", "lambda:")) for a in actions)
        assert "results/*" not in _keys(actions.get("s3:PutObject", []))


_ARN = "arn:aws:{}:us-east-1:123456789012:{}"


def _deployed(value: Any, queues: set[str]) -> Any:
    """A template value as deployed (`pipeline.local.concrete`'s rule, with queues' ARNs)."""
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Fn::Join":
            return arg[0].join(str(_deployed(part, queues)) for part in arg[1])
        if fn == "Ref":
            return {"AWS::Partition": "aws"}.get(arg, f"n-{arg}".lower())
        if fn == "Fn::GetAtt":
            if arg[0] in queues:
                return _ARN.format("sqs", f"n-{arg[0]}".lower())
            if arg[0].startswith("Storage"):
                return f"arn:aws:s3:::n-{arg[0]}".lower()
            return _ARN.format("lambda", f"function:n-{arg[0]}".lower())
    if isinstance(value, dict):
        return {k: _deployed(v, queues) for k, v in value.items()}
    if isinstance(value, list):
        return [_deployed(v, queues) for v in value]
    return value


def _sqs(operation: str, who: str, url: str, json_protocol: bool = True) -> SimpleNamespace:
    body = json.dumps({"QueueUrl": url}) if json_protocol else f"Action={operation}&QueueUrl={url}"
    credential = f"AWS4-HMAC-SHA256 Credential={who}/20260101/us-east-1/sqs/aws4_request"
    return SimpleNamespace(body=body.encode(), headers={"Authorization": credential})


def test_the_local_evaluator_enforces_the_stream_policies(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    (worker_id,) = _by_handler(template, "worker")
    (endpoint_id,) = _by_handler(template, "endpoint")
    requests, dead = _queues(template)
    policies = Policies.from_template(
        resources,
        {worker_id: "WORKER", endpoint_id: "ENDPOINT"},
        lambda value: _deployed(value, {requests[0], dead[0]}),
    )
    bucket = "arn:aws:s3:::" + f"n-{next(k for k in resources if k.startswith('Storage'))}"
    bucket = bucket.lower()
    url = f"https://sqs.us-east-1.amazonaws.com/123456789012/n-{requests[0]}".lower()
    other = f"https://sqs.us-east-1.amazonaws.com/123456789012/n-{dead[0]}".lower()
    assert queue_arn(url) == _ARN.format("sqs", f"n-{requests[0]}".lower())
    assert queue_arn("https://us-east-1.queue.amazonaws.com/123456789012/q") == _ARN.format(
        "sqs", "q"
    )
    allowed = [
        ("ENDPOINT", "SendMessage", url),
        ("WORKER", "ReceiveMessage", url),
        ("WORKER", "DeleteMessageBatch", url),
        ("WORKER", "ChangeMessageVisibility", url),
    ]
    denied = [
        ("WORKER", "SendMessage", url),
        ("ENDPOINT", "ReceiveMessage", url),
        ("ENDPOINT", "DeleteMessage", url),
        ("WORKER", "ReceiveMessage", other),  # not the dead-letter queue
        ("ENDPOINT", "SendMessage", other),
    ]
    for who, operation, queue in allowed:
        assert sqs_request(policies, operation, _sqs(operation, who, queue)), (who, operation)
        assert sqs_request(policies, operation, _sqs(operation, who, queue, False))
    for who, operation, queue in denied:
        assert not sqs_request(policies, operation, _sqs(operation, who, queue)), (who, operation)
    # its own runner's requests are not checked
    assert sqs_request(policies, "SendMessage", _sqs("SendMessage", "RUNNER", other))
    result = f"{bucket}/results/abc/00000.json"
    assert policies.allows("WORKER", "s3:PutObject", result)
    assert not policies.allows("ENDPOINT", "s3:PutObject", result)
    assert policies.allows("ENDPOINT", "s3:GetObject", result)
    assert not policies.allows("WORKER", "s3:GetObject", result)  # only final.json
    assert policies.allows("WORKER", "s3:GetObject", f"{bucket}/results/abc/final.json")
    assert policies.allows("ENDPOINT", "s3:GetObject", f"{bucket}/weights/config/tokenizer.json")
    assert policies.allows(
        "ENDPOINT", "s3:ListBucket", bucket, prefix="weights/config/"
    )  # functions.weights.loader lists config/
    assert not policies.allows("ENDPOINT", "s3:GetObject", f"{bucket}/weights/head.safetensors")


def test_a_monolithic_stream_invokes_nothing_and_deletes_nothing(tmp_path: Path) -> None:
    template = _synth(tmp_path, stream_plan("monolithic", workers=1), "--no-lint")[1]
    worker = _worker(template)
    env = worker["Properties"]["Environment"]["Variables"]
    assert "MOELAMBDA_REMOTE" not in env
    # workers 1: the mapping's minimum of 2, and as much reserved (module docstring)
    assert worker["Properties"]["ReservedConcurrentExecutions"] == ESM_MIN_CONCURRENCY
    _, mapping = _one(template, "AWS::Lambda::EventSourceMapping")
    assert mapping["Properties"]["ScalingConfig"] == {"MaximumConcurrency": ESM_MIN_CONCURRENCY}
    actions = _actions(_policy(template, worker))
    assert "lambda:InvokeFunction" not in actions and "s3:DeleteObject" not in actions
    assert _keys(actions["s3:PutObject"]) == {"results/*"}
    assert _keys(actions["s3:GetObject"]) - {"results/*/final.json"} == {
        r for r in _keys(actions["s3:GetObject"]) if r.startswith("weights/")
    }
    assert len(_resources(template, "AWS::Lambda::Function")) == 2  # worker and endpoint


def _refused(tmp_path: Path, plan: Plan, *extra: str) -> str:
    path = plan.save(tmp_path / "plan.json")
    out = tmp_path / "cdk.out"
    result = runner.invoke(
        app, ["synth", "--plan", str(path), "--out", str(out), "--no-lint", *extra]
    )
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("change", "extra", "says"),
    [
        ({"visibility_timeout_s": 600}, (), "visibility timeout of at least 900 s"),
        (
            {"slots": 300, "step_s": [0.123456789012345] * 300},
            (),
            "over Lambda's 4,096",
        ),
        ({"workers": 950}, (), "fewer workers"),
        ({"workers": 950}, ("--no-reserve-concurrency",), "fewer workers"),
        ({"traffic": {"spec": "poisson:1/s", "hardware": "gpu-lambda"}}, (), "CPU Lambda"),
    ],
)
def test_a_stream_lambda_could_not_run_is_refused(
    tmp_path: Path, change: dict[str, Any], extra: tuple[str, ...], says: str
) -> None:
    assert says in _refused(tmp_path, stream_plan(**change), *extra)


def test_the_workers_reservation_fits_a_quota_the_experts_do_not_fill(tmp_path: Path) -> None:
    # 4 remote experts x max_replicas 8 = 32 reserved; 900 workers + 32 + 100 > 1,000
    assert "32 for its experts" in _refused(tmp_path, stream_plan(workers=900))
    quota = {"concurrency_quota": 2000}
    plan = stream_plan(workers=900).model_copy(update=quota)
    _synth(tmp_path / "ok", plan, "--no-lint")


def test_checkov_finds_nothing_unexplained_in_a_stream_stack(
    synthesised: tuple[dict[str, Any], dict],
) -> None:
    summary, template = synthesised
    report = _checkov(Path(summary["template"]))
    failed = report["results"]["failed_checks"]
    assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]
    skips = [
        skip
        for res in template["Resources"].values()
        for skip in res.get("Metadata", {}).get("checkov", {}).get("skip", [])
    ]
    assert all(len(s["comment"]) > 40 for s in skips)
    assert report["summary"]["skipped"] == len(skips)
    worker, endpoint = _worker(template), _endpoint(template)
    ids = {s["id"] for s in worker["Metadata"]["checkov"]["skip"]}
    assert "CKV_AWS_115" not in ids  # the worker reserves its concurrency
    ids = {s["id"] for s in endpoint["Metadata"]["checkov"]["skip"]}
    assert ids == {"CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117", "CKV_AWS_173"}
