"""What several handlers share: the S3 client, torch's threads, gathering the previous layer."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from functions import config, weights
from functions.config import Config, ConfigError
from ground import frontdoor, layout
from ground.errors import MoelambdaError, UsageError
from pipeline import transports

__all__ = [
    "CapacityError",
    "ExpertFailed",
    "drop_local_clients",
    "gather_previous",
    "request_ids",
    "s3_client",
    "use_lambda_threads",
    "write_results",
]


class CapacityError(MoelambdaError):
    """A batch routes more tokens to an expert than its reserved replicas can take."""


class ExpertFailed(RuntimeError):
    """An expert invocation of the previous layer failed; the message carries its cause."""


_LOCK = threading.Lock()
_CLIENTS: dict[str | None, Any] = {}
_THREADS_SET: list[int] = []


def s3_client() -> Any:
    """One S3 client per process: creating one costs ~50 ms, and clients are thread-safe
    (boto3's default session, which creates them, is not, hence the lock). The local runner,
    which runs every function in one process, gives each function its own identity
    (`Config.local_identity`) and so its own client, as each Lambda function has its role's.

    Standard retries back off (exponentially, with jitter) on S3's 503 SlowDown, up to 10
    attempts; every request a handler makes is a GET, PUT, LIST or DELETE of a fixed key, so a
    retry of one that did land writes the same bytes again and changes nothing. Not the
    adaptive mode: its client-side rate limiter would slow every thread of the client for one
    prefix's SlowDown, and a direct gate's or a pipelined expert's threads poll and write
    different prefixes that S3 scales apart.
    """
    identity = config.current().local_identity
    with _LOCK:
        if identity not in _CLIENTS:
            import boto3
            from botocore.config import Config as BotoConfig

            retries = {"mode": "standard", "max_attempts": 10}
            credentials = (
                {}
                if identity is None
                else {"aws_access_key_id": identity, "aws_secret_access_key": "local"}
            )
            _CLIENTS[identity] = boto3.client(
                "s3",
                config=BotoConfig(retries=retries, max_pool_connections=32),
                **credentials,
            )
        return _CLIENTS[identity]


def drop_local_clients() -> None:
    """Forget the clients of the local runner's identities (each run names its own)."""
    with _LOCK:
        for identity in [i for i in _CLIENTS if i is not None]:
            del _CLIENTS[identity]


def use_lambda_threads(cfg: Config) -> None:
    """On Lambda, run torch on the function's vCPUs (MOELAMBDA_THREADS), once per container.

    The cost model's compute time assumes every vCPU the memory buys computes, so the image
    pins no thread count. Only a real Lambda container (AWS_LAMBDA_FUNCTION_NAME is set) is
    changed: the local runner runs every handler in one process, where the count is global.
    """
    if "AWS_LAMBDA_FUNCTION_NAME" not in os.environ:
        return
    with _LOCK:
        if not _THREADS_SET:
            _THREADS_SET.append(cfg.threads)
            torch.set_num_threads(cfg.threads)


def _raise_failures(layer: int, failures: list[list[dict[str, Any]]] | None) -> None:
    """Surface the first failed expert invocation the state machine's Maps collected.

    `failures` is the outer Map's result: per expert, the inner Map's result per shard, each
    {"ok": true} or {"error": {"Error", "Cause"}}.
    """
    failed = [
        item["error"]
        for expert in failures or []
        for item in expert
        if isinstance(item, dict) and "error" in item
    ]
    if not failed:
        return
    first = failed[0]
    try:
        cause = json.loads(first.get("Cause") or "{}")
        message = f"{cause.get('errorType', first.get('Error'))}: {cause.get('errorMessage')}"
    except (json.JSONDecodeError, AttributeError):
        message = f"{first.get('Error')}: {first.get('Cause')}"
    raise ExpertFailed(
        f"{len(failed)} expert invocation(s) of layer {layer} failed; the first: {message}"
    )


def gather_previous(
    cfg: Config,
    request_id: str,
    previous: dict[str, Any] | None,
    layer: int,
    failures: list[list[dict[str, Any]]] | None = None,
) -> torch.Tensor:
    """The expert sum of layer `layer`, which the event's `previous` must name.

    `failures` is the Maps' per-invocation results: any error among them is raised here.
    """
    if not previous or previous.get("layer") != layer:
        raise ConfigError(
            f"this function gathers layer {layer}, but the event's previous is {previous!r}"
        )
    _raise_failures(layer, failures)
    s3 = s3_client()
    manifest = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest
    return transports.gather(
        s3,
        cfg.bucket,
        request_id,
        layer,
        previous["method"],
        manifest.experts,
        manifest.hidden_size,
    )


def request_ids(s3: Any, bucket: str, event: dict[str, Any]) -> np.ndarray:
    """The token ids of the request whose first function (head or driver) got `event`.

    The state machine sets `execution` (its name); `input` is the caller's execution input.
    The ids come inline as `input["input_ids"]` (a list of equal-length lists of ints, within
    the workflow's input limit), else from `inputs/<execution name>.bin`, never from a key the
    caller names.
    """
    given = event.get("input") or {}
    if "input_ids" in given:
        return _inline_ids(given["input_ids"])
    key = layout.input_key(layout.validate_execution_name(event.get("execution")))
    return transports.read_tensors(s3, bucket, key)[0]


def _inline_ids(value: Any) -> np.ndarray:
    """Token ids sent in the execution input, as an (N, T) int64 array."""
    try:
        ids = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as err:
        raise UsageError(
            f"input_ids is not a list of lists of token ids: {err}",
            'send {"input_ids": [[101, 2023, ...], ...]} with windows of equal length.',
        ) from err
    if ids.ndim != 2 or ids.size == 0 or (ids < 0).any():
        raise UsageError(
            f"input_ids must be a non-empty 2-D list of non-negative token ids, not shape "
            f"{ids.shape}",
            'send {"input_ids": [[101, 2023, ...], ...]} with windows of equal length.',
        )
    return ids


def write_results(s3: Any, bucket: str, output: np.ndarray, requests: Any) -> None:
    """Each front-door request's rows of `output` to its own object (none for other callers)."""
    if requests is None:
        return
    try:
        parts = [
            (layout.result_key(r["message"]), int(r["rows"][0]), int(r["rows"][1]))
            for r in requests
        ]
    except (TypeError, KeyError, IndexError, ValueError) as err:
        raise UsageError(
            f"the execution input's requests are not the front door's: {err!r}",
            "start executions with requests through the front door's queue.",
        ) from err
    if any(not 0 <= a < b <= output.shape[0] for _, a, b in parts):
        raise UsageError(
            f"the execution input's request rows do not fit its {output.shape[0]} windows",
            "start executions with requests through the front door's queue.",
        )
    with ThreadPoolExecutor(frontdoor.RESULT_WRITERS) as pool:
        list(
            pool.map(
                lambda p: transports.write_tensors(s3, bucket, p[0], output[p[1] : p[2]]), parts
            )
        )
