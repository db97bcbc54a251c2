"""A stream plan's stack on moto: its queue, its workers started as the event source mapping
starts them, its endpoint's identity, the real handlers in this process.

`StreamStack` deploys the template `moelambda synth` emits for a stream plan (the request queue
and its dead-letter queue, the worker and endpoint functions, the mapping; `ground.stream`) and
plays the mapping: while messages wait and fewer than its maximum concurrency of workers run, it
receives one message (a long poll of 1 s) and invokes the worker's handler with it in a thread of
its own, with a Lambda context whose deadline is the function's timeout; when the handler
returns, it deletes that message, as the mapping does; when it raises, the message stays, to
come back after the queue's visibility timeout (a worker that dies). Nothing else is emulated:
the workers receive, write and delete through moto themselves.

`meter` counts, per kind, the requests AWS would bill: the SQS sends, receives and deletes,
and the S3 requests by key class (the results' PUTs, their HEADs and GETs), plus the workers'
invocations and GB-seconds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground.layout import RESULTS_PREFIX
from pipeline.local import (
    REGION,
    Handlers,
    InProcessLambdas,
    _deploy,
    _lambda_region,
    _own_clients,
    _queues,
    _sqs_event,
    deployed_names,
)
from pipeline.meter import identity_of, object_key

__all__ = ["StreamMeter", "StreamStack", "stream_stack"]

_MB_PER_GB = 1024


class StreamMeter:
    """Thread-safe counts of a stream's billed requests (see the module docstring)."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, amount: float = 1) -> None:
        with self._lock:
            self.counts[kind] += amount  # type: ignore[assignment]

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.counts)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the SQS and S3 requests made in this block (under `moto.mock_aws`)."""
        from moto.core.botocore_stubber import BotocoreStubber

        original = BotocoreStubber.__call__

        def counted(stubber: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
            response = original(stubber, event_name, request, **kwargs)
            _, service, operation = event_name.split(".", 2)
            if response is None:
                return response
            if service == "sqs" and response.status_code < 300:
                self.add(f"sqs_{operation}")
            elif service == "s3" and identity_of(request) is not None:
                key = object_key(request.url, self.bucket)
                if key is not None and key.startswith(RESULTS_PREFIX):
                    found = "" if response.status_code < 300 else "_missing"
                    self.add(f"s3_{operation}{found}")
                elif key is not None:
                    self.add(f"s3_{operation}_other")
            return response

        BotocoreStubber.__call__ = counted  # type: ignore[method-assign]
        try:
            yield
        finally:
            BotocoreStubber.__call__ = original  # type: ignore[method-assign]


@dataclass
class _Context:
    """What a worker reads of Lambda's context object: its deadline and its request id."""

    timeout_s: float
    started: float = field(default_factory=time.monotonic)
    aws_request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def get_remaining_time_in_millis(self) -> int:
        return int(max(0.0, self.started + self.timeout_s - time.monotonic()) * 1000)


@dataclass
class StreamStack:
    """A deployed stream stack on moto (`stream_stack`), its mapping running."""

    lambdas: InProcessLambdas
    bucket: str
    queue_url: str
    endpoint_env: dict[str, str]
    worker: str
    max_workers: int
    timeout_s: float
    meter: StreamMeter
    invocations: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _invoke(self, message: dict[str, Any], queue_arn: str) -> None:
        import boto3

        started = time.perf_counter()
        entry: dict[str, Any] = {"message": message["MessageId"], "ok": False}
        try:
            event = _sqs_event([message], queue_arn)
            entry["answer"] = self.lambdas.call(self.worker, event, _Context(self.timeout_s))
            entry["ok"] = True
            boto3.client("sqs", region_name=REGION).delete_message(
                QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
        except Exception as error:  # the invocation failed: the message comes back later
            entry["error"] = f"{type(error).__name__}: {error}"
        finally:
            seconds = time.perf_counter() - started
            entry["seconds"] = seconds
            memory = self.lambdas.memory_mb[self.worker]
            self.meter.add("worker_invocations")
            self.meter.add("worker_gb_s", seconds * memory / _MB_PER_GB)
            with self._changed:
                self.invocations.append(entry)
                self.running -= 1
                self._changed.notify_all()

    def _map(self, queue_arn: str) -> None:
        """The event source mapping's loop (see the module docstring)."""
        import boto3

        sqs = boto3.client("sqs", region_name=REGION)
        while not self._stop.is_set():
            with self._changed:
                if self.running >= self.max_workers:
                    self._changed.wait(0.1)
                    continue
            got = sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=1
            ).get("Messages", [])
            for message in got:
                with self._changed:
                    self.running += 1
                thread = threading.Thread(
                    target=self._invoke, args=(message, queue_arn), daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def idle(self, timeout_s: float) -> bool:
        """Wait until no worker runs; False if one still runs after `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(lambda: self.running == 0, timeout=timeout_s)


@contextlib.contextmanager
def stream_stack(
    template: dict[str, Any],
    weights_dir: Path,
    *,
    handlers: Handlers,
    warm: bool = True,
    visibility_timeout_s: int | None = None,
    max_workers: int | None = None,
    metrics_file: Path | None = None,
) -> Iterator[StreamStack]:
    """Deploy a stream plan's `template` on moto and run its mapping until the block ends.

    `warm` loads the worker's weights first (a warm environment, as the plan's steady state);
    `visibility_timeout_s` replaces the queue's (a test of a dying worker need not wait the
    deployed one); `max_workers` caps the workers below the mapping's maximum (a bench on a
    machine of few cores); `metrics_file` collects what the functions print for CloudWatch
    (the workers' iteration timings).
    """
    import boto3
    from moto import mock_aws

    logging.getLogger("moto").setLevel(logging.CRITICAL)
    resources = template["Resources"]
    if visibility_timeout_s is not None:
        resources = {
            k: (
                r | {"Properties": r["Properties"] | {"VisibilityTimeout": visibility_timeout_s}}
                if r["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" in r["Properties"]
                else r
            )
            for k, r in resources.items()
        }
    (mapping,) = [r for r in resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    worker_logical = mapping["Properties"]["FunctionName"]["Ref"]
    queue_logical = mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
    scaling = mapping["Properties"].get("ScalingConfig", {})
    bucket, names = deployed_names(resources, uuid.uuid4().hex[:8])
    worker_props = resources[worker_logical]["Properties"]
    reserved = worker_props.get("ReservedConcurrentExecutions")
    limits = [
        int(v) for v in (scaling.get("MaximumConcurrency"), reserved, max_workers) if v is not None
    ]
    lambdas = InProcessLambdas(handlers)
    with mock_aws(), _lambda_region(), lambdas.installed(), _own_clients(handlers):
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=bucket)
        for path in sorted(p for p in weights_dir.rglob("*") if p.is_file()):
            s3.upload_file(
                str(path), bucket, "weights/" + path.relative_to(weights_dir).as_posix()
            )
        urls, arns = _queues(resources, bucket)
        names |= urls | {f"{k}.Arn": v for k, v in arns.items()}
        _deploy(resources, names, bucket, lambdas, metrics_file)
        (endpoint,) = [
            name
            for name, (handler, _) in lambdas.functions.items()
            if handler.startswith("functions.endpoint")
        ]
        stack = StreamStack(
            lambdas=lambdas,
            bucket=bucket,
            queue_url=urls[queue_logical],
            endpoint_env=lambdas.functions[endpoint][1],
            worker=names[worker_logical],
            max_workers=min(limits) if limits else 1,
            timeout_s=float(worker_props.get("Timeout", 900)),
            meter=StreamMeter(bucket),
        )
        if warm:
            lambdas.handlers.warm("worker", lambdas.functions[stack.worker][1])
        mapper = threading.Thread(target=stack._map, args=(arns[queue_logical],), daemon=True)
        with stack.meter.counting():
            mapper.start()
            try:
                yield stack
            finally:
                stack._stop.set()
                mapper.join()
                for thread in stack._threads:
                    thread.join()
