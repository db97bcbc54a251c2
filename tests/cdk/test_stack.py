"""The serving stack of a small Plan: bucket, functions, IAM, the state machine, cfn-lint.

One synthesis per module (it takes seconds), through `moelambda synth --json`, so the CLI, the
CDK app and cfn-lint are exercised together; the tests read the template it wrote. Plans are
built by hand (`make_plan`) and validated by `ground.plan.Plan`: the planner is not needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from cdk._state_machine import workflow_timeout_s
from ground.errors import UsageError
from ground.manifest import expert_key, layer_key
from ground.plan import ModelRef, Plan
from ground.semantics import threads_for
from moelambda.cli import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
CALIBRATION_FILE = REPO / "planner" / "data" / "calibration.json"
METHODS = ("s3", "pipelined", "direct")
EXPERTS = 3
REPLICAS = [[2, 1, 1], [1, 3, 1], [1, 1, 2]]  # replicas > 1 in every method
MAX_REPLICAS = [[4, 2, 1], [1, 3, 1], [3, 1, 2]]  # pipelined: the plan's replicas
MEMORY = [[768, 1024, 1536], [2048, 768, 1024], [1024, 1769, 768]]
NONMOE_MEMORY_MB = 3008
DIRECT_LIMIT = 262144


def calibration() -> dict[str, Any]:
    """The calibration as a plan embeds it: every parameter's value, read from the file."""
    document = json.loads(CALIBRATION_FILE.read_text())
    return {"region": document["region"]} | {
        name: parameter["value"] for name, parameter in document["parameters"].items()
    }


def make_plan(
    model: dict[str, Any],
    methods: tuple[str, ...] | list[str],
    replicas: list[list[int]],
    *,
    max_replicas: list[list[int]] | None = None,
    max_tokens: list[list[int]] | None = None,
    memory: list[list[int]] | None = None,
    beta: int = 16,
    arch: str = "x86_64",
    workflow: str = "standard",
    direct_payload_bytes: int = DIRECT_LIMIT,
) -> Plan:
    """A validated format-2 plan of `model` (ModelRef fields) with these methods and replicas.

    `max_replicas` defaults to the replicas, `max_tokens` to 64 per replica, memory to 1,024 MB.
    """
    experts = model["experts"]
    max_replicas = max_replicas or replicas
    max_tokens = max_tokens or [[64] * experts for _ in methods]
    memory = memory or [[1024] * experts for _ in methods]
    return Plan.model_validate(
        {
            "solver": "test",
            "workflow": workflow,
            "objective": "full",
            "nonmoe_memory_mb": NONMOE_MEMORY_MB,
            "optimal": True,
            "arch": arch,
            "direct_payload_bytes": direct_payload_bytes,
            "counts_source": {"test": True},
            "model": model,
            "calibration": calibration(),
            "layers": [
                {
                    "layer": layer,
                    "method": method,
                    "beta": beta if method == "pipelined" else 1,
                    "latency_s": 0.1,
                    "cost_usd": 1e-6,
                    "experts": [
                        {
                            "expert": e,
                            "memory_mb": memory[layer][e],
                            "replicas": replicas[layer][e],
                            "tokens": 40.0,
                            "time_s": 0.01,
                            "cost_usd": 1e-7,
                            "max_replicas": max_replicas[layer][e],
                            "max_tokens_per_replica": max_tokens[layer][e],
                        }
                        for e in range(experts)
                    ],
                }
                for layer, method in enumerate(methods)
            ],
            "totals": {"tokens": 64, "moe_cost_usd": 1e-6, "bill_usd": {}, "latency_s": 1.0},
        }
    )


def model_ref(manifest: Any) -> dict[str, Any]:
    """The plan's model reference of an export's manifest."""
    return manifest.model_dump(mode="json", include=set(ModelRef.model_fields))


def tiny_model(layers: int, experts: int = EXPERTS) -> dict[str, Any]:
    """The ModelRef fields of a tiny model: `layers` MoE layers of `experts` experts."""
    stages = [{"role": "head", "key": "head.safetensors", "bytes": 1000}]
    for layer in range(layers):
        stages.append({"role": "layer", "layer": layer, "key": layer_key(layer), "bytes": 500})
        stages += [
            {
                "role": "expert",
                "layer": layer,
                "expert": e,
                "key": expert_key(layer, e),
                "bytes": 9,
            }
            for e in range(experts)
        ]
    stages.append({"role": "tail", "key": "tail.safetensors", "bytes": 100})
    return {
        "model": "tiny",
        "model_type": "bert",
        "moefied": True,
        "seed": 0,
        "num_layers": layers,
        "experts": experts,
        "top_k": 2,
        "hidden_size": 8,
        "token_bytes_in": 32,
        "token_bytes_out": 32,
        "stages": stages,
    }


def small_plan(
    methods: tuple[str, ...] = METHODS, arch: str = "x86_64", workflow: str = "standard"
) -> Plan:
    """A deployable plan of a 3-expert model with one layer per method."""
    layers = len(methods)
    model = tiny_model(layers)
    return make_plan(
        model,
        methods,
        REPLICAS[:layers],
        max_replicas=MAX_REPLICAS[:layers],
        memory=MEMORY[:layers],
        arch=arch,
        workflow=workflow,
    )


def _synth(tmp: Path, plan: Plan, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    path = plan.save(tmp / "plan.json")
    result = runner.invoke(
        app, ["synth", "--plan", str(path), "--out", str(tmp / "cdk.out"), "--json", *extra]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    return summary, json.loads(Path(summary["template"]).read_text())


@pytest.fixture(scope="module")
def synthesised(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict, Plan]:
    plan = small_plan()
    summary, template = _synth(tmp_path_factory.mktemp("synth"), plan)
    return summary, template, plan


@pytest.fixture(scope="module")
def template(synthesised: tuple[dict[str, Any], dict, Plan]) -> dict[str, Any]:
    return synthesised[1]


def _resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def _render(value: Any) -> Any:
    """A CloudFormation value with every intrinsic replaced by a readable placeholder string."""
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Fn::Join":
            return arg[0].join(str(_render(part)) for part in arg[1])
        if fn == "Ref":
            return f"<Ref:{arg}>"
        if fn == "Fn::GetAtt":
            return f"<{'.'.join(arg)}>"
    if isinstance(value, dict):
        return {k: _render(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v) for v in value]
    return value


_PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012"}


def _concrete(value: Any) -> Any:
    """Like `_render`, with values as deployed: Refs as names, Arn attributes as Lambda ARNs."""
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Fn::Join":
            return arg[0].join(str(_concrete(part)) for part in arg[1])
        if fn == "Ref":
            return _PSEUDO.get(arg, f"fn-{arg}")
        if fn == "Fn::GetAtt":
            return f"arn:aws:lambda:us-east-1:123456789012:function:fn-{arg[0]}"
    if isinstance(value, dict):
        return {k: _concrete(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_concrete(v) for v in value]
    return value


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Lambda functions by their construct path's last part (Head, Layer00Expert01, ...)."""
    found = {}
    for logical, res in _resources(template, "AWS::Lambda::Function").items():
        name = res["Properties"]["Description"].split()[-1]
        found[name] = res | {"LogicalId": logical}
    return found


def _definition(template: dict[str, Any]) -> dict[str, Any]:
    (machine,) = _resources(template, "AWS::StepFunctions::StateMachine").values()
    return json.loads(_render(machine["Properties"]["DefinitionString"]))


def _policies(template: dict[str, Any], function: dict[str, Any]) -> list[dict[str, Any]]:
    """Every statement of the inline policies attached to a function's role."""
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = []
    for policy in template["Resources"][role]["Properties"].get("Policies", []):
        statements += policy["PolicyDocument"]["Statement"]
    for res in _resources(template, "AWS::IAM::Policy").values():
        if {"Ref": role} in res["Properties"]["Roles"]:
            statements += res["Properties"]["PolicyDocument"]["Statement"]
    return [_render(s) for s in statements]


def test_synth_summary_and_cfn_lint(synthesised: tuple[dict[str, Any], dict, Plan]) -> None:
    summary, template, _ = synthesised
    assert summary["functions"] == 3 * EXPERTS + 3 + 3  # experts, gates, head+tail+cleanup
    assert summary["resources"] == len(template["Resources"])
    assert summary["within_limits"]
    # Two resources per function (role with its policy inline, function) plus bucket, bucket
    # policy, state machine, its role and policy (and an overflow policy for long ARN lists),
    # a log group per layer's experts, one for the other functions, one for the workflow:
    # 12 layers x 16 experts (207 functions) make 434, under CloudFormation's 500 resources.
    layers = (summary["functions"] - 3) // (EXPERTS + 1)
    assert summary["resource_types"]["AWS::Logs::LogGroup"] == layers + 2
    assert summary["resources"] <= 2 * summary["functions"] + 6 + layers + 2
    assert summary["resource_types"]["AWS::IAM::Policy"] == 1  # the state machine's only
    lint = summary["cfn_lint"]
    assert lint["ok"] and lint["errors"] == 0, lint["error_messages"]


def test_bucket_is_private_encrypted_tls_only_and_expires_requests(
    template: dict[str, Any],
) -> None:
    from aws_cdk.assertions import Match, Template

    t = Template.from_json(template)
    t.resource_count_is("AWS::S3::Bucket", 1)
    t.has_resource(
        "AWS::S3::Bucket",
        {
            "DeletionPolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "BucketEncryption": {
                        "ServerSideEncryptionConfiguration": [
                            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                        ]
                    },
                    "PublicAccessBlockConfiguration": {
                        "BlockPublicAcls": True,
                        "BlockPublicPolicy": True,
                        "IgnorePublicAcls": True,
                        "RestrictPublicBuckets": True,
                    },
                    "LifecycleConfiguration": {
                        "Rules": [
                            Match.object_like(
                                {"Prefix": prefix, "ExpirationInDays": 1, "Status": "Enabled"}
                            )
                            for prefix in ("requests/", "inputs/")
                        ]
                    },
                }
            ),
        },
    )
    t.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            }
        },
    )


def test_one_function_per_expert_and_stage_with_the_plans_memory(
    synthesised: tuple[dict[str, Any], dict, Plan],
) -> None:
    _, template, plan = synthesised
    functions = _functions(template)
    names = {"Head", "Tail", "Cleanup"} | {f"Layer{la.layer:02d}" for la in plan.layers}
    names |= {f"Layer{la.layer:02d}Expert{e.expert:02d}" for la in plan.layers for e in la.experts}
    assert set(functions) == names
    mb_per_vcpu = plan.calibration["mb_per_vcpu"]
    for layer in plan.layers:
        for e in layer.experts:
            props = functions[f"Layer{layer.layer:02d}Expert{e.expert:02d}"]["Properties"]
            assert props["MemorySize"] == e.memory_mb
            assert props["Timeout"] == 300
            # The gate may spread a batch over max_replicas: that is what is reserved.
            assert props["ReservedConcurrentExecutions"] == e.max_replicas
            assert props["Architectures"] == ["x86_64"]
            assert props["PackageType"] == "Image"
            assert props["ImageConfig"]["Command"] == ["functions.expert.handler"]
            env = _render(props["Environment"]["Variables"])
            assert env["MOELAMBDA_LAYER"] == str(layer.layer)
            assert env["MOELAMBDA_EXPERT"] == str(e.expert)
            assert env["MOELAMBDA_METHOD"] == layer.method
            assert env["MOELAMBDA_BETA"] == str(layer.beta)
            assert env["MOELAMBDA_WEIGHTS_PREFIX"] == "weights/"
            assert env["MOELAMBDA_BUCKET"].startswith("<Ref:")
            assert env["MOELAMBDA_THREADS"] == str(threads_for(e.memory_mb, mb_per_vcpu))
            # A direct expert checks its response against the plan's payload limit.
            limit = env.get("MOELAMBDA_PAYLOAD_LIMIT")
            assert limit == (str(DIRECT_LIMIT) if layer.method == "direct" else None)
    assert {e.memory_mb for la in plan.layers for e in la.experts} & {768, 2048}  # 1 and 2 vCPUs
    for role in ("Head", "Tail", "Cleanup"):
        command = functions[role]["Properties"]["ImageConfig"]["Command"]
        assert command == [f"functions.{role.lower()}.handler"]
    # head, gates and tail run at the plan's non-MoE memory, with its vCPUs as threads
    for name in ["Head", "Tail", *(f"Layer{la.layer:02d}" for la in plan.layers)]:
        props = functions[name]["Properties"]
        assert props["MemorySize"] == plan.nonmoe_memory_mb == NONMOE_MEMORY_MB
        threads = props["Environment"]["Variables"]["MOELAMBDA_THREADS"]
        assert threads == str(threads_for(NONMOE_MEMORY_MB, mb_per_vcpu)) == "2"
    assert functions["Cleanup"]["Properties"]["Environment"]["Variables"]["MOELAMBDA_THREADS"]


def test_cdk_does_not_need_the_planner() -> None:
    """The CDK app reads only the Plan: a planner being rewritten cannot break a deployment."""
    code = (
        "import sys, cdk.stack, cdk.app; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'planner'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_layer_functions_get_their_layer_plan(
    synthesised: tuple[dict[str, Any], dict, Plan],
) -> None:
    _, template, plan = synthesised
    functions = _functions(template)
    for layer in plan.layers:
        ll = f"Layer{layer.layer:02d}"
        props = functions[ll]["Properties"]
        assert props["ImageConfig"]["Command"] == ["functions.layer.handler"]
        env = _render(props["Environment"]["Variables"])
        assert env["MOELAMBDA_LAYER"] == str(layer.layer)
        layer_plan = json.loads(env["MOELAMBDA_LAYER_PLAN"])
        assert layer_plan == {
            "method": layer.method,
            "beta": layer.beta,
            "replicas": [e.replicas for e in layer.experts],
            "max_replicas": [e.max_replicas for e in layer.experts],
            "max_tokens": [e.max_tokens_per_replica for e in layer.experts],
            "payload_limit": DIRECT_LIMIT,
            "expert_functions": [
                f"<Ref:{functions[f'{ll}Expert{e:02d}']['LogicalId']}>" for e in range(EXPERTS)
            ],
        }


def test_state_machine_chains_head_layers_tail_by_method(
    synthesised: tuple[dict[str, Any], dict, Plan],
) -> None:
    _, template, plan = synthesised
    functions = _functions(template)
    states = _definition(template)["States"]
    assert _definition(template)["StartAt"] == "Head"
    # Walk the main chain.
    order, name = [], "Head"
    while True:
        order.append(name)
        if states[name].get("End"):
            break
        name = states[name].get("Next") or states[name]["Default"]  # a Choice's way on
    assert order == [
        "Head",
        "Layer00",
        "Layer00Experts",
        "Layer01Pipelined",
        "Layer01GateOk",
        "Layer01Output",
        "Layer02",
        "Tail",
    ]
    # jsii cannot pass a JSON null; the intrinsic evaluates to one at run time.
    assert (
        states["Layer00"]["Parameters"]["Payload"]["previous.$"] == "States.StringToJson('null')"
    )
    assert states["Layer01Pipelined"]["Branches"][0]["States"]["Layer01"]["Parameters"]["Payload"][
        "previous"
    ] == {"layer": 0, "method": "s3"}
    assert states["Tail"]["Parameters"]["Payload"]["previous"] == {"layer": 2, "method": "direct"}
    # s3: a Map over the gate's experts, each a Map over that expert's shards, invoking the
    # function each shard names: no inline Map iterates over more than E or G items.
    fan_out = states["Layer00Experts"]
    assert fan_out["Type"] == "Map" and fan_out["ItemsPath"] == "$.experts"
    assert fan_out["ResultPath"] == "$.failures" and "ItemSelector" not in fan_out
    (replicas,) = fan_out["ItemProcessor"]["States"].values()
    assert replicas["Type"] == "Map" and replicas["ItemsPath"] == "$.shards"
    invoke = replicas["ItemProcessor"]["States"]["Layer00Expert"]
    assert invoke["Resource"].endswith(":states:::lambda:invoke")
    assert invoke["Parameters"] == {"FunctionName.$": "$.function", "Payload.$": "$"}
    # pipelined: a Parallel of the gate and the same nested Map over every planned (expert,
    # replica), experts with no predicted tokens included.
    parallel = states["Layer01Pipelined"]
    assert parallel["Type"] == "Parallel" and len(parallel["Branches"]) == 2
    assert parallel["Branches"][0]["StartAt"] == "Layer01"
    branch = parallel["Branches"][1]["States"]
    assert branch["Layer01Shards"]["Parameters"]["request_id.$"] == "$.request_id"
    experts = branch["Layer01Shards"]["Parameters"]["experts"]
    expected = [
        {
            "shards": [
                {
                    "layer": 1,
                    "expert": e,
                    "replica": r,
                    "function": f"<Ref:{functions[f'Layer01Expert{e:02d}']['LogicalId']}>",
                }
                for r in range(REPLICAS[1][e])
            ]
        }
        for e in range(EXPERTS)
    ]
    assert experts == expected
    pipelined_map = branch["Layer01Experts"]
    assert pipelined_map["Type"] == "Map" and pipelined_map["ItemsPath"] == "$.experts"
    assert pipelined_map["ItemSelector"] == {
        "request_id.$": "$.request_id",
        "shards.$": "$$.Map.Item.Value.shards",
    }
    inner = pipelined_map["ItemProcessor"]["States"]["Layer01Replicas"]
    assert inner["ItemsPath"] == "$.shards"
    assert inner["ItemSelector"] == {"request_id.$": "$.request_id"} | {
        f"{k}.$": f"$$.Map.Item.Value.{k}" for k in ("layer", "expert", "replica", "function")
    }
    assert states["Layer01Output"]["Parameters"] == {
        "request_id.$": "$.branches.gate.request_id",
        "hidden_key.$": "$.branches.gate.hidden_key",
        "failures.$": "$.branches.experts.failures",
    }
    # Failures never cut a fan-out short: every invocation catches its own error, and the Maps
    # (or the Parallel, for the pipelined gate) wait for all before the cleanup runs.
    for outer in (fan_out, pipelined_map):
        (inner_map,) = outer["ItemProcessor"]["States"].values()
        (task,) = [s for s in inner_map["ItemProcessor"]["States"].values() if s["Type"] == "Task"]
        assert task["Catch"][0]["ErrorEquals"] == ["States.ALL"]
    assert parallel["Branches"][0]["States"]["Layer01"]["Catch"][0]["Next"] == "Layer01GateCaught"
    assert states["Layer01GateOk"]["Choices"][0]["Next"] == "Layer01GateFailed"
    assert states["Layer01GateFailed"]["Next"] == "Cleanup"
    assert states["Layer02"]["Parameters"]["Payload"]["expert_failures.$"] == "$.failures"
    # direct: only the gate, which invokes the experts itself.
    assert states["Layer02"]["Type"] == "Task"
    assert not any(s["Type"] == "Map" and "02" in n for n, s in states.items())


def test_every_task_retries_and_every_later_stage_catches_into_cleanup(template: dict) -> None:
    states = _definition(template)["States"]

    def tasks(states: dict[str, Any]):  # type: ignore[no-untyped-def]
        for name, state in states.items():
            if state["Type"] == "Task":
                yield name, state
            for branch in state.get("Branches", []) + [state.get("ItemProcessor", {})]:
                yield from tasks(branch.get("States", {}))

    found = dict(tasks(states))
    assert len(found) == 1 + 3 + 2 + 1 + 1  # head, gates, Map invokes, tail, cleanup
    for name, task in found.items():
        errors = {e for retry in task["Retry"] for e in retry["ErrorEquals"]}
        assert {"Lambda.TooManyRequestsException", "Lambda.ServiceException"} <= errors, name
        assert all(r["BackoffRate"] > 1 for r in task["Retry"]), name
    for name in ("Layer00", "Layer00Experts", "Layer01Pipelined", "Layer02", "Tail"):
        (catch,) = states[name]["Catch"]
        assert catch["ErrorEquals"] == ["States.ALL"] and catch["Next"] == "Cleanup", name
    (catch,) = states["Head"]["Catch"]  # nothing written yet: no cleanup, the cause as is
    assert catch["ErrorEquals"] == ["States.ALL"] and catch["Next"] == "Failed"
    # The workflow, not the caller, names the request's keys.
    head = states["Head"]["Parameters"]["Payload"]
    assert head["request_id.$"] == "States.Hash($$.Execution.Id, 'SHA-256')"
    assert head["execution.$"] == "$$.Execution.Name" and head["input.$"] == "$"
    assert states["Cleanup"]["Next"] == "Failed"
    assert states["Failed"] == {
        "Type": "Fail",
        "ErrorPath": "$.error.Error",
        "CausePath": "$.error.Cause",
    }
    (machine,) = _resources(template, "AWS::StepFunctions::StateMachine").values()
    assert machine["Properties"].get("StateMachineType", "STANDARD") == "STANDARD"
    assert _definition(template)["TimeoutSeconds"] == 1800


def test_express_plan_gets_an_express_workflow_within_its_duration_limit(tmp_path: Path) -> None:
    summary, template = _synth(tmp_path, small_plan(workflow="express"))
    assert summary["cfn_lint"]["ok"], summary["cfn_lint"]["error_messages"]
    (machine,) = _resources(template, "AWS::StepFunctions::StateMachine").values()
    assert machine["Properties"]["StateMachineType"] == "EXPRESS"
    assert _definition(template)["TimeoutSeconds"] == 300
    with pytest.raises(UsageError, match="exceeds an Express workflow's 300 s"):
        workflow_timeout_s(small_plan(workflow="express"), 600)
    assert workflow_timeout_s(small_plan(), 3600) == 3600


def _actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else action


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _s3_access(statements: list[dict[str, Any]], bucket: str) -> dict[str, set[str]]:
    """Key patterns by S3 action (ListBucket: its s3:prefix patterns), relative to the bucket."""
    access: dict[str, set[str]] = {}
    for s in statements:
        for action in _actions(s):
            if not action.startswith("s3:"):
                continue
            if action == "s3:ListBucket":
                assert s["Resource"] == f"<{bucket}.Arn>" and set(s["Condition"]) == {"StringLike"}
                patterns = set(_listed(s["Condition"]["StringLike"]["s3:prefix"]))
            else:
                patterns = {r.split("/", 1)[1] for r in _listed(s["Resource"])}
                assert all(r.startswith(f"<{bucket}.Arn>/") for r in _listed(s["Resource"]))
            access.setdefault(action, set()).update(patterns)
    return access


def _expected_access(name: str, plan: Plan) -> dict[str, set[str]]:
    """Each role's keys, written out by hand from the handlers (not from ground.access)."""
    last = len(plan.layers) - 1
    weights = {"weights/manifest.json", "weights/config/*"}
    if name == "Head":
        read = weights | {"weights/head.safetensors", "inputs/*"}
        return {
            "s3:GetObject": read,
            "s3:PutObject": {"requests/*/head.bin"},
            "s3:ListBucket": read,
        }
    if name == "Tail":
        read = weights | {
            "weights/tail.safetensors",
            f"requests/*/{last:02d}/residual.bin",
            f"requests/*/{last:02d}/routing.bin",
            f"requests/*/{last:02d}/out/*",
            "outputs/*",
        }
        return {
            "s3:GetObject": read,
            "s3:PutObject": {"outputs/*"},
            "s3:DeleteObject": {"requests/*"},
            "s3:ListBucket": read | {"requests/*"},
        }
    if name == "Cleanup":
        return {"s3:DeleteObject": {"requests/*"}, "s3:ListBucket": {"requests/*"}}
    layer = int(name[5:7])
    method = plan.layers[layer].method
    if "Expert" in name:
        expert = int(name[-2:])
        # an expert builds its stage from the manifest alone: no config/ (functions.weights)
        read = {"weights/manifest.json", f"weights/{expert_key(layer, expert)}"}
        if method == "direct":  # its shard and its output travel in the Invoke itself
            return {"s3:GetObject": read, "s3:ListBucket": read}
        read |= {f"requests/*/{layer:02d}/in/{expert:02d}/*"}
        return {
            "s3:GetObject": read,
            "s3:PutObject": {f"requests/*/{layer:02d}/out/{expert:02d}/*"},
            "s3:ListBucket": read,
        }
    read = weights | {f"weights/{layer_key(layer)}"}
    if layer == 0:
        read |= {"requests/*/head.bin"}
    else:
        previous = f"requests/*/{layer - 1:02d}/"
        read |= {previous + "residual.bin", previous + "routing.bin", previous + "out/*"}
    own = f"requests/*/{layer:02d}/"
    shards = own + ("out/*" if method == "direct" else "in/*")
    return {
        "s3:GetObject": read,
        "s3:PutObject": {own + "residual.bin", own + "routing.bin", shards},
        "s3:ListBucket": read,
    }


def test_least_privilege(synthesised: tuple[dict[str, Any], dict, Plan]) -> None:
    """Each function reads, writes, lists and deletes only its own layer's and expert's keys."""
    _, template, plan = synthesised
    functions = _functions(template)
    bucket = next(iter(_resources(template, "AWS::S3::Bucket")))
    assert {layer.method for layer in plan.layers} == {"direct", "s3", "pipelined"}
    for name, fn in functions.items():
        statements = _policies(template, fn)
        for s in statements:
            assert s["Effect"] == "Allow" and "NotAction" not in s, (name, s)
            assert not any(a in ("s3:*", "*", "lambda:*") for a in _actions(s)), (name, s)
        assert _s3_access(statements, bucket) == _expected_access(name, plan), name
        invokes = [
            r for s in statements if "lambda:InvokeFunction" in _actions(s) for r in s["Resource"]
        ]
        if name == "Layer02":  # the direct gate invokes exactly its own experts
            targets = {functions[f"Layer02Expert{e:02d}"]["LogicalId"] for e in range(EXPERTS)}
            assert {r.split(".")[0].strip("<") for r in invokes} == targets
        else:
            assert not invokes, name


def test_concurrency_reservation_can_be_turned_off(tmp_path: Path) -> None:
    _, template = _synth(
        tmp_path, small_plan(("direct",), arch="arm64"), "--no-reserve-concurrency", "--no-lint"
    )
    functions = _functions(template)
    assert len(functions) == EXPERTS + 4
    for fn in functions.values():
        assert "ReservedConcurrentExecutions" not in fn["Properties"]
        assert fn["Properties"]["Architectures"] == ["arm64"]
    # A plan with no Map needs no dynamic invoke permission for the state machine.
    definition = _definition(template)
    assert not any(s["Type"] in ("Map", "Parallel") for s in definition["States"].values())


def test_the_image_holds_every_package_the_handlers_import_and_pins_no_threads() -> None:
    """A package the handlers import but the image lacks fails only on AWS, at cold start."""
    from cdk._functions import _ASSET_EXCLUDE

    code = (
        "import sys, functions.head, functions.layer, functions.expert, functions.tail, "
        "functions.batcher, "
        "functions.cleanup; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    ours = {name for name in done.stdout.split() if (REPO / name / "__init__.py").is_file()}
    assert {"functions", "ground", "moe", "pipeline"} <= ours
    dockerfile = (REPO / "Dockerfile.expert").read_text()
    lines = dockerfile.splitlines()
    copied = {line.split()[1].rstrip("/") for line in lines if line.startswith("COPY ")}
    assert ours <= copied
    assert ours <= {rule[1:] for rule in _ASSET_EXCLUDE if rule.startswith("!")}
    assert "OMP_NUM_THREADS=" not in dockerfile  # torch uses the vCPUs: MOELAMBDA_THREADS
    # The image holds the packages they need at the versions pyproject.toml pins (what the tests
    # run): torch by version on PyTorch's CPU index, the others, and their dependencies, by hash
    # (requirements-image.txt; its unpinned dependencies may be older than a new venv's).
    import re
    import tomllib
    from importlib.metadata import version

    locked = dict(
        re.findall(r"^([a-z0-9-]+)==(\S+) \\\n    --hash=sha256:[0-9a-f]{64}", _image_lock(), re.M)
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", "\n".join(project), re.M))
    needed = {"numpy", "transformers", "tokenizers", "safetensors", "pydantic", "boto3"}
    needed |= {"aws-lambda-powertools"}  # the gates' EMF metrics (functions/metrics.py)
    assert needed <= set(locked) and len(locked) >= 40
    for name in needed:
        assert locked[name] == pins[name], f"{name}: image {locked[name]}, pinned {pins[name]}"
    assert pins["torch"] == version("torch").split("+")[0]
    assert f"torch=={pins['torch']}" in dockerfile
    assert "--require-hashes" in dockerfile and "requirements-image.txt" in dockerfile
    assert "!requirements-image.txt" in _ASSET_EXCLUDE


def _image_lock() -> str:
    return (REPO / "requirements-image.txt").read_text()


def test_the_image_base_is_pinned_by_digest_when_given(tmp_path: Path) -> None:
    digest = "public.ecr.aws/lambda/python:3.12@sha256:" + "ab" * 32
    summary, _ = _synth(tmp_path, small_plan(("s3",)), "--base-image", digest, "--no-lint")
    assert summary["base_image"] == {"reference": digest, "pinned": True}
    (assets,) = Path(summary["assembly"]).glob("*.assets.json")
    images = json.loads(assets.read_text())["dockerImages"].values()
    assert {json.dumps(i["source"].get("dockerBuildArgs")) for i in images} == {
        json.dumps({"BASE_IMAGE": digest})
    }
    result = runner.invoke(
        app,
        [
            "synth",
            "--plan",
            str(tmp_path / "plan.json"),
            "--out",
            str(tmp_path / "o2"),
            "--base-image",
            "public.ecr.aws/lambda/python:3.12",
        ],
    )
    assert result.exit_code == 2 and "not pinned by digest" in result.output, result.output


def test_bad_plan_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{}")
    result = runner.invoke(app, ["synth", "--plan", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "is not a valid plan" in result.output
    assert not (tmp_path / "o").exists()


def test_refuses_non_empty_out_without_force(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("data")
    plan = small_plan().save(tmp_path / "plan.json")
    result = runner.invoke(app, ["synth", "--plan", str(plan), "--out", str(out)])
    assert result.exit_code == 2 and "--force" in result.output
    # --force replaces only a cloud assembly, never other data.
    result = runner.invoke(app, ["synth", "--plan", str(plan), "--out", str(out), "--force"])
    assert result.exit_code == 2 and "not a CDK cloud assembly" in result.output
    assert (out / "keep.txt").read_text() == "data"


def test_state_machine_definition_passes_the_asl_schema(template: dict[str, Any]) -> None:
    """cfn-lint checks a DefinitionString built by Fn::Join only loosely: lint it as rendered."""
    from cfnlint.api import ManualArgs, lint

    (machine,) = _resources(template, "AWS::StepFunctions::StateMachine").values()
    definition = json.loads(_concrete(machine["Properties"]["DefinitionString"]))
    alone = {
        "Resources": {
            "Machine": {
                "Type": "AWS::StepFunctions::StateMachine",
                "Properties": {
                    "RoleArn": "arn:aws:iam::123456789012:role/machine",
                    "Definition": definition,
                },
            }
        }
    }
    matches = lint(json.dumps(alone), config=ManualArgs(regions=["us-east-1"]))
    assert not matches, [(m.rule.id, m.message, m.path) for m in matches]


def test_logs_are_scoped_and_expire_and_tracing_is_opt_in(tmp_path: Path) -> None:
    """Every function logs to a group the stack owns (30 days), with permission on that group
    alone and no AWS managed policy; the workflow logs its errors; --tracing turns X-Ray on."""
    _, template = _synth(tmp_path / "a", small_plan(("s3",)), "--no-lint")
    groups = _resources(template, "AWS::Logs::LogGroup")
    assert groups and all(g["Properties"]["RetentionInDays"] == 30 for g in groups.values())
    for name, fn in _functions(template).items():
        props = fn["Properties"]
        group = props["LoggingConfig"]["LogGroup"]["Ref"]
        assert group in groups, name
        assert "TracingConfig" not in props, name
        role = template["Resources"][props["Role"]["Fn::GetAtt"][0]]["Properties"]
        assert "ManagedPolicyArns" not in role, name
        logged = [
            s
            for p in role["Policies"]
            for s in p["PolicyDocument"]["Statement"]
            if any(str(a).startswith("logs:") for a in _listed(s["Action"]))
        ]
        assert len(logged) == 1 and group in json.dumps(logged[0]["Resource"]), name
    (machine,) = _resources(template, "AWS::StepFunctions::StateMachine").values()
    assert machine["Properties"]["LoggingConfiguration"]["Level"] == "ERROR"
    assert machine["Properties"]["LoggingConfiguration"]["IncludeExecutionData"] is False
    _, traced = _synth(tmp_path / "b", small_plan(("s3",)), "--no-lint", "--tracing")
    assert all(
        fn["Properties"]["TracingConfig"]["Mode"] == "Active" for fn in _functions(traced).values()
    )
    (machine,) = _resources(traced, "AWS::StepFunctions::StateMachine").values()
    assert machine["Properties"]["TracingConfiguration"]["Enabled"] is True


def test_cdk_nag_passes_the_stack_and_fails_a_new_wildcard(tmp_path: Path) -> None:
    """AwsSolutions runs on every synth: the stack as built has no unacknowledged finding, and
    one over-broad statement added to the head's role fails synthesis, named, because the
    acknowledgements cover each accepted resource pattern, not the rule as a whole."""
    import aws_cdk as cdk
    from aws_cdk import aws_iam as iam

    from cdk.app import add_stack, build_app
    from cdk.nag import REPORT, NagError, add_checks, findings, nag_error

    plan = small_plan(("s3", "pipelined", "direct")).save(tmp_path / "plan.json")
    build_app(plan, tmp_path / "ok")
    assert findings(tmp_path / "ok" / REPORT) == []
    app = cdk.App(outdir=str(tmp_path / "bad"))
    stack = add_stack(app, plan)
    everything = stack.bucket.arn_for_objects("*")
    stack.functions.head.role.add_to_principal_policy(
        iam.PolicyStatement(actions=["s3:GetObject"], resources=[everything])
    )
    add_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    found = findings(tmp_path / "bad" / REPORT)
    assert found and all(rule.startswith("AwsSolutions-IAM5") for rule, _ in found)
    assert all("/HeadRole/" in path for _, path in found)
    error = nag_error(tmp_path / "bad")
    assert isinstance(error, NagError) and "AwsSolutions-IAM5" in str(error)


def test_timeouts_follow_the_plans_predicted_times(tmp_path: Path) -> None:
    """An expert predicted at 400 s gets 800 s (TIMEOUT_MARGIN), one at 500 s Lambda's 900 s;
    a direct gate waits its layer (350 s -> 700 s); a plan over 900 s does not validate."""
    document = small_plan(methods=("s3", "direct", "pipelined")).model_dump(mode="json")
    document["layers"][0]["experts"][0]["time_s"] = 400.0
    document["layers"][0]["experts"][1]["time_s"] = 500.0
    document["layers"][1]["latency_s"] = 350.0
    _, template = _synth(tmp_path, Plan.model_validate(document))
    functions = _functions(template)
    assert functions["Layer00Expert00"]["Properties"]["Timeout"] == 800
    assert functions["Layer00Expert01"]["Properties"]["Timeout"] == 900
    assert functions["Layer00Expert02"]["Properties"]["Timeout"] == 300
    assert functions["Layer01"]["Properties"]["Timeout"] == 700
    assert functions["Layer00"]["Properties"]["Timeout"] == 600
    document["layers"][2]["experts"][0]["time_s"] = 901.0
    with pytest.raises(ValueError, match="over Lambda's 900 s timeout"):
        Plan.model_validate(document)


def test_a_stack_over_cloudformations_resource_limit_is_refused_whole(tmp_path: Path) -> None:
    """One layer of 260 experts: nested stacks take whole layers, and 260 functions, each with
    a role, exceed 500 resources in one. synth names the limit and leaves no partial output."""
    experts = 260
    plan = make_plan(tiny_model(1, experts), ("direct",), [[1] * experts])
    path = plan.save(tmp_path / "plan.json")
    out = tmp_path / "cdk.out"
    result = runner.invoke(
        app, ["synth", "--plan", str(path), "--out", str(out), "--no-reserve-concurrency"]
    )
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "more than CloudFormation's 500 resources" in text
    assert "a layer has 260 expert functions" in text and "--pack" in text
    assert not out.exists()


def test_expert_functions_past_the_per_stack_limit_go_into_nested_stacks(
    tmp_path: Path,
) -> None:
    """Four layers of 3 experts, at most 6 per stack: two nested stacks of two whole layers,
    each seeing the bucket through its own parameters; cdk-nag and cfn-lint clean."""
    plan = make_plan(tiny_model(4), ("s3", "pipelined", "direct", "s3"), [[1, 2, 1]] * 4)
    summary, parent = _synth(tmp_path, plan, "--experts-per-stack", "6")
    assert summary["nested_stacks"] == 2 and summary["within_limits"]
    assert summary["cfn_lint"]["ok"] and summary["cdk_nag"]["unacknowledged"] == 0
    assert summary["functions"] == 4 * 3 + 4 + 3
    assert len(summary["templates"]) == 3
    assert summary["largest_template_resources"] == max(
        t["resources"] for t in summary["templates"]
    )
    stacks = _resources(parent, "AWS::CloudFormation::Stack")
    assert len(stacks) == 2
    for stack in stacks.values():
        given = stack["Properties"]["Parameters"]
        assert set(given) == {"BucketArn", "BucketName"}
    in_parent = {fn["Properties"]["Description"].split()[-1] for fn in _functions(parent).values()}
    assert not any("Expert" in name for name in in_parent)
    for entry in summary["templates"][1:]:
        nested = json.loads(Path(entry["template"]).read_text())
        functions = _functions(nested)
        assert len(functions) == 6  # two whole layers of three
        for fn in functions.values():
            env = fn["Properties"]["Environment"]["Variables"]
            assert env["MOELAMBDA_BUCKET"] == {"Ref": "BucketName"}
            for statement in _policies(nested, fn):
                for resource in _listed(statement["Resource"]):
                    assert resource.startswith("<Ref:BucketArn>") or "Logs" in resource, resource
    unnested, _ = _synth(tmp_path / "one", plan)
    assert unnested["nested_stacks"] == 0 and len(unnested["templates"]) == 1


def test_an_environment_lambda_may_refuse_is_reported(tmp_path: Path) -> None:
    """A direct gate naming 64 expert functions: at up to 64 characters a name, its layer plan
    may pass Lambda's 4 KB environment, and synth says so."""
    plan = make_plan(tiny_model(1, 64), ("direct",), [[1] * 64])
    summary, _ = _synth(tmp_path, plan, "--no-reserve-concurrency", "--no-lint")
    assert summary["largest_environment_bytes"] > 4096 and not summary["within_limits"]
    small, _ = _synth(tmp_path / "small", small_plan(), "--no-lint")
    assert small["largest_environment_bytes"] < 4096 and small["within_limits"]


def _packed_plan(expert_bytes: int, hosts: list[list[int]]) -> Plan:
    """Two layers (s3, direct) of 4 experts of `expert_bytes` each, packed as `hosts`."""
    model = tiny_model(2, experts=4)
    for stage in model["stages"]:
        if stage["role"] == "expert":
            stage["bytes"] = expert_bytes
    plan = make_plan(model, ("s3", "direct"), [[1] * 4] * 2).model_dump(mode="json")
    for layer in plan["layers"]:
        layer["experts"] = [
            layer["experts"][0] | {"expert": slot, "hosts": members}
            for slot, members in enumerate(hosts)
        ]
    return Plan.model_validate(plan)


def test_a_packed_function_hosts_its_experts_weights_and_tmp_room_for_them(
    tmp_path: Path,
) -> None:
    """Each function reads only its own experts' weights, and gets /tmp for them past 512 MB."""
    mb = 2**20
    plan = _packed_plan(300 * mb, [[0, 2], [1, 3]])
    assert plan.packed
    _, template = _synth(tmp_path, plan)
    functions = _functions(template)
    experts = sorted(name for name in functions if "Function" in name or "Expert" in name)
    assert experts == [f"Layer{ll:02d}Function{f:02d}" for ll in (0, 1) for f in (0, 1)]
    for ll in (0, 1):
        gate_env = _render(functions[f"Layer{ll:02d}"]["Properties"]["Environment"]["Variables"])
        assert json.loads(gate_env["MOELAMBDA_LAYER_PLAN"])["hosts"] == [[0, 2], [1, 3]]
        for slot, members in enumerate([[0, 2], [1, 3]]):
            fn = functions[f"Layer{ll:02d}Function{slot:02d}"]
            env = fn["Properties"]["Environment"]["Variables"]
            assert env["MOELAMBDA_HOSTS"] == ",".join(map(str, members))
            assert env["MOELAMBDA_EXPERT"] == str(slot)
            bucket = next(iter(_resources(template, "AWS::S3::Bucket")))
            read = _s3_access(_policies(template, fn), bucket)["s3:GetObject"]
            weights = {key for key in read if key.startswith("weights/layers/")}
            assert weights == {f"weights/{expert_key(ll, m)}" for m in members}
            assert fn["Properties"]["EphemeralStorage"] == {"Size": 600 + 64}
    small = _packed_plan(100 * mb, [[0, 1], [2, 3]])
    _, template = _synth(tmp_path / "small", small)
    for name, fn in _functions(template).items():
        assert "EphemeralStorage" not in fn["Properties"], name  # the free 512 MB suffice


@pytest.mark.parametrize(
    ("hosts", "error"),
    [
        ([[0, 1], [2]], "host each of the 4 experts once"),
        ([[0, 1], [1, 2, 3]], "host"),
        ([[1, 0], [2, 3]], "ascending"),
        ([[0], [1, 2, 3]], "one group size per plan"),
    ],
)
def test_a_plan_whose_functions_do_not_host_every_expert_once_is_refused(
    hosts: list[list[int]], error: str
) -> None:
    with pytest.raises(ValidationError, match=error):
        _packed_plan(9, hosts)
