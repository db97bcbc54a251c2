"""The stack of a driver or monolithic plan: the driver, its remote experts, a one-state
workflow; least privilege; cdk-nag and checkov clean; and the plan checks behind it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ground.driver import decode_local, encode_local
from ground.plan import Plan
from tests.cdk.test_scanners import _checkov
from tests.cdk.test_stack import _render, _resources, _synth, make_plan, tiny_model

LOCAL = [[0, 2], [], [0, 1, 2]]  # layer 1 all remote, layer 2 all local


def driver_plan(deployment: str = "driver", memory_mb: int = 10240, **change: Any) -> Plan:
    """A 3-layer, 3-expert plan as `planner.deployments.driver_plan` writes it."""
    local = [[0, 1, 2]] * 3 if deployment == "monolithic" else LOCAL
    base = make_plan(tiny_model(3), ["direct"] * 3, [[1, 1, 1]] * 3).model_dump(mode="json")
    for layer, own in zip(base["layers"], local, strict=True):
        remote = [i for i in range(3) if i not in own]
        layer["experts"] = [
            {
                "expert": slot,
                "hosts": [i],
                "memory_mb": 1024,
                "replicas": 2 if slot == 0 else 1,
                "tokens": 40.0,
                "time_s": 0.01,
                "cost_usd": 1e-7,
                "max_replicas": 8,
                "max_tokens_per_replica": 64,
            }
            for slot, i in enumerate(remote)
        ]
    base |= {
        "deployment": deployment,
        "nonmoe_memory_mb": memory_mb,
        "workflow": "express",
        "driver": {
            "local": local,
            "local_tokens": [[40.0] * len(x) for x in local],
            "time_s": 12.0,
            "weights_mb": 1.0,
            "activations_mb": 1.0,
        },
    }
    return Plan.model_validate(base | change)


@pytest.fixture(scope="module")
def synthesised(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _synth(tmp_path_factory.mktemp("driver"), driver_plan())[1]


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return _resources(template, "AWS::Lambda::Function")


def _by_handler(template: dict[str, Any], role: str) -> dict[str, dict[str, Any]]:
    return {
        k: r
        for k, r in _functions(template).items()
        if r["Properties"]["ImageConfig"]["Command"] == [f"functions.{role}.handler"]
    }


def _policy(template: dict[str, Any], function: dict[str, Any]) -> list[dict[str, Any]]:
    """The function's statements, each with one action (a string) and a list of resources."""
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    document = template["Resources"][role]["Properties"]["Policies"][0]["PolicyDocument"]
    statements = []
    for s in _render(document["Statement"]):
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        statements += [s | {"Action": a, "Resource": resources} for a in actions]
    return statements


def test_a_driver_plan_is_a_driver_its_remote_experts_and_one_task(
    synthesised: dict[str, Any],
) -> None:
    (driver,) = _by_handler(synthesised, "driver").values()
    props = driver["Properties"]
    assert props["MemorySize"] == 10240 and props["Timeout"] <= 900
    env = props["Environment"]["Variables"]
    assert decode_local(env["MOELAMBDA_DRIVER_LOCAL"]) == LOCAL
    experts = _by_handler(synthesised, "expert")
    assert len(experts) == 1 + 3  # layer 0: expert 1; layer 1: all three
    for fn in experts.values():
        variables = fn["Properties"]["Environment"]["Variables"]
        assert variables["MOELAMBDA_DRIVER"] == "1" and variables["MOELAMBDA_METHOD"] == "direct"
        assert fn["Properties"]["ReservedConcurrentExecutions"] == 8
    assert not _by_handler(synthesised, "head") and not _by_handler(synthesised, "layer")
    (machine,) = _resources(synthesised, "AWS::StepFunctions::StateMachine").values()
    definition = json.loads(
        "".join(str(p) for p in _render(machine["Properties"]["DefinitionString"]))
    )
    assert definition["StartAt"] == "Driver"
    kinds = {s["Type"] for s in definition["States"].values()}
    assert kinds == {"Task", "Pass", "Fail"}  # the driver, its cleanup: no Map, no Parallel
    remote = definition["States"]["Driver"]["Parameters"]["Payload"]["remote"]
    assert [[e[0] for e in layer] for layer in remote] == [[1], [0, 1, 2], []]
    assert remote[1][0][2:] == [2, 8, 64]  # replicas, cap, rows per replica


def test_the_driver_may_invoke_its_experts_and_touch_its_request_only(
    synthesised: dict[str, Any],
) -> None:
    (driver,) = _by_handler(synthesised, "driver").values()
    statements = _policy(synthesised, driver)
    (invoke,) = [s for s in statements if s["Action"] == "lambda:InvokeFunction"]
    experts = _by_handler(synthesised, "expert")
    assert {r.split(".")[0].strip("<") for r in invoke["Resource"]} == set(experts)
    by_action = {s["Action"]: s["Resource"] for s in statements}
    writes = {r.split("/", 1)[1] for r in by_action["s3:PutObject"]}
    assert writes == {"outputs/*", "requests/*/00/in/*", "requests/*/01/in/*"}
    reads = {r.split("/", 1)[1] for r in by_action["s3:GetObject"]}
    assert {"inputs/*", "requests/*/00/out/*", "requests/*/01/out/*"} <= reads
    assert "requests/*/02/out/*" not in reads  # layer 2 has no remote expert
    # its stages: manifest, config, head, tail, three layers, and its three local experts
    weights = {r for r in reads if r.startswith("weights/")}
    assert len(weights) == 2 + 2 + 3 + 2 + 0 + 3
    assert by_action["s3:DeleteObject"] == [by_action["s3:DeleteObject"][0]]
    assert by_action["s3:DeleteObject"][0].endswith("/requests/*")


def test_a_monolithic_plan_touches_nothing_but_its_input_and_output(tmp_path: Any) -> None:
    template = _synth(tmp_path, driver_plan("monolithic"))[1]
    assert len(_functions(template)) == 2  # the function and the cleanup
    (fn,) = _by_handler(template, "driver").values()
    statements = _policy(template, fn)
    actions = {s["Action"] for s in statements}
    assert "lambda:InvokeFunction" not in actions and "s3:DeleteObject" not in actions
    writes = [r.split("/", 1)[1] for s in statements if s["Action"] == "s3:PutObject"
              for r in s["Resource"]]  # fmt: skip
    assert writes == ["outputs/*"]


@pytest.mark.parametrize("deployment", ["driver", "monolithic"])
def test_checkov_finds_nothing_unexplained_in_a_driver_stack(
    deployment: str, tmp_path: Any
) -> None:
    _synth(tmp_path, driver_plan(deployment), "--no-lint")
    report = _checkov(tmp_path / "cdk.out" / "MoeLambda.template.json")
    failed = report["results"]["failed_checks"]
    assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nonmoe_memory_mb": 12000}, "outside 128-10240 MB"),
        ({"driver": {"local": LOCAL, "local_tokens": [[1.0] * len(x) for x in LOCAL],
                     "time_s": 901.0, "weights_mb": 1, "activations_mb": 1}},
         "over Lambda's 900 s timeout"),
        ({"driver": None}, "needs a driver exactly when driven"),
        ({"driver": {"local": [[0, 1], [], [0, 1, 2]], "local_tokens": [[1.0, 1.0], [], [1.0] * 3],
                     "time_s": 1.0, "weights_mb": 1, "activations_mb": 1}},
         "must host each of the 3 experts once"),
        ({"driver": {"local": LOCAL, "local_tokens": [[1.0], [], []], "time_s": 1.0,
                     "weights_mb": 1, "activations_mb": 1}}, "local_tokens need one list"),
    ],
)  # fmt: skip
def test_a_driver_plan_that_lambda_cannot_run_is_refused(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        driver_plan(**change)


def test_the_local_mask_round_trips() -> None:
    local = [[0, 3, 63], [], list(range(64))]
    assert decode_local(encode_local(local)) == local
    assert len(encode_local([list(range(64))] * 16)) == 16 * 16 + 15
