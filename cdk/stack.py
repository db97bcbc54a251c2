"""`MoeServingStack`: the bucket, the functions and the state machine of one Plan (a stream
plan's queue, workers and endpoint instead of the state machine)."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from cdk._bucket import ServingBucket
from cdk._front_door import FrontDoor
from cdk._functions import FunctionOptions, ServingFunctions
from cdk._state_machine import ServingStateMachine
from cdk._stream import StreamServing
from cdk.nag import acknowledge, skip_checkov
from ground.plan import Plan

__all__ = ["MoeServingStack"]


class MoeServingStack(Stack):
    """Serve the Plan's model: S3 bucket, one Lambda function per stage, a Step Functions workflow,
    and, for a plan made for traffic, the batching front door (an SQS queue and its batcher);
    a stream plan (`plan.stream`) is served by its queue, generation workers and endpoint
    (`cdk._stream`) instead of a workflow (`workflow` is None, `stream` set).

    Args:
        scope: The app. id_: The stack id (its default name).
        plan: The validated Plan; memory, replicas, methods and architecture come from it.
        options: Timeouts, concurrency reservation, weights prefix. Defaults to
            `FunctionOptions()`.
        workflow_timeout_s: Timeout of one state machine execution. Defaults to 1,800 s for
            a Standard workflow, the Express maximum (300 s) for an Express one.
        **kwargs: Passed to `Stack` (env, description, ...).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        plan: Plan,
        options: FunctionOptions | None = None,
        workflow_timeout_s: int | None = None,
        **kwargs: object,
    ) -> None:
        methods = ", ".join(sorted({layer.method for layer in plan.layers}))
        shape = (
            f"as {plan.topology.what}"
            if plan.topology.driven
            else f"({methods}), {plan.workflow} workflow"
        )
        if plan.stream is not None:
            shape += f", a stream of up to {plan.stream.workers} generation workers"
        kwargs.setdefault(
            "description",
            f"moelambda: {plan.model.model} with {plan.model.experts} experts in "
            f"{plan.model.num_layers} layers {shape}",
        )
        super().__init__(scope, id_, **kwargs)  # type: ignore[arg-type]
        options = options or FunctionOptions()
        self.bucket = ServingBucket(self, "Storage").bucket
        self.functions = ServingFunctions(
            self, "Functions", plan=plan, bucket=self.bucket, options=options
        )
        # A stream plan's workers are its front door and serve whole generations: no workflow.
        self.stream = (
            StreamServing(self, "Stream", plan=plan, functions=self.functions, options=options)
            if plan.stream is not None
            else None
        )
        self.workflow = (
            ServingStateMachine(
                self,
                "Workflow",
                plan=plan,
                functions=self.functions,
                timeout_s=workflow_timeout_s,
                log_retention=options.log_retention,
                tracing=options.tracing,
            )
            if self.stream is None
            else None
        )
        # A plan made for traffic is served behind its batching front door (cdk/_front_door.py).
        self.front_door = (
            FrontDoor(
                self,
                "FrontDoor",
                plan=plan,
                functions=self.functions,
                state_machine=self.workflow.state_machine,
            )
            if plan.traffic is not None and self.workflow is not None
            else None
        )
        acknowledge(self, tracing=options.tracing)
        skip_checkov(self)
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
        if self.workflow is not None:
            CfnOutput(self, "StateMachineArn", value=self.workflow.state_machine.state_machine_arn)
        CfnOutput(self, "WeightsPrefix", value=options.weights_prefix)
        if self.front_door is not None:
            CfnOutput(self, "RequestQueueUrl", value=self.front_door.queue.queue_url)
        if self.stream is not None:
            CfnOutput(self, "RequestQueueUrl", value=self.stream.queue.queue_url)
            CfnOutput(self, "EndpointUrl", value=self.stream.url.url)
