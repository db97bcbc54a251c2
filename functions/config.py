"""Per-invocation configuration of a handler: its environment, and how it invokes other functions.

In Lambda each function has its own environment. The local runner executes many differently
configured handlers concurrently in one process, so it cannot use os.environ: it sets a
contextvar for the call instead (`local`), and `current()` prefers that over os.environ. The
configuration is read at call time and never cached, so no handler sees another's settings.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
from botocore.exceptions import ClientError

from ground.errors import ModelError, MoelambdaError
from ground.method import METHODS
from ground.placement import CPU, Placement
from ground.placement import ENV as PLACEMENT_ENV
from ground.semantics import POLL_S

__all__ = [
    "Config",
    "ConfigError",
    "Invoker",
    "LayerPlan",
    "RemoteFunction",
    "remote_plan",
    "current",
    "lambda_invoker",
    "local",
    "retry_throttled",
]

Invoker = Callable[[str, dict[str, Any]], dict[str, Any]]
_INVOKE_POOL = 64  # HTTP connections kept for a direct gate's concurrent invokes
_LAMBDA_MAX_S = 900  # Lambda max_timeout_s (calibration.json, which handlers do not read)
_THROTTLE_ATTEMPTS = 8  # throttled Invokes, backing off up to 20 s each

_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("moelambda_env", default=None)
_INVOKER: ContextVar[Invoker | None] = ContextVar("moelambda_invoker", default=None)


class ConfigError(MoelambdaError):
    """A function's environment lacks a setting or holds an invalid one: a deployment bug."""


_LAMBDA_LOCK = threading.Lock()
_LAMBDA: list[Any] = []


def _lambda_client() -> Any:
    """One Lambda client per process, like `functions.common.s3_client` (boto3's default
    session is not thread-safe, and a direct gate invokes from many threads at once).

    botocore never retries an Invoke here: a retried read timeout or dropped connection would
    run the expert a second time. The read timeout outlasts Lambda's longest run, and
    `retry_throttled` retries only throttling, which Lambda reports before running anything.
    """
    with _LAMBDA_LOCK:
        if not _LAMBDA:
            import boto3
            from botocore.config import Config as BotoConfig

            _LAMBDA.append(
                boto3.client(
                    "lambda",
                    config=BotoConfig(
                        read_timeout=_LAMBDA_MAX_S + 30,
                        retries={"mode": "standard", "total_max_attempts": 1},
                        max_pool_connections=_INVOKE_POOL,
                    ),
                )
            )
        return _LAMBDA[0]


def retry_throttled(invoke: Invoker) -> Invoker:
    """`invoke`, retrying Lambda's throttling with full jitter, and nothing else.

    TooManyRequestsException means the function did not run, so taking it again cannot run an
    expert twice; any other failure (a function error, a timeout, a dropped connection) may
    have run it, and surfaces at once.
    """

    def call(function: str, payload: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(_THROTTLE_ATTEMPTS):
            try:
                return invoke(function, payload)
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code")
                if code != "TooManyRequestsException" or attempt == _THROTTLE_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0, min(20.0, 0.1 * 2**attempt)))
        raise AssertionError("unreachable: the last attempt returns or raises")

    return call


def _invoke_once(function: str, payload: dict[str, Any]) -> dict[str, Any]:
    response = _lambda_client().invoke(
        FunctionName=function, InvocationType="RequestResponse", Payload=json.dumps(payload)
    )
    body = json.loads(response["Payload"].read() or b"null")
    if "FunctionError" in response:
        raise RuntimeError(f"{function} failed: {body}")
    return body


lambda_invoker = retry_throttled(_invoke_once)
"""Invoke a Lambda function synchronously and return its decoded result, raising its error."""


_REDEPLOY = "synthesise and deploy the stack again from the plan (cdk deploy -c plan=...)."


@dataclass(frozen=True)
class LayerPlan:
    """MOELAMBDA_LAYER_PLAN: how this layer scatters to its experts, one entry per function.

    `replicas` is the plan's split, `max_replicas` the reserved concurrency the gate may spread
    a batch's real tokens over, `max_tokens` what one replica can take; `payload_limit` bounds
    a direct Invoke's JSON event (the plan's `direct_payload_bytes`). `hosted` lists each
    function's experts; a packed plan's JSON has "hosts", an unpacked one leaves it out (function
    i hosts expert i) to keep the environment within Lambda's 4 KB.
    """

    method: str
    beta: int
    replicas: tuple[int, ...]
    max_replicas: tuple[int, ...]
    max_tokens: tuple[int, ...]
    payload_limit: int
    expert_functions: tuple[str, ...]
    hosted: tuple[tuple[int, ...], ...]

    def slot_of(self) -> np.ndarray:
        """(experts,) the slot of the function hosting each expert."""
        slots = np.empty(sum(len(h) for h in self.hosted), dtype=np.int64)
        for slot, members in enumerate(self.hosted):
            slots[list(members)] = slot
        return slots

    @classmethod
    def from_json(cls, text: str) -> LayerPlan:
        try:
            raw = json.loads(text)
            plan = cls(
                raw["method"],
                int(raw["beta"]),
                tuple(int(r) for r in raw["replicas"]),
                tuple(int(r) for r in raw["max_replicas"]),
                tuple(int(t) for t in raw["max_tokens"]),
                int(raw["payload_limit"]),
                tuple(str(f) for f in raw["expert_functions"]),
                tuple(
                    tuple(int(x) for x in members)
                    for members in raw.get("hosts") or [[i] for i in range(len(raw["replicas"]))]
                ),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(
                f"MOELAMBDA_LAYER_PLAN is not a valid layer plan: {err!r}", _REDEPLOY
            ) from err
        lists = (
            plan.replicas,
            plan.max_replicas,
            plan.max_tokens,
            plan.expert_functions,
            plan.hosted,
        )
        if len({len(values) for values in lists}) != 1:
            raise ConfigError(
                "MOELAMBDA_LAYER_PLAN needs replicas, max_replicas, max_tokens, a function name "
                "and its experts for every function",
                _REDEPLOY,
            )
        everyone = sorted(x for members in plan.hosted for x in members)
        if everyone != list(range(len(everyone))) or not all(plan.hosted):
            raise ConfigError(
                f"MOELAMBDA_LAYER_PLAN's hosts must cover every expert once: {plan.hosted}",
                _REDEPLOY,
            )
        in_range = (
            plan.method in METHODS
            and plan.beta >= 1
            and plan.payload_limit >= 1
            and all(1 <= r <= m for r, m in zip(plan.replicas, plan.max_replicas, strict=True))
            and min(plan.max_tokens, default=1) >= 1
        )
        if not in_range:
            raise ConfigError(f"MOELAMBDA_LAYER_PLAN is out of range: {raw}", _REDEPLOY)
        return plan


@dataclass(frozen=True)
class RemoteFunction:
    """One remote expert of a driver: the expert, its function (slot = its index in the
    layer's list), the plan's replicas, its cap (reserved concurrency), and what one replica
    takes (its memory)."""

    expert: int
    function: str
    replicas: int
    max_replicas: int
    max_tokens: int


def remote_plan(
    raw: Any, layers: int, local: list[list[int]], experts: int
) -> list[list[RemoteFunction]]:
    """The driver event's "remote" (per layer [[expert, function, replicas, max_replicas,
    max_tokens], ...], set by the state machine from the plan), checked against the local
    experts: together they hold each of the `experts` of every layer once.

    Raises:
        ConfigError: Malformed, or not the complement of the local experts.
    """
    try:
        plan = [
            [RemoteFunction(int(e), str(f), int(r), int(m), int(t)) for e, f, r, m, t in layer]
            for layer in raw
        ]
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"the driver's remote experts are not a valid plan: {err!r}", _REDEPLOY
        ) from err
    if len(plan) != layers or len(local) != layers:
        raise ConfigError(
            f"the driver has {len(local)} layers of local experts and {len(plan)} of remote "
            f"ones, the model {layers}",
            _REDEPLOY,
        )
    for index, (remote, own) in enumerate(zip(plan, local, strict=True)):
        held = sorted([f.expert for f in remote] + list(own))
        if held != list(range(experts)):
            raise ConfigError(
                f"layer {index}: the driver's local {own} and remote "
                f"{[f.expert for f in remote]} experts do not hold each of {experts} once",
                _REDEPLOY,
            )
        if any(not 1 <= f.replicas <= f.max_replicas or f.max_tokens < 1 for f in remote):
            raise ConfigError(f"layer {index}: remote replicas out of range", _REDEPLOY)
    return plan


class Config:
    """Typed accessors over one invocation's environment; a missing setting names itself."""

    def __init__(self, env: Mapping[str, str], invoker: Invoker) -> None:
        self._env = env
        self._invoker = invoker

    def _get(self, name: str) -> str:
        value = self._env.get(name)
        if not value:
            raise ConfigError(f"environment variable {name} is not set for this function")
        return value

    def _int(self, name: str) -> int:
        try:
            return int(self._get(name))
        except ValueError as err:
            raise ConfigError(f"{name} must be an integer, got {self._env[name]!r}") from err

    @property
    def bucket(self) -> str:
        return self._get("MOELAMBDA_BUCKET")

    def setting(self, name: str) -> str:
        """A setting every function of its kind must have (ConfigError if it is missing)."""
        return self._get(name)

    @property
    def metrics_file(self) -> str | None:
        """Where a local run collects the gates' EMF records (`functions.metrics`)."""
        return self._env.get("MOELAMBDA_METRICS_FILE") or None

    @property
    def weights_prefix(self) -> str:
        return self._env.get("MOELAMBDA_WEIGHTS_PREFIX") or "weights/"

    @property
    def layer(self) -> int:
        return self._int("MOELAMBDA_LAYER")

    @property
    def expert(self) -> int:
        return self._int("MOELAMBDA_EXPERT")

    @property
    def hosted(self) -> tuple[int, ...]:
        """The experts this expert function hosts (MOELAMBDA_HOSTS, "3,7"; default: its slot)."""
        raw = self._env.get("MOELAMBDA_HOSTS")
        if not raw:
            return (self.expert,)
        try:
            return tuple(int(x) for x in raw.split(","))
        except ValueError as err:
            raise ConfigError(f"MOELAMBDA_HOSTS must list integers, got {raw!r}") from err

    @property
    def method(self) -> str:
        method = self._get("MOELAMBDA_METHOD")
        if method not in METHODS:
            raise ConfigError(f"MOELAMBDA_METHOD must be one of {METHODS}, got {method!r}")
        return method

    @property
    def driver_local(self) -> list[list[int]]:
        """The experts a driver runs itself, per layer (MOELAMBDA_DRIVER_LOCAL)."""
        from ground.driver import decode_local

        raw = self._env.get("MOELAMBDA_DRIVER_LOCAL")
        if raw is None:
            raise ConfigError("environment variable MOELAMBDA_DRIVER_LOCAL is not set")
        try:
            return decode_local(raw)
        except ValueError as err:
            raise ConfigError(
                f"MOELAMBDA_DRIVER_LOCAL must be hexadecimal masks, got {raw!r}", _REDEPLOY
            ) from err

    @property
    def invoked_by_driver(self) -> bool:
        """An expert a driver invokes: its shards come inline or, past the payload limit,
        through S3 (MOELAMBDA_DRIVER=1)."""
        return self._env.get("MOELAMBDA_DRIVER") == "1"

    @property
    def layer_plan(self) -> LayerPlan:
        return LayerPlan.from_json(self._get("MOELAMBDA_LAYER_PLAN"))

    @property
    def threads(self) -> int:
        """torch threads: the vCPUs of the function's memory (`ground.semantics.threads_for`)."""
        return self._int("MOELAMBDA_THREADS")

    @property
    def placement(self) -> Placement:
        """Where this function builds and runs its stages (MOELAMBDA_DEVICE, MOELAMBDA_DTYPE;
        default the CPU at float32): a GPU-backed function's are set by the CDK app from the
        plan (`ground.placement`)."""
        device, dtype = (self._env.get(name) for name in PLACEMENT_ENV)
        try:
            return Placement(device or CPU.device, dtype or CPU.dtype)
        except ModelError as err:
            raise ConfigError(str(err), _REDEPLOY) from err

    @property
    def payload_limit(self) -> int:
        """The most JSON bytes a direct expert's response may have (the plan's limit)."""
        return self._int("MOELAMBDA_PAYLOAD_LIMIT")

    @property
    def poll_s(self) -> float:
        """How often a pipelined expert looks for its next minibatch."""
        return float(self._env.get("MOELAMBDA_POLL_S") or POLL_S)

    @property
    def timeout_s(self) -> float:
        """How long a pipelined expert waits for a minibatch before failing the request."""
        return float(self._env.get("MOELAMBDA_PIPELINE_TIMEOUT_S") or 60.0)

    @property
    def local_identity(self) -> str | None:
        """The access key id the local runner gives this function (None on Lambda, where
        the function's role's credentials come from the runtime)."""
        return self._env.get("MOELAMBDA_LOCAL_IDENTITY") or None

    def invoke(self, function: str, payload: dict[str, Any]) -> dict[str, Any]:
        return self._invoker(function, payload)


def current() -> Config:
    """This invocation's configuration: the local runner's if it set one, else os.environ."""
    env = _ENV.get()
    return Config(dict(os.environ if env is None else env), _INVOKER.get() or lambda_invoker)


@contextmanager
def local(env: Mapping[str, str], invoker: Invoker | None = None) -> Iterator[None]:
    """Run the enclosed handler call with `env` (and `invoker`) instead of the process's own.

    Context variables do not cross into new threads: set this inside each worker thread.
    """
    env_token = _ENV.set(dict(env))
    invoker_token = _INVOKER.set(invoker)
    try:
        yield
    finally:
        _INVOKER.reset(invoker_token)
        _ENV.reset(env_token)
