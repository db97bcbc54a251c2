"""A stream plan's serving: a request queue, its generation workers and an endpoint.

Emitted instead of the Step Functions workflow when the plan has a `stream` block (`ground.stream`
says what each part does; `ground.plan.StreamPlan` what the planner chose):

- The **request queue** (SQS-managed server-side encryption, TLS only through its queue
  policy; a message received `MAX_RECEIVE_COUNT` times moves to the dead-letter queue, kept 14
  days) holds one message per request; its visibility timeout is the plan's
  `visibility_timeout_s`: how long a dead worker's requests stay hidden.
- The **worker** (`functions.worker.handler`) is the plan's driver or monolithic function as
  `cdk._functions` makes it (image, memory, architecture, weights, local experts, its remote
  expert functions and Invoke on exactly those), with Lambda's longest timeout (a worker runs
  until it idles or its deadline stops admission; the plan's visibility timeout must be at
  least that, which Lambda checks when it creates the mapping), concurrency reserved as the
  mapping's maximum (`max(2, workers)`: see where it is set), and its settings in its
  environment: MOELAMBDA_QUEUE_URL, MOELAMBDA_STREAM (`settings`) and, with remote experts,
  MOELAMBDA_REMOTE (the table the workflow's driver Task carries in its payload,
  `ground.driver.remote_table`). A plan whose worker environment could pass Lambda's 4 KB is
  refused, and so is a stack whose reservations (the workers', and the experts' unless
  --no-reserve-concurrency) leave less than Lambda's unreserved minimum of the account's quota
  (`FunctionOptions.concurrency_quota`, else the plan's, else 1,000).
- The **event source mapping** starts workers: one message per invocation (the worker fills
  its other slots itself), at most `max(2, workers)` at once, failures reported per message.
- The **endpoint** (`functions.endpoint.handler`) sends requests to the queue and reads their
  results (and the tokenizer under the weights prefix) behind a Function URL that takes only
  SigV4-signed requests (AWS_IAM; callers need lambda:InvokeFunctionUrl, which this stack
  grants nobody), answers buffered, and has no CORS.

Least privilege (`ground.access.worker`, `ground.access.endpoint`): the worker may receive,
delete and hide (ChangeMessageVisibility) its queue's messages and read its attributes (what the
mapping, which polls with the function's role, needs too); HEAD a request's final answer, write
`results/*`, and touch a remote layer's overflow shards as the driver does. The endpoint may send
to the queue and read `results/*`, `<weights>manifest.json` and `<weights>config/*` (the
tokenizer, through the export's loader): nothing else, no SendMessage for the worker, no
PutObject for the endpoint.

Only CPU placement: a stream plan has no `traffic` block, which is where a plan says a function
runs on Lambda Managed Instances or a GPU (`FunctionCapacity`), so the worker runs where the
driver of a plan without traffic runs; a stream whose traffic names other hardware is refused.
"""

from __future__ import annotations

import json
import re

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from cdk._front_door import MAX_RECEIVE_COUNT
from cdk._functions import FunctionOptions, ServingFunctions
from ground.driver import INVOKED_NAME_MAX, remote_table
from ground.errors import UsageError
from ground.plan import DEFAULT_CONCURRENCY_QUOTA, Plan, StreamPlan
from ground.stream import WorkerSettings

__all__ = [
    "ENDPOINT_ACTIONS",
    "ENDPOINT_MEMORY_MB",
    "ENVIRONMENT_BYTES",
    "ESM_MIN_CONCURRENCY",
    "WORKER_ACTIONS",
    "StreamServing",
    "settings",
]

# The endpoint parses a request, tokenizes its prompt, sends one message and reads small JSON
# objects: no torch on its path. The calibration file has no figure for it; 512 MB is a third
# of a vCPU (mb_per_vcpu 1,769), enough for the tokenizer (the SmolLM2 and Mixtral
# tokenizer.json load in well under 100 MB) beside Python and boto3. Not a planned size: the
# planner does not price the endpoint yet.
ENDPOINT_MEMORY_MB = 512
ENVIRONMENT_BYTES = 4096  # Lambda's limit on a function's environment, keys and values
# The SQS event source mapping's MaximumConcurrency is at least 2 (CloudFormation's minimum).
ESM_MIN_CONCURRENCY = 2
WORKER_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
]
ENDPOINT_ACTIONS = ["sqs:SendMessage"]
# The longest a deployed reference can read, for the 4 KB check: a queue URL
# (https://sqs.<region>.amazonaws.com[.cn]/<12-digit account>/<name of at most 80>) and a
# function's name (64, or an alias's qualified name).
_QUEUE_URL_MAX = len("https://sqs.") + 20 + len(".amazonaws.com.cn/") + 12 + 1 + 80
_TOKEN = re.compile(r"\$\{Token\[[^\]]*\]\}")


def settings(stream: StreamPlan) -> str:
    """MOELAMBDA_STREAM: what worker and endpoint read of the plan's stream, compact JSON
    (`ground.stream.WorkerSettings`, which they parse it with)."""
    return WorkerSettings.of_plan(stream).env()


def _environment_bytes(environment: dict[str, str], longest: dict[str, int]) -> int:
    """The most bytes `environment` can take once deployed: each unresolved token in a value
    counted at `longest[key]` (the queue URL's, a function name's)."""
    total = 0
    for key, value in environment.items():
        tokens = _TOKEN.findall(value)
        total += len(key) + len(_TOKEN.sub("", value)) + len(tokens) * longest.get(key, 64)
    return total


class StreamServing(Construct):
    """The request queue, its dead-letter queue, the worker, its event source mapping, and the
    endpoint with its Function URL (`url`)."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        plan: Plan,
        functions: ServingFunctions,
        options: FunctionOptions,
    ) -> None:
        super().__init__(scope, id_)
        stream = plan.stream
        assert stream is not None and plan.driver is not None  # Plan's own checks
        hardware = str(stream.traffic.get("hardware", "cpu")).lower()
        if not hardware.startswith("cpu"):
            raise UsageError(
                f"the stream was planned on {hardware} hardware, and synth emits a stream's "
                "worker on CPU Lambda only: a stream plan has no capacity block to say how a "
                "GPU-backed worker is placed.",
                "plan the stream for CPU Lambda, or serve this plan per request (a plan without "
                "--traffic's stream).",
            )
        timeout_s = int(plan.calibration["max_timeout_s"])
        if stream.visibility_timeout_s < timeout_s:
            raise UsageError(
                f"the stream's queue hides a received request for {stream.visibility_timeout_s}"
                f" s, under its worker's timeout of {timeout_s} s: Lambda refuses an SQS event "
                "source mapping whose function may run longer than its queue's visibility "
                "timeout.",
                f"plan the stream with a visibility timeout of at least {timeout_s} s.",
            )
        self.max_concurrency = max(ESM_MIN_CONCURRENCY, stream.workers)
        self._check_quota(plan, options, self.max_concurrency)

        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.queue = sqs.Queue(
            self,
            "Requests",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(stream.visibility_timeout_s),
            dead_letter_queue=sqs.DeadLetterQueue(
                max_receive_count=MAX_RECEIVE_COUNT, queue=self.dead_letters
            ),
        )
        stream_json = settings(stream)
        worker_env = {"MOELAMBDA_QUEUE_URL": self.queue.queue_url, "MOELAMBDA_STREAM": stream_json}
        if any(layer.experts for layer in plan.layers):
            names = [
                [functions.target(fn).function_name for fn in fns] for fns in functions.experts
            ]
            # Function names are tokens; they resolve inside the JSON (an Fn::Join).
            worker_env["MOELAMBDA_REMOTE"] = json.dumps(
                remote_table(plan, names), separators=(",", ":")
            )
        # Reserved as the mapping's maximum: a mapping that may start more workers than the
        # function may run has its extra deliveries throttled, and a throttled message stays
        # hidden (Lambda retries it until the visibility timeout) while a running worker with
        # free slots cannot receive it. With workers 1 that allows 2 (the mapping's minimum):
        # a second worker starts only when a message arrives while the first runs and the
        # mapping's pollers take it before the first's own ReceiveMessage does.
        self.worker = functions.add_worker(
            timeout=Duration.seconds(timeout_s),
            reserved=self.max_concurrency,
            environment=worker_env,
            statements=[
                iam.PolicyStatement(actions=WORKER_ACTIONS, resources=[self.queue.queue_arn])
            ],
        )
        self._check_environment(functions, self.worker)
        self.mapping = lambda_.EventSourceMapping(
            self,
            "Mapping",
            target=self.worker,
            event_source_arn=self.queue.queue_arn,
            batch_size=1,  # one message starts a worker; it fills its other slots itself
            max_concurrency=self.max_concurrency,
            report_batch_item_failures=True,
        )
        # The mapping polls with the worker's role: its policy must exist first.
        self.mapping.node.add_dependency(self.worker.role)  # type: ignore[arg-type]
        self.endpoint = functions.add_endpoint(
            memory_mb=ENDPOINT_MEMORY_MB,
            # It answers once the request's final answer exists (the URL is buffered): up to
            # the queue's wait and the longest admissible generation, which a worker's own
            # timeout bounds.
            timeout=Duration.seconds(timeout_s),
            environment={
                "MOELAMBDA_QUEUE_URL": self.queue.queue_url,
                "MOELAMBDA_MODEL_ID": plan.model.model,
                "MOELAMBDA_STREAM": stream_json,
            },
            statements=[
                iam.PolicyStatement(actions=ENDPOINT_ACTIONS, resources=[self.queue.queue_arn])
            ],
        )
        self._check_environment(functions, self.endpoint)
        self.url = self.endpoint.add_function_url(
            auth_type=lambda_.FunctionUrlAuthType.AWS_IAM,
            invoke_mode=lambda_.InvokeMode.BUFFERED,
        )

    @staticmethod
    def _check_quota(plan: Plan, options: FunctionOptions, workers: int) -> None:
        """Refuse a stack whose reservations (the workers', and every expert's max_replicas
        unless --no-reserve-concurrency) leave less than Lambda's unreserved minimum."""
        quota = options.concurrency_quota or plan.concurrency_quota or DEFAULT_CONCURRENCY_QUOTA
        floor = int(plan.calibration.get("lambda_unreserved_concurrency_min", 100))
        experts = plan.reserved_concurrency() if options.reserve_concurrency else 0
        if workers + experts + floor > quota:
            raise UsageError(
                f"the stack reserves {workers:,} concurrent executions for its stream's workers"
                f" and {experts:,} for its experts, and Lambda keeps {floor} unreserved: "
                f"{workers + experts + floor:,} is over the account's concurrency quota of "
                f"{quota:,}.",
                "ask AWS for a higher quota and pass it as --concurrency-quota, pass "
                "--no-reserve-concurrency (the experts then share the unreserved pool; the "
                "workers keep theirs), or plan the stream with fewer workers.",
            )

    @staticmethod
    def _check_environment(functions: ServingFunctions, fn: lambda_.DockerImageFunction) -> None:
        """Refuse a function whose environment could pass Lambda's 4 KB once deployed."""
        longest = {"MOELAMBDA_QUEUE_URL": _QUEUE_URL_MAX, "MOELAMBDA_REMOTE": INVOKED_NAME_MAX}
        flat = functions.environments[fn.node.id]
        size = _environment_bytes(flat, longest)
        if size > ENVIRONMENT_BYTES:
            raise UsageError(
                f"the stream's {fn.node.id.lower()} needs up to {size:,} bytes of environment "
                f"(its settings, step table and remote experts' table), over Lambda's "
                f"{ENVIRONMENT_BYTES:,}.",
                "plan the stream with fewer slots (a shorter step table), or a shape with fewer "
                "remote expert functions (the driver's table names each one).",
            )
