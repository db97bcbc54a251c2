"""The batching front door of a plan made for traffic: an SQS queue and the batching function.

Emitted only when the plan has a traffic block (`moelambda plan --traffic`), whose batch policy
it realises; a plan without one is priced and simulated as clients starting one execution per
request, so its stack stays as it was (no queue that nothing would use, no idle pollers billed).

- The queue (SQS-managed server-side encryption, TLS only through its queue policy) takes one
  message per request (`ground.frontdoor.body`); a message that the batcher reports failed 5
  times moves to the dead-letter queue (kept 14 days).
- The event source mapping invokes the batcher with a whole-second batching window of
  `ceil(max_wait_s)` and a batch size of `max_batch_tokens` messages, within Lambda's limits
  (`ground.frontdoor.deployed_window_s`, `records_per_delivery`), and reports batch item
  failures (only a bad message is retried, not its whole delivery).
- The batcher (`functions.batcher`, the one image) may receive and delete its queue's messages
  (sqs:ReceiveMessage, sqs:DeleteMessage, sqs:GetQueueAttributes, what the mapping needs), write
  `inputs/fd-*` (a batch too large for the execution's input) and StartExecution on this
  stack's state machine: nothing else.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from cdk._functions import ServingFunctions
from ground import frontdoor
from ground.driver import remote_table_bytes
from ground.errors import UsageError
from ground.plan import Plan

__all__ = ["CONSUME_ACTIONS", "MAX_RECEIVE_COUNT", "FrontDoor"]

CONSUME_ACTIONS = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"]
MAX_RECEIVE_COUNT = 5  # deliveries of a message before the dead-letter queue (AWS advises >= 5)
_VISIBILITY_FACTOR = 6  # AWS advises a visibility timeout of 6 x the function's timeout
_CALIBRATION = (
    "esm_batching_window_max_s",
    "esm_batch_size_max",
    "esm_batch_size_max_without_window",
)


class FrontDoor(Construct):
    """The queue, its dead-letter queue, the batcher and its event source mapping.

    `window_s` and `batch_size` are what the mapping deploys for the plan's policy.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        plan: Plan,
        functions: ServingFunctions,
        state_machine: sfn.StateMachine,
    ) -> None:
        super().__init__(scope, id_)
        traffic = plan.traffic
        assert traffic is not None
        cal = plan.calibration
        missing = [name for name in _CALIBRATION if name not in cal]
        if missing:
            raise UsageError(
                f"the plan's calibration lacks the front door's limits ({', '.join(missing)}).",
                "plan it again with `moelambda plan --traffic` (the packaged calibration has "
                "them).",
            )
        try:
            self.window_s = frontdoor.deployed_window_s(
                traffic.max_wait_s, float(cal["esm_batching_window_max_s"])
            )
        except ValueError as err:
            raise UsageError(f"{err}.", "plan with a shorter --max-wait.") from None
        self.batch_size = frontdoor.records_per_delivery(
            traffic.max_batch_tokens,
            self.window_s,
            max_records=int(cal["esm_batch_size_max"]),
            max_records_without_window=int(cal["esm_batch_size_max_without_window"]),
        )
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        timeout = Duration.seconds(functions._options.stage_timeout_s)
        self.queue = sqs.Queue(
            self,
            "Requests",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(
                _VISIBILITY_FACTOR * timeout.to_seconds() + self.window_s
            ),
            dead_letter_queue=sqs.DeadLetterQueue(
                max_receive_count=MAX_RECEIVE_COUNT, queue=self.dead_letters
            ),
        )
        self.batcher = functions.add_batcher(
            environment={
                "MOELAMBDA_MAX_BATCH_TOKENS": str(traffic.max_batch_tokens),
                # A batch's ids travel in the execution's input when it fits this.
                "MOELAMBDA_INPUT_LIMIT": str(
                    frontdoor.inline_input_limit(
                        int(cal["step_functions_payload_bytes"]), remote_table_bytes(plan)
                    )
                ),
                "MOELAMBDA_STATE_MACHINE_ARN": state_machine.state_machine_arn,
            },
            statements=[
                iam.PolicyStatement(actions=CONSUME_ACTIONS, resources=[self.queue.queue_arn]),
                iam.PolicyStatement(
                    actions=["states:StartExecution"],
                    resources=[state_machine.state_machine_arn],
                ),
            ],
        )
        self.mapping = lambda_.EventSourceMapping(
            self,
            "Mapping",
            target=self.batcher,
            event_source_arn=self.queue.queue_arn,
            batch_size=self.batch_size,
            max_batching_window=Duration.seconds(self.window_s) if self.window_s else None,
            report_batch_item_failures=True,
        )
        # The mapping polls with the function's role: its policy must exist first.
        self.mapping.node.add_dependency(self.batcher.role)  # type: ignore[arg-type]
