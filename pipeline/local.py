"""Run the synthesised workflow on one machine: moto S3 and Step Functions, real handlers.

The state machine definition and every function's environment come from the CloudFormation
template the CDK app synthesises for the plan, so what runs here is what `cdk deploy` would
deploy. moto's Step Functions interpreter executes the definition; its Lambda invoke would start a
Docker container, so `InProcessLambdas` replaces that one method with a call of the function's
handler in this process, under that function's own environment and its own identity, whose IAM
policy from the template every S3 request and direct Invoke is checked against (`pipeline.iam`).

A GPU-backed function (its placement, `ground.placement`, in its environment or given by the
caller for a plan synthesised without its capacity) runs here on this machine's CPU at
float32, the same handler on the same stages: the run says which functions were moved
(`placement`). `on_planned_device` runs them on their planned placement instead, on a machine
with the GPU (scripts/gpu-check).

A metered run (`pipeline.meter`) first warms every function, as the plan prices steady state,
then counts what AWS would bill for the executions alone.

The runner does not import the handlers it runs: the caller passes them in as `Handlers`
(`functions.local.LocalHandlers`, which `functions.local.run_workflow` passes for you), so
the imports point one way: functions/ imports pipeline/, never back.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
import uuid
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ground import layout
from ground.placement import CPU, Placement
from ground.placement import ENV as PLACEMENT_ENV
from pipeline.client import fetch_result, send_request
from pipeline.faults import ExpertCrash, Faults
from pipeline.iam import Policies, s3_request, sqs_request
from pipeline.meter import Meter, entered_states
from pipeline.tensorio import decode, encode

__all__ = [
    "Handlers",
    "InProcessLambdas",
    "atomic_s3",
    "concrete",
    "function_label",
    "run_front_door",
    "run_workflow",
]

Invoker = Callable[[str, dict[str, Any]], Any]


class Handlers(Protocol):
    """What the runner needs of the Lambda handlers it runs, passed in by its caller.

    `functions.local.LocalHandlers` is the implementation for the project's own handlers.
    """

    def resolve(self, handler: str) -> Callable[[dict[str, Any], Any], Any]:
        """The handler function of a template's `Handler` (module.attribute)."""
        ...

    def environment(
        self, env: Mapping[str, str], invoker: Invoker | None = None
    ) -> AbstractContextManager[None]:
        """A block in which a handler sees `env` as its environment and invokes other
        functions through `invoker`."""
        ...

    def retry_throttled(self, invoke: Invoker) -> Invoker:
        """`invoke`, retrying Lambda's throttling as a direct gate does."""
        ...

    def warm(self, role: str, env: Mapping[str, str]) -> None:
        """Load the weights of a function of `role` (head, layer, expert, tail, cleanup) with
        environment `env` into the process-wide cache, as a warm container holds them."""
        ...

    def drop_clients(self) -> None:
        """Forget the S3 clients made for the run's identities."""
        ...


REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "moelambda-local"


def concrete(value: Any, names: dict[str, str]) -> Any:
    """A template value as deployed: Refs to resource names, Arn attributes to their ARNs."""
    pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Fn::Join":
            return arg[0].join(str(concrete(part, names)) for part in arg[1])
        if fn == "Ref":
            return pseudo.get(arg, names.get(arg, arg))
        if fn == "Fn::GetAtt":
            if f"{arg[0]}.{arg[1]}" in names:  # a queue's Arn (`stream_local` names them)
                return names[f"{arg[0]}.{arg[1]}"]
            if names.get(arg[0], "").startswith(BUCKET):
                return f"arn:aws:s3:::{names[arg[0]]}"
            return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{names.get(arg[0], arg[0])}"
    if isinstance(value, dict):
        return {k: concrete(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [concrete(v, names) for v in value]
    return value


class InProcessLambdas:
    """The one adapter between moto's Lambda and our handlers; records each call's wall time."""

    def __init__(self, handlers: Handlers, faults: Faults | None = None) -> None:
        self.handlers = handlers
        self.faults = faults or Faults()
        self.functions: dict[str, tuple[str, dict[str, str]]] = {}
        self.memory_mb: dict[str, int] = {}
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.errors: list[tuple[str, dict[str, str]]] = []
        self.meter: Meter | None = None  # set while a metered execution runs
        self.policies: Policies | None = None  # enforced when set (`run_workflow` sets them)
        self.bucket = ""  # the bucket whose keys the policies name
        self.moved: dict[str, Placement] = {}  # functions run on the CPU: their planned placement
        self._running = 0
        self._idle = threading.Condition()

    def register(self, name: str, handler: str, env: dict[str, str], memory_mb: int) -> None:
        self.functions[name] = (handler, env)
        self.memory_mb[name] = memory_mb

    def call(self, name: str, event: dict[str, Any], context: Any = None) -> Any:
        """Run function `name`'s handler on `event` (and `context`, Lambda's context object:
        only a stream's worker reads it, for its deadline), with any faults drawn."""
        handler_path, env = self.functions[name]
        handler = self.handlers.resolve(handler_path)
        invoker = self.handlers.retry_throttled(
            lambda target, payload: self._invoke_direct(target, payload, caller=name)
        )
        with self._idle:
            self._running += 1
        started = time.perf_counter()
        response = None
        try:
            with self.handlers.environment(env, invoker):
                response = handler(event, context)
                if self.faults.draw("duplicate"):  # at-least-once: the same event once more
                    again = handler(event, context)
                    if again != response:
                        raise RuntimeError(f"a second delivery of {name} returned another result")
            if _role(handler_path) == "expert" and self.faults.draw("expert-crash"):
                raise ExpertCrash(f"{name}: the expert's process died before it could return")
            return response
        finally:
            elapsed = time.perf_counter() - started
            self.seconds[name].append(elapsed)
            meter = self.meter
            if meter is not None and _role(handler_path) == "batcher":  # the front door's
                meter.batcher_call(self.memory_mb[name], elapsed)
            elif meter is not None:
                expert = _role(handler_path) == "expert"
                meter.lambda_call(self.memory_mb[name], elapsed, event, response, expert=expert)
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _invoke_direct(self, name: str, event: dict[str, Any], *, caller: str) -> Any:
        """A direct gate's synchronous Invoke: authorised by the caller's policy, throttled
        as the Invoke API would be."""
        arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
        policies = self.policies
        if policies is not None and not policies.allows(caller, "lambda:InvokeFunction", arn):
            raise _client_error(
                "AccessDeniedException", f"{caller} is not authorized to invoke {arn}"
            )
        if self.faults.draw("throttle"):
            raise _client_error("TooManyRequestsException", f"Rate exceeded: {name}")
        return self.call(name, event)

    def warm(self) -> None:
        """Load every function's stage into the process-wide weights cache, as warm containers.

        The plan prices steady state, where a warm invocation reads no weights from S3; the
        cleanup function loads none.
        """
        for handler, env in self.functions.values():
            self.handlers.warm(_role(handler), env)

    @contextlib.contextmanager
    def metered(self, meter: Meter) -> Iterator[None]:
        """Report every handler call of this block, and its S3 requests, to `meter`."""
        self.meter = meter
        try:
            with meter.counting_s3():
                yield
        finally:
            self.meter = None

    def drain(self, timeout_s: float) -> bool:
        """Wait for calls still running; False if some outlive `timeout_s`.

        A failed Map stops its execution at once, but invocations already started run to the
        end, as on AWS; they must finish before the mock goes away, or they reach for the real S3.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout_s)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Route moto's Lambda invocations to `call`, with moto's S3 requests made atomic."""
        from moto.awslambda.models import LambdaFunction

        def invoke(function: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
            payload = event if isinstance(event, dict) else json.loads(event or "{}")
            if self.faults.draw("throttle"):  # refused before running: the caller retries
                raise _moto_throttle(function.function_name)
            try:
                return json.dumps(self.call(function.function_name, payload)), False, ""
            except Exception as error:  # the Lambda runtime reports any exception this way
                body = {"errorType": type(error).__name__, "errorMessage": str(error)}
                self.errors.append((function.function_name, body))
                return json.dumps(body), True, ""

        original_invoke = LambdaFunction._invoke_lambda
        LambdaFunction._invoke_lambda = invoke  # type: ignore[method-assign,assignment]
        try:
            with atomic_s3(), self._s3_answers():
                yield
        finally:
            LambdaFunction._invoke_lambda = original_invoke  # type: ignore[method-assign]

    @contextlib.contextmanager
    def _s3_answers(self) -> Iterator[None]:
        """Answer the functions' S3 requests before moto does where AWS would: 403
        AccessDenied where the function's policy denies the request, 503 SlowDown at the
        fault's rate (botocore's retries in the handlers' clients must carry them through).

        Wraps moto's `BotocoreStubber.__call__`, which every client's before-send reaches; a
        meter wrapping it later sees these answers too.
        """
        from moto.core.botocore_stubber import BotocoreStubber

        original = BotocoreStubber.__call__

        def answer(stubber: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
            _, service, operation = event_name.split(".", 2)
            if service == "s3":
                policies = self.policies
                if policies is not None and not s3_request(
                    policies, operation, request, self.bucket
                ):
                    return _s3_error(request, 403, "AccessDenied", "Access Denied")
                if self.faults.draw("s3-slowdown"):
                    return _s3_error(request, 503, "SlowDown", "Reduce your request rate.")
            elif service == "sqs" and self.policies is not None:
                if not sqs_request(self.policies, operation, request):
                    return _sqs_denied(request, operation)
            return original(stubber, event_name, request, **kwargs)

        BotocoreStubber.__call__ = answer  # type: ignore[method-assign]
        try:
            yield
        finally:
            BotocoreStubber.__call__ = original  # type: ignore[method-assign]


_UNLOCKED = ("lambda", "states", "sqs")  # services whose moto requests skip the S3 lock
_atomic_lock = threading.RLock()
_atomic_depth = 0
_unpatched: Any = None


@contextlib.contextmanager
def atomic_s3() -> Iterator[None]:
    """Serialise moto's S3 requests, as a real S3 is atomic per request; nestable.

    moto serves a request in the caller's thread on shared dicts, so a listing racing a put fails
    with "dictionary changed size during iteration". Lambda and Step Functions requests must stay
    outside the lock: an invoke runs a whole handler, and a direct gate that invokes its experts
    from worker threads, or a pipelined expert polling for its gate's uploads, would deadlock.
    So must SQS's: a long poll waits inside moto (on the queue's own condition, which a send
    notifies) and would hold every other request up for its whole wait.
    Nesting only counts: wrapping the patch twice would put the invoke back under the lock.
    """
    global _atomic_depth, _unpatched
    from moto.core.botocore_stubber import BotocoreStubber

    with _atomic_lock:
        _atomic_depth += 1
        if _atomic_depth == 1:
            original = _unpatched = BotocoreStubber.process_request
            request_lock = threading.RLock()

            def process_request(stubber: BotocoreStubber, request: Any) -> Any:
                if any(f"{service}." in request.url for service in _UNLOCKED):
                    return original(stubber, request)
                with request_lock:
                    return original(stubber, request)

            BotocoreStubber.process_request = process_request  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _atomic_lock:
            _atomic_depth -= 1
            if _atomic_depth == 0:
                BotocoreStubber.process_request = _unpatched  # type: ignore[method-assign]
                _unpatched = None


def _sqs_denied(request: Any, operation: str) -> Any:
    """SQS's AccessDenied answer to `request` (its JSON protocol, which boto3 speaks)."""
    from botocore.awsrequest import AWSResponse

    body = json.dumps(
        {
            "__type": "com.amazonaws.sqs#AccessDenied",
            "message": f"not authorized to perform sqs:{operation} on this queue",
        }
    ).encode()
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "x-amzn-query-error": "AccessDenied;Sender",
    }
    return AWSResponse(request.url, 400, headers, _Body(body))


def _s3_error(request: Any, status: int, code: str, message: str) -> Any:
    """S3's error answer to `request`, as botocore parses it."""
    from botocore.awsrequest import AWSResponse

    body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
    return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _Body(body))


class _Body:
    """A canned answer's raw body, as botocore reads a response's."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def _moto_throttle(function: str) -> Exception:
    """Lambda's 429 TooManyRequestsException, raised inside moto's Invoke API (moto turns its
    JsonRESTError into the HTTP error the caller's client raises)."""
    from moto.awslambda.exceptions import LambdaClientError

    error = LambdaClientError("TooManyRequestsException", f"Rate exceeded for {function}")
    error.code = 429
    return error


def _client_error(code: str, message: str) -> Exception:
    """What boto3 raises for a refused Invoke, for the direct gate's in-process invoker."""
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, "Invoke")


def _role(handler: str) -> str:
    """head, layer, expert, tail or cleanup: the handler's module (functions.<role>.handler)."""
    return handler.split(".")[-2]


def function_label(handler: str, env: dict[str, str]) -> str:
    """A function's name in reports: head, layer03, layer03/expert01, tail, cleanup."""
    role = _role(handler)
    if role == "layer":
        return f"layer{int(env['MOELAMBDA_LAYER']):02d}"
    if role == "expert":
        return f"layer{int(env['MOELAMBDA_LAYER']):02d}/expert{int(env['MOELAMBDA_EXPERT']):02d}"
    return role


def placeholder_zip() -> bytes:
    """moto's create_function wants a code archive; the handler runs from this process instead."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("placeholder.py", "")
    return buffer.getvalue()


def _deploy(
    resources: dict[str, Any],
    names: dict[str, str],
    bucket: str,
    lambdas: InProcessLambdas,
    metrics_file: Path | None = None,
    on_planned_device: bool = False,
    placements: Mapping[str, Placement] | None = None,
) -> str:
    """Create the template's functions (registered with `lambdas`, with their policies to
    enforce) and state machine; its ARN. A function placed off the CPU (by its environment or
    by `placements`, by label) runs on the CPU unless `on_planned_device` (noted in
    `lambdas.moved`)."""
    import boto3

    iam = boto3.client("iam", region_name=REGION)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": ["lambda.amazonaws.com", "states.amazonaws.com"]},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role = iam.create_role(RoleName=bucket, AssumeRolePolicyDocument=json.dumps(trust))
    role_arn = role["Role"]["Arn"]
    client = boto3.client("lambda", region_name=REGION)
    functions = {k: names[k] for k, r in resources.items() if r["Type"] == "AWS::Lambda::Function"}
    lambdas.policies = Policies.from_template(
        resources, functions, lambda value: concrete(value, names)
    )
    lambdas.bucket = bucket
    for logical in functions:
        props = resources[logical]["Properties"]
        env = concrete(props.get("Environment", {}).get("Variables", {}), names)
        # The function's identity: its S3 client signs with it, and its policy applies.
        env = {k: str(v) for k, v in env.items()} | {"MOELAMBDA_LOCAL_IDENTITY": names[logical]}
        if metrics_file is not None:
            env["MOELAMBDA_METRICS_FILE"] = str(metrics_file)
        handler = props["ImageConfig"]["Command"][0]
        planned = (placements or {}).get(function_label(handler, env)) or Placement(
            *(env.get(name) or default for name, default in _PLACEMENT)
        )
        env = {k: v for k, v in env.items() if k not in PLACEMENT_ENV}
        if on_planned_device:
            env |= planned.environment()
        elif planned != CPU:
            lambdas.moved[names[logical]] = planned
        client.create_function(
            FunctionName=names[logical],
            Runtime="python3.11",
            Role=role_arn,
            Handler=handler,
            Code={"ZipFile": placeholder_zip()},
        )
        # Lambda's default memory applies where the template sets none.
        lambdas.register(names[logical], handler, env, int(props.get("MemorySize", 128)))
    machines = [r for r in resources.values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    if not machines:  # a stream plan's stack: workers fed by a queue, no workflow
        return ""
    (machine,) = machines
    sfn = boto3.client("stepfunctions", region_name=REGION)
    return sfn.create_state_machine(
        name=bucket,
        definition=concrete(machine["Properties"]["DefinitionString"], names),
        roleArn=role_arn,
        type=machine["Properties"].get("StateMachineType", "STANDARD"),
    )["stateMachineArn"]


_PLACEMENT = tuple(zip(PLACEMENT_ENV, (CPU.device, CPU.dtype), strict=True))


@contextlib.contextmanager
def _lambda_region() -> Iterator[None]:
    """The region variables Lambda's runtime sets in every function (boto3 reads them): the
    batcher's Step Functions client, unlike S3's, needs one. Restored after the run."""
    saved = {k: os.environ.get(k) for k in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    os.environ.update(dict.fromkeys(saved, REGION))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _own_clients(handlers: Handlers) -> Iterator[None]:
    """The functions' S3 clients live as long as the run whose identities they sign with."""
    try:
        yield
    finally:
        handlers.drop_clients()


def _wait(sfn: Any, execution_arns: list[str], deadline: float) -> list[dict[str, Any]]:
    """describe_execution of each execution once it stopped running, or at `deadline`.

    moto has no start_sync_execution, so an Express workflow is polled like a Standard one.
    """
    final = []
    for execution_arn in execution_arns:
        while True:
            info = sfn.describe_execution(executionArn=execution_arn)
            if info["status"] != "RUNNING" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        final.append(info)
    return final


def deployed_names(resources: dict[str, Any], run: str) -> tuple[str, dict[str, str]]:
    """This run's bucket and the name each bucket, function and state machine of the template
    gets on moto: unique to the run, as an enclosing mock (a test session's) keeps earlier
    runs' resources."""
    bucket = f"{BUCKET}-{run}"
    names: dict[str, str] = {}
    for logical, res in resources.items():
        if res["Type"] == "AWS::S3::Bucket":
            names[logical] = bucket
        elif res["Type"] == "AWS::Lambda::Function":
            names[logical] = f"fn-{run}-{logical}"[:64]
        elif res["Type"] == "AWS::StepFunctions::StateMachine":  # its Ref is its ARN
            names[logical] = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{bucket}"
    return bucket, names


def run_workflow(
    template: dict[str, Any],
    weights_dir: Path,
    requests: list[np.ndarray | dict[str, Any]],
    *,
    handlers: Handlers,
    timeout_s: float = 600.0,
    metered: bool = False,
    faults: Faults | None = None,
    metrics_file: Path | None = None,
    on_planned_device: bool = False,
    placements: Mapping[str, Placement] | None = None,
) -> dict[str, Any]:
    """Deploy `template` onto moto, upload the weights, and run one execution per request.

    A request is token ids (uploaded under `inputs/`, the execution input empty) or a dict, the
    execution's input itself (a generation request: `{"generate": {...}}`).

    `metrics_file`: where the gates append their EMF routing records (`functions.metrics`),
    as on Lambda they print them for CloudWatch.

    `faults` injects throttling, S3 SlowDown, expert crashes and duplicate deliveries at its
    rates (`pipeline.faults`); "faults" in the result counts what was injected.

    Returns per request its status, output array (or error and cause) and the intermediates
    left under its prefix; per function (by `function_label`) the wall time of every call.
    `metered` warms every function first and adds "usage": what AWS would bill for the
    executions (`pipeline.meter.USAGE_KEYS`), summed over them; the upload of the inputs and
    the reading of the results are the client's, not the workflow's, and do not count.

    `handlers` runs the template's functions (`functions.local.LocalHandlers`). A GPU-backed
    function (by its environment, or `placements` by label) runs on this machine's CPU at
    float32 unless `on_planned_device`; "placement" in the result names each moved function's
    planned placement.
    """
    import boto3
    from moto import mock_aws

    # The interpreter logs every failed state with its whole parse tree; the result carries the
    # error and cause instead.
    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    resources = template["Resources"]
    run = uuid.uuid4().hex[:8]
    bucket, names = deployed_names(resources, run)
    if metered and faults is not None and faults.any:
        raise ValueError("a metered run injects no faults: retries would be billed")
    lambdas = InProcessLambdas(handlers, faults)
    meter = Meter(bucket)
    config = {"stepfunctions": {"execute_state_machine": True}}
    with mock_aws(config=config), lambdas.installed(), _own_clients(handlers):
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=bucket)
        for path in sorted(p for p in weights_dir.rglob("*") if p.is_file()):
            key = "weights/" + path.relative_to(weights_dir).as_posix()
            s3.upload_file(str(path), bucket, key)
        arn = _deploy(
            resources, names, bucket, lambdas, metrics_file, on_planned_device, placements
        )
        sfn = boto3.client("stepfunctions", region_name=REGION)
        # The caller names its executions and uploads each input under that name; the
        # workflow derives the request's keys from the execution's ARN, not from the caller.
        names_ = [f"{run}-{i:04d}" for i in range(len(requests))]
        inputs = []
        for name, ids in zip(names_, requests, strict=True):
            if isinstance(ids, dict):
                inputs.append(json.dumps(ids))
                continue
            inputs.append("{}")
            s3.put_object(
                Bucket=bucket, Key=layout.input_key(name), Body=encode(ids.astype(np.int64))
            )
        if metered:
            lambdas.warm()
        deadline = time.monotonic() + timeout_s
        with lambdas.metered(meter) if metered else contextlib.nullcontext():
            executions = [
                sfn.start_execution(stateMachineArn=arn, name=name, input=data)["executionArn"]
                for name, data in zip(names_, inputs, strict=True)
            ]
            final = _wait(sfn, executions, deadline)
            lambdas.drain(max(deadline - time.monotonic(), 1.0))
        if metered:
            meter.add_transitions(sum(entered_states(sfn, e) for e in executions))
        results = []
        for execution, info in zip(executions, final, strict=True):
            rid = layout.request_id_of(execution)
            entry: dict[str, Any] = {"request_id": rid, "status": info["status"]}
            if "stopDate" in info:
                entry["seconds"] = (info["stopDate"] - info["startDate"]).total_seconds()
            if info["status"] == "SUCCEEDED":
                key = json.loads(info["output"])["output_key"]
                body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                entry["outputs"] = decode(body)
                entry["output"] = entry["outputs"][0]
            else:
                entry["error"] = info.get("error")
                entry["cause"] = info.get("cause")
            left = s3.list_objects_v2(Bucket=bucket, Prefix=layout.request_prefix(rid))
            entry["intermediates_left"] = left.get("KeyCount", 0)
            results.append(entry)
    labels = {name: function_label(*spec) for name, spec in lambdas.functions.items()}
    seconds = {labels[name]: times for name, times in lambdas.seconds.items()}
    out = {
        "requests": results,
        "seconds": seconds,
        "errors": lambdas.errors,
        "faults": dict(lambdas.faults.injected),
        "placement": {labels[name]: p.describe() for name, p in lambdas.moved.items()},
        # Requests a function's policy refused: (function label, action, resource).
        "denied": [
            (labels.get(who, who), action, resource)
            for who, action, resource in (lambdas.policies.denied if lambdas.policies else [])
        ],
    }
    if metered:
        out["usage"] = meter.usage()
    return out


def _queues(resources: dict[str, Any], run: str) -> tuple[dict[str, str], dict[str, str]]:
    """Create the template's SQS queues on moto (dead-letter queues first, the redrive policy
    as written); (queue URL by logical id, queue ARN by logical id)."""
    import boto3

    sqs = boto3.client("sqs", region_name=REGION)
    queues = {k: r for k, r in resources.items() if r["Type"] == "AWS::SQS::Queue"}
    urls: dict[str, str] = {}
    arns: dict[str, str] = {}
    for logical in sorted(queues, key=lambda k: "RedrivePolicy" in queues[k]["Properties"]):
        props = queues[logical]["Properties"]
        name = f"{run}-{logical}"[:80]
        attributes = {}
        if "VisibilityTimeout" in props:
            attributes["VisibilityTimeout"] = str(props["VisibilityTimeout"])
        if "RedrivePolicy" in props:
            redrive = props["RedrivePolicy"]
            target = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
            attributes["RedrivePolicy"] = json.dumps(
                {
                    "deadLetterTargetArn": arns[target],
                    "maxReceiveCount": redrive["maxReceiveCount"],
                }
            )
        urls[logical] = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arns[logical] = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    return urls, arns


def _sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """The event Lambda's SQS event source mapping invokes a function with."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {k: str(v) for k, v in m.get("Attributes", {}).items()},
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": REGION,
            }
            for m in messages
        ]
    }


def run_front_door(
    template: dict[str, Any],
    weights_dir: Path,
    requests: list[np.ndarray],
    arrivals_s: list[float] | None = None,
    *,
    handlers: Handlers,
    limits: Mapping[str, int],
    timeout_s: float = 600.0,
    metered: bool = False,
    metrics_file: Path | None = None,
) -> dict[str, Any]:
    """Send `requests` through the template's front door on moto: its queue, its batcher.

    `limits` are the calibration's `sqs_request_chunk_bytes` and `sqs_receive_max_messages`.

    The template must have the front door (a plan made with `--traffic`). Each request is one
    message (`ground.frontdoor.body`, id `request-NNNN`) on the queue created from the
    template. moto does not poll an event source mapping without Docker, so this runner plays
    the mapping: it groups the requests into deliveries by the mapping's own window and batch
    size at their arrival times (`ground.frontdoor.deliveries`; `arrivals_s` default all at 0,
    virtual time, nothing sleeps), sends each delivery's messages, receives them (10 per
    ReceiveMessage), invokes the batcher's handler in-process with the SQS event exactly as
    Lambda delivers it (records in sending order), and deletes the messages it did not report
    failed (DeleteMessageBatch), as the mapping does. The batcher starts the executions on
    moto's Step Functions, which run the workflow as `run_workflow` does.

    Returns per request its execution's status and its result as the client reads it
    (`results/<message id>.bin`, which the tail wrote; checked equal to its rows of the
    batch's output); the executions; per function the wall time of its calls; and
    for a `metered` run (functions warmed first) the workflow's "usage" as `run_workflow`
    counts it plus "front_door_usage": the SQS requests, the batcher's invocations,
    GB-seconds and S3 PUTs (of inputs too large to travel inline), against
    "front_door_planned" (`ground.frontdoor.planned`, with the batcher's input limit).
    """
    import boto3
    from moto import mock_aws

    from ground import frontdoor

    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    resources = template["Resources"]
    (mapping,) = [r for r in resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    window_s = int(mapping["Properties"].get("MaximumBatchingWindowInSeconds", 0))
    records = int(mapping["Properties"]["BatchSize"])
    batcher_logical = mapping["Properties"]["FunctionName"]["Ref"]
    queue_logical = mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
    times = [0.0] * len(requests) if arrivals_s is None else [float(t) for t in arrivals_s]
    if len(times) != len(requests) or any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("arrivals_s must give one sorted arrival time per request")
    run = uuid.uuid4().hex[:8]
    bucket, names = deployed_names(resources, run)
    lambdas = InProcessLambdas(handlers)
    chunk, receive_max = limits["sqs_request_chunk_bytes"], limits["sqs_receive_max_messages"]
    meter = Meter(bucket, front_door=frozenset({names[batcher_logical]}), sqs_chunk_bytes=chunk)
    config = {"stepfunctions": {"execute_state_machine": True}}
    ids = [f"request-{i:04d}" for i in range(len(requests))]
    delivered = frontdoor.deliveries(times, window_s, records)
    with mock_aws(config=config), _lambda_region(), lambdas.installed(), _own_clients(handlers):
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=bucket)
        for path in sorted(p for p in weights_dir.rglob("*") if p.is_file()):
            s3.upload_file(
                str(path), bucket, "weights/" + path.relative_to(weights_dir).as_posix()
            )
        urls, queue_arns = _queues(resources, run)
        _deploy(resources, names, bucket, lambdas, metrics_file)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        url = urls[queue_logical]
        if metered:
            lambdas.warm()
        deadline = time.monotonic() + timeout_s
        executions: list[str] = []
        failed_messages: list[str] = []
        with lambdas.metered(meter) if metered else contextlib.nullcontext():
            for first, end, _ in delivered:
                order = {}
                for k in range(first, end):
                    order[send_request(sqs, url, ids[k], requests[k])] = k
                got: list[dict[str, Any]] = []
                while len(got) < end - first:
                    got += sqs.receive_message(
                        QueueUrl=url,
                        MaxNumberOfMessages=min(receive_max, end - first - len(got)),
                        AttributeNames=["All"],
                    ).get("Messages", [])
                got.sort(key=lambda m: order[m["MessageId"]])
                event = _sqs_event(got, queue_arns[queue_logical])
                answer = lambdas.call(names[batcher_logical], event)
                failures = {f["itemIdentifier"] for f in answer["batchItemFailures"]}
                failed_messages += sorted(failures)
                done = [m for m in got if m["MessageId"] not in failures]
                for start in range(0, len(done), receive_max):
                    sqs.delete_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]}
                            for j, m in enumerate(done[start : start + receive_max])
                        ],
                    )
                executions += answer["executions"]
            final = _wait(sfn, executions, deadline)
            lambdas.drain(max(deadline - time.monotonic(), 1.0))
        if metered:
            meter.add_transitions(sum(entered_states(sfn, e) for e in executions))
        results: dict[str, dict[str, Any]] = {}
        batches = []
        for execution, info in zip(executions, final, strict=True):
            members = json.loads(sfn.describe_execution(executionArn=execution)["input"])
            batches.append([m["request"] for m in members["requests"]])
            output = None
            if info["status"] == "SUCCEEDED":
                key = json.loads(info["output"])["output_key"]
                output = decode(s3.get_object(Bucket=bucket, Key=key)["Body"].read())[0]
            for member in members["requests"]:
                start, stop = member["rows"]
                entry: dict[str, Any] = {"execution": execution, "status": info["status"]}
                if output is not None:  # what the client reads: its own result object
                    entry["output"] = fetch_result(s3, bucket, member["message"], timeout_s=5.0)
                    entry["result_key"] = layout.result_key(member["message"])
                    entry["result_equals_batch_rows"] = bool(
                        np.array_equal(entry["output"], output[start:stop])
                    )
                else:
                    entry["error"], entry["cause"] = info.get("error"), info.get("cause")
                results[member["request"]] = entry
    labels = {name: function_label(*spec) for name, spec in lambdas.functions.items()}
    out: dict[str, Any] = {
        "requests": [
            {"request": rid, **results.get(rid, {"status": "NOT_STARTED"})} for rid in ids
        ],
        "executions": batches,
        "deliveries": [list(range(first, end)) for first, end, _ in delivered],
        "failed_messages": failed_messages,
        "seconds": {labels[n]: t for n, t in lambdas.seconds.items()},
        "errors": lambdas.errors,
        "denied": [
            (labels.get(who, who), action, resource)
            for who, action, resource in (lambdas.policies.denied if lambdas.policies else [])
        ],
    }
    if metered:
        out["usage"] = meter.usage()
        out["front_door_usage"] = meter.front_door_usage()
        limit = int(
            resources[batcher_logical]["Properties"]["Environment"]["Variables"][
                "MOELAMBDA_INPUT_LIMIT"
            ]
        )
        size = {rid: int(r.size) for rid, r in zip(ids, requests, strict=True)}
        stored = sum(
            frontdoor.execution_input_bytes(sum(size[m] for m in batch), len(batch)) > limit
            for batch in batches
        )
        out["front_door_planned"] = frontdoor.planned(
            [frontdoor.message_bytes(int(r.size)) for r in requests],
            [end - first for first, end, _ in delivered],
            len(executions),
            stored,
            chunk_bytes=chunk,
            receive_max=receive_max,
        ).as_dict()
    return out
