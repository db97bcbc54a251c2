"""The state machine of the serving contract, compiled from the Plan (`ground.semantics`).

head -> per layer [s3: Task(gate) -> Map over the gate's $.experts, each a Map over that expert's
shards, lambda:invoke with the FunctionName the shard carries] | [pipelined: Parallel(Task(gate),
Pass(static expert and shard list) -> the same nested Map) -> Choice -> Pass that keeps the
gate's output] | [direct: Task(gate)] -> tail. Every Task retries Lambda's throttling and
service errors with backoff; every top-level state catches States.ALL into the cleanup Task,
which ends in a Fail carrying the original error and cause.

Why nested Maps: an inline Map runs at most `map_max_concurrency` (40) iterations at once and
queues the rest, which would serialise a wide fan-out. The plan keeps experts per layer and
replicas per expert within it, so one level over experts and one over replicas never queue.
The success path enters exactly the states `ground.semantics.request_counts` bills as Standard
transitions: nothing is added between the Maps and the invocations.

A Map stops at its first failed iteration, but invocations already running go on and may write
their outputs after the cleanup has run. So each expert invocation catches its own error into
its item result ($.failures, a list per expert) and the Maps always wait for all of them; the
next function raises `ExpertFailed` with the first cause, and the cleanup then finds every
intermediate in place. A pipelined gate's failure is caught the same way: it tells its experts
to stop (done.bin = -1), the Parallel waits for them, and a Choice sends the gate's error to
the cleanup.

The workflow type is the plan's: Express (billed by duration, at most 5 minutes) or Standard
(billed per state transition).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from cdk._functions import ServingFunctions
from ground.coldstart import THROTTLE_RETRY
from ground.driver import remote_table
from ground.errors import UsageError
from ground.plan import LayerPlan, Plan

__all__ = ["RETRY_ERRORS", "STANDARD_TIMEOUT_S", "ServingStateMachine", "workflow_timeout_s"]

STANDARD_TIMEOUT_S = 1800  # a Standard execution's default timeout; Express has its own limit

RETRY_ERRORS = [
    "Lambda.TooManyRequestsException",
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
]
_NULL = sfn.JsonPath.string_at("States.StringToJson('null')")
_RETRY = THROTTLE_RETRY  # one source: the traffic simulator waits the same retries


def workflow_timeout_s(plan: Plan, requested: int | None = None) -> int:
    """An execution's timeout: `requested`, else Standard's default or Express's maximum.

    Raises:
        UsageError: `requested` exceeds an Express workflow's maximum duration.
    """
    if plan.workflow == "standard":
        return requested or STANDARD_TIMEOUT_S
    limit = int(plan.calibration["express_max_duration_s"])
    if requested is not None and requested > limit:
        raise UsageError(
            f"a workflow timeout of {requested} s exceeds an Express workflow's {limit} s",
            f"ask for at most {limit} s, or plan with `moelambda plan --workflow standard`.",
        )
    return requested or limit


def _retry_json() -> dict[str, Any]:
    return {
        "ErrorEquals": RETRY_ERRORS,
        "IntervalSeconds": int(_RETRY["interval_s"]),
        "MaxAttempts": int(_RETRY["max_attempts"]),
        "BackoffRate": _RETRY["backoff_rate"],
        "JitterStrategy": "FULL",
    }


class ServingStateMachine(Construct):
    """The request workflow; `state_machine` is the Step Functions resource.

    `timeout_s` defaults by workflow type (`workflow_timeout_s`); the workflow logs its errors
    to a log group kept `log_retention`; `tracing` turns on X-Ray.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        plan: Plan,
        functions: ServingFunctions,
        timeout_s: int | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        tracing: bool = False,
    ) -> None:
        super().__init__(scope, id_)
        self._functions = functions
        fail = sfn.Fail(self, "Failed", cause_path="$.error.Cause", error_path="$.error.Error")
        cleanup = self._task(
            "Cleanup",
            functions.cleanup,
            {"request_id": "$.request_id", "error": "$.error"},
            result_path=sfn.JsonPath.DISCARD,
        )
        cleanup.add_catch(fail, errors=[sfn.Errors.ALL], result_path="$.cleanup_error")
        cleanup.next(fail)
        self._cleanup = cleanup

        chain = self._driver(plan) if plan.topology.driven else self._fan_out_chain(plan, fail)
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_type=(
                sfn.StateMachineType.EXPRESS
                if plan.workflow == "express"
                else sfn.StateMachineType.STANDARD
            ),
            definition_body=sfn.DefinitionBody.from_chainable(chain),
            timeout=Duration.seconds(workflow_timeout_s(plan, timeout_s)),
            # Express keeps no execution history: its log group is the only record of a
            # failure. Errors only, without the tensors' keys and sizes in execution data.
            logs=sfn.LogOptions(
                destination=self.log_group,
                level=sfn.LogLevel.ERROR,
                include_execution_data=False,
            ),
            tracing_enabled=tracing,
        )
        # The Maps invoke experts by the name in each shard: one statement keeps the role small.
        invoked = [
            functions.target(fn).function_arn
            for layer, experts in zip(plan.layers, functions.experts, strict=True)
            if layer.method != "direct"
            for fn in experts
        ]
        if invoked:
            self.state_machine.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["lambda:InvokeFunction"],
                    resources=invoked,  # the alias of a provisioned expert, else unqualified
                )
            )

    def _request(self) -> dict[str, Any]:
        """What the first function of a request gets: the request id (the hash of this
        execution's ARN: the workflow, not the caller, owns the request's keys; unique for
        Express too, whose names may repeat), the execution's name and its input (data)."""
        return {
            "request_id": sfn.JsonPath.hash(sfn.JsonPath.execution_id, "SHA-256"),
            "execution": sfn.JsonPath.execution_name,
            "input": sfn.JsonPath.entire_payload,
        }

    def _driver(self, plan: Plan) -> sfn.IChainable:
        """One Task: the driver serves the whole request (`ground.driver`). Its remote experts
        (their functions, planned replicas, caps and what a replica takes) travel in its
        payload from this definition: the names of hundreds of functions would pass Lambda's
        4 KB of environment. A failure goes to the cleanup (a driver that dies leaves the
        shards it had written through S3)."""
        functions = self._functions
        assert functions.driver is not None
        names = [[functions.target(fn).function_name for fn in fns] for fns in functions.experts]
        remote = remote_table(plan, names)
        driver = self._task(
            "Driver", functions.driver, {}, static=self._request() | {"remote": remote}
        )
        driver.add_catch(
            sfn.Pass(
                self,
                "DriverFailed",
                parameters={
                    "request_id": sfn.JsonPath.hash(sfn.JsonPath.execution_id, "SHA-256"),
                    "error": sfn.JsonPath.object_at("$.error"),
                },
            ).next(self._cleanup),
            errors=[sfn.Errors.ALL],
            result_path="$.error",
        )
        return sfn.Chain.start(driver)

    def _fan_out_chain(self, plan: Plan, fail: sfn.Fail) -> sfn.IChainable:
        """head -> each layer's gate and fan-out -> tail."""
        functions = self._functions
        assert functions.head is not None and functions.tail is not None
        head = self._task("Head", functions.head, {}, static=self._request())
        self._previous: LayerPlan | None = None
        # Nothing to clean up yet (the head's one write is its last step) and no request id in
        # the state to clean up by: a failed head fails the execution with its cause.
        head.add_catch(fail, errors=[sfn.Errors.ALL], result_path="$.error")
        chain = sfn.Chain.start(head)
        previous: dict[str, Any] | None = None
        for layer in plan.layers:
            chain = chain.next(self._layer(layer, previous))
            previous = {"layer": layer.layer, "method": layer.method}
            self._previous = layer
        tail_static: dict[str, Any] = {"previous": previous}
        if plan.traffic is not None:  # behind the front door: it writes each request's result
            tail_static["input"] = sfn.JsonPath.object_at("$$.Execution.Input")
        tail = self._task("Tail", functions.tail, self._gather_paths(), static=tail_static)
        self._catch(tail)
        chain = chain.next(tail)
        return chain

    def _gather_paths(self) -> dict[str, str]:
        """Payload paths of a function that gathers the previous layer (and its failures)."""
        paths = {"request_id": "$.request_id", "hidden_key": "$.hidden_key"}
        if self._previous is not None and self._previous.method != "direct":
            paths["expert_failures"] = "$.failures"
        return paths

    def _catch(self, state: sfn.TaskStateBase | sfn.Parallel | sfn.Map) -> None:
        state.add_catch(self._cleanup, errors=[sfn.Errors.ALL], result_path="$.error")

    def _task(
        self,
        name: str,
        fn: lambda_.IFunction,
        paths: dict[str, str],
        *,
        static: dict[str, Any] | None = None,
        result_path: str | None = None,
    ) -> tasks.LambdaInvoke:
        payload: dict[str, Any] = {k: sfn.JsonPath.string_at(v) for k, v in paths.items()}
        for key, value in (static or {}).items():
            # jsii drops a None; the contract wants an explicit JSON null ("previous": null).
            payload[key] = _NULL if value is None else value
        task = tasks.LambdaInvoke(
            self,
            name,
            lambda_function=self._functions.target(fn),
            payload=sfn.TaskInput.from_object(payload),
            retry_on_service_exceptions=False,
            result_path=result_path,
            output_path=None if result_path else "$.Payload",
        )
        task.add_retry(
            errors=RETRY_ERRORS,
            interval=Duration.seconds(int(_RETRY["interval_s"])),
            max_attempts=int(_RETRY["max_attempts"]),
            backoff_rate=_RETRY["backoff_rate"],
            jitter_strategy=sfn.JitterType.FULL,
        )
        return task

    def _invoke_shard(self, name: str) -> sfn.CustomState:
        """lambda:invoke of the function named in the shard (FunctionName from the item).

        The item's result is {"ok": true}, or {"error": {"Error", "Cause"}} when it failed.
        """
        invoke = sfn.CustomState(
            self,
            name,
            state_json={
                "Type": "Task",
                "Resource": f"arn:{Aws.PARTITION}:states:::lambda:invoke",
                "Parameters": {"FunctionName.$": "$.function", "Payload.$": "$"},
                "ResultSelector": {"ok": True},
                "ResultPath": "$",
                "Retry": [_retry_json()],
            },
        )
        failed = sfn.Pass(
            self, f"{name}Failed", parameters={"error": sfn.JsonPath.object_at("$.error")}
        )
        invoke.add_catch(failed, errors=[sfn.Errors.ALL], result_path="$.error")
        return invoke

    def _fan_out(self, ll: str, *, pipelined: bool) -> sfn.Map:
        """A Map over $.experts whose iteration is a Map over that expert's shards.

        Each shard is one `_invoke_shard`; the result ($.failures) is a list per expert of
        the shards' results. The s3 gate's shards are complete; the pipelined static list
        gets the request id from the execution's state through the item selectors.
        """
        fields = ("layer", "expert", "replica", "function")
        request = {"request_id": sfn.JsonPath.string_at("$.request_id")}
        replicas = sfn.Map(
            self,
            f"{ll}Replicas",
            items_path="$.shards",
            item_selector=(
                request | {k: sfn.JsonPath.string_at(f"$$.Map.Item.Value.{k}") for k in fields}
                if pipelined
                else None
            ),
        )
        replicas.item_processor(self._invoke_shard(f"{ll}Expert"))
        experts = sfn.Map(
            self,
            f"{ll}Experts",
            items_path="$.experts",
            item_selector=(
                request | {"shards": sfn.JsonPath.object_at("$$.Map.Item.Value.shards")}
                if pipelined
                else None
            ),
            result_path="$.failures",
        )
        experts.item_processor(replicas)
        return experts

    def _layer(self, layer: LayerPlan, previous: dict[str, Any] | None) -> sfn.IChainable:
        ll = f"Layer{layer.layer:02d}"
        gate = self._task(
            ll,
            self._functions.layers[layer.layer],
            self._gather_paths(),
            static={"previous": previous},
        )
        if layer.method == "direct":
            self._catch(gate)
            return gate
        if layer.method == "s3":
            self._catch(gate)
            fan_out = self._fan_out(ll, pipelined=False)
            self._catch(fan_out)
            return sfn.Chain.start(gate).next(fan_out)
        # pipelined: every planned (expert, replica) starts with the gate and polls for
        # minibatches, experts with no predicted tokens too (the real batch may route some).
        functions = self._functions.experts[layer.layer]
        experts = [
            {
                "shards": [
                    {
                        "layer": layer.layer,
                        "expert": e.expert,
                        "replica": r,
                        "function": self._functions.target(functions[e.expert]).function_name,
                    }
                    for r in range(e.replicas)
                ]
            }
            for e in layer.experts
        ]
        static = sfn.Pass(
            self,
            f"{ll}Shards",
            parameters={
                "request_id": sfn.JsonPath.string_at("$.request_id"),
                "experts": experts,
            },
        )
        fan_out = self._fan_out(ll, pipelined=True)
        # Name the branches first: moto resolves "$.branches[0].field" to a list, not the value.
        parallel = sfn.Parallel(
            self,
            f"{ll}Pipelined",
            result_selector={
                "gate": sfn.JsonPath.object_at("$[0]"),
                "experts": sfn.JsonPath.object_at("$[1]"),
            },
            result_path="$.branches",
        )
        # The gate's own failure waits for the experts too (it tells them to stop), then fails.
        gate.add_catch(
            sfn.Pass(
                self, f"{ll}GateCaught", parameters={"error": sfn.JsonPath.object_at("$.error")}
            ),
            errors=[sfn.Errors.ALL],
            result_path="$.error",
        )
        parallel.branch(gate)
        parallel.branch(sfn.Chain.start(static).next(fan_out))
        self._catch(parallel)
        gate_failed = sfn.Pass(
            self,
            f"{ll}GateFailed",
            parameters={
                "request_id": sfn.JsonPath.string_at("$.request_id"),
                "error": sfn.JsonPath.object_at("$.branches.gate.error"),
            },
        )
        gate_failed.next(self._cleanup)
        keep = sfn.Pass(
            self,
            f"{ll}Output",
            parameters={
                "request_id": sfn.JsonPath.string_at("$.branches.gate.request_id"),
                "hidden_key": sfn.JsonPath.string_at("$.branches.gate.hidden_key"),
                "failures": sfn.JsonPath.object_at("$.branches.experts.failures"),
            },
        )
        check = sfn.Choice(self, f"{ll}GateOk")
        check.when(sfn.Condition.is_present("$.branches.gate.error"), gate_failed)
        check.otherwise(keep)
        parallel.next(check)
        return sfn.Chain.custom(parallel, [keep], keep)
