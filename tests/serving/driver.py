"""Running the handlers: a tiny in-process stand-in for the state machine.

`run_request` calls the handlers in the workflow's order. Each runs inside `config.local` with
the environment its Lambda function would have, in the thread that calls it, so concurrent
handlers never see each other's configuration. The synthesised template's own definition runs
through `pipeline.local.run_workflow` instead, which meters what AWS would bill.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from functions import cleanup, config, expert, head, layer, tail
from ground import layout
from ground.semantics import S3_REQUEST_TYPES
from pipeline.tensorio import decode, encode

Handler = Any


DIRECT_LIMIT = 6 * 1024 * 1024


@dataclass
class Deployment:
    """What the CDK stack would configure: per layer a method and β, per expert its replicas.

    `max_replicas` defaults to the replicas, `max_tokens` to a count no batch here reaches.
    """

    bucket: str
    methods: list[str]
    beta: int
    replicas: list[list[int]]
    expert_env: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)
    max_replicas: list[list[int]] | None = None
    max_tokens: list[list[int]] | None = None

    @staticmethod
    def function(layer: int, expert: int) -> str:
        return f"moelambda-expert-{layer:02d}-{expert:02d}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # A short pipeline timeout fails a broken test fast instead of after the default 60 s.
        env = {"MOELAMBDA_BUCKET": self.bucket, "MOELAMBDA_POLL_S": "0.05"}
        return env | {"MOELAMBDA_PIPELINE_TIMEOUT_S": "20"} | (extra or {})

    def layer_env(self, index: int) -> dict[str, str]:
        experts = len(self.replicas[index])
        plan = {
            "method": self.methods[index],
            "beta": self.beta,
            "replicas": self.replicas[index],
            "max_replicas": (self.max_replicas or self.replicas)[index],
            "max_tokens": self.max_tokens[index] if self.max_tokens else [100_000] * experts,
            "payload_limit": DIRECT_LIMIT,
            "expert_functions": [
                self.function(index, e) for e in range(len(self.replicas[index]))
            ],
        }
        return self.env({"MOELAMBDA_LAYER": str(index), "MOELAMBDA_LAYER_PLAN": json.dumps(plan)})

    def expert_env_of(self, index: int, number: int) -> dict[str, str]:
        own = {
            "MOELAMBDA_LAYER": str(index),
            "MOELAMBDA_EXPERT": str(number),
            "MOELAMBDA_METHOD": self.methods[index],
            "MOELAMBDA_BETA": str(self.beta),
            "MOELAMBDA_PAYLOAD_LIMIT": str(DIRECT_LIMIT),
        }
        return self.env(own | self.expert_env.get((index, number), {}))

    def invoke(self, function: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The direct layer's lambda.invoke, answered by the expert handler in this process."""
        index, number = (int(part) for part in function.split("-")[-2:])
        return call(expert.handler, self.expert_env_of(index, number), payload, self.invoke)


def call(
    handler: Handler, env: dict[str, str], event: dict[str, Any], invoker: Any = None
) -> dict[str, Any]:
    with config.local(env, invoker):
        return handler(event, None)


_call = call  # run_request shadows `call` with its duplicating variant


def _experts(dep: Deployment, index: int, items: list[dict[str, Any]]) -> list[Any]:
    return [
        (expert.handler, dep.expert_env_of(index, item["expert"]), item, None) for item in items
    ]


def _run_all(calls: list[tuple[Handler, dict[str, str], dict[str, Any], Any]]) -> list[Any]:
    """Run calls concurrently, one thread each: pipelined experts block until the gate writes."""
    if not calls:
        return []
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(_call, *c) for c in calls]
        return [f.result() for f in futures]


def run_request(
    dep: Deployment,
    s3: Any,
    request_id: str,
    ids: np.ndarray,
    expert_results: list[dict[str, Any]] | None = None,
    *,
    duplicate: bool = False,
) -> np.ndarray:
    """head -> per layer (layer, experts) -> tail; returns the decoded output.

    The results of the expert functions the state machine invoked go to `expert_results`.
    `duplicate` delivers every invocation a second time once the first has returned, as
    Lambda's at-least-once delivery may, and requires the same result from it.
    """
    log = [] if expert_results is None else expert_results

    def call(*args: Any) -> Any:
        first = _call(*args)
        if duplicate:
            assert _call(*args) == first, f"a second delivery of {args[0].__module__} differs"
        return first

    def run_all(calls: list[tuple[Handler, dict[str, str], dict[str, Any], Any]]) -> list[Any]:
        results = _run_all(calls)
        if duplicate:
            assert [_call(*c) for c in calls] == results, "a second delivery differs"
        return results

    s3.put_object(Bucket=dep.bucket, Key=layout.input_key(request_id), Body=encode(ids))
    event = {"request_id": request_id, "execution": request_id, "input": {}}
    out = call(head.handler, dep.env(), event)
    previous = None
    for index, method in enumerate(dep.methods):
        event = {"request_id": request_id, "hidden_key": out["hidden_key"], "previous": previous}
        gate = (layer.handler, dep.layer_env(index), event, dep.invoke)
        if method == "pipelined":
            static = [
                {"request_id": request_id, "layer": index, "expert": e, "replica": r}
                | {"function": dep.function(index, e)}
                for e, count in enumerate(dep.replicas[index])
                for r in range(count)
            ]
            out, *results = run_all([gate, *_experts(dep, index, static)])
        else:
            out = call(*gate)
            shards = [shard for entry in out["experts"] for shard in entry["shards"]]
            results = run_all(_experts(dep, index, shards))
        log += results
        previous = {"layer": index, "method": method}
    event = {"request_id": request_id, "hidden_key": out["hidden_key"], "previous": previous}
    result = call(tail.handler, dep.env(), event)
    body = s3.get_object(Bucket=dep.bucket, Key=result["output_key"])["Body"].read()
    return decode(body)[0]


def clean(dep: Deployment, request_id: str) -> dict[str, Any]:
    """What the Catch does on a failure."""
    return call(cleanup.handler, dep.env(), {"request_id": request_id})


@contextmanager
def s3_requests(client: Any) -> Iterator[Counter[str]]:
    """Count the requests `client` makes in this block by the billed types of `Requests`.

    A GetObject that found nothing, or that read a done.bin marker, is a poll; an operation
    the cost model does not know counts under its own name, so a comparison shows it.
    """
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def remember_key(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["moelambda_key"] = params.get("Key", "")

    def count(http_response: Any, model: Any, context: dict[str, Any], **_: Any) -> None:
        kind = S3_REQUEST_TYPES.get(model.name, model.name)
        key = context.get("moelambda_key", "")
        if model.name == "GetObject" and (
            http_response.status_code == 404 or key.endswith("/done.bin")
        ):
            kind = "s3_get_poll"
        with lock:
            counts[kind] += 1

    events = client.meta.events
    events.register("before-parameter-build.s3", remember_key, unique_id="moelambda-key")
    events.register("after-call.s3", count, unique_id="moelambda-count")
    try:
        yield counts
    finally:
        events.unregister("before-parameter-build.s3", unique_id="moelambda-key")
        events.unregister("after-call.s3", unique_id="moelambda-count")
