"""Per-invocation configuration of a handler: its environment, and how it invokes other functions.

In Lambda each function has its own environment. The local runner executes many differently
configured handlers concurrently in one process, so it cannot use os.environ: it sets a
contextvar for the call instead (`local`), and `current()` prefers that over os.environ. The
configuration is read at call time and never cached, so no handler sees another's settings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ground.errors import MoelambdaError
from ground.method import METHODS

__all__ = ["Config", "ConfigError", "Invoker", "LayerPlan", "current", "lambda_invoker", "local"]

Invoker = Callable[[str, dict[str, Any]], dict[str, Any]]

_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("moelambda_env", default=None)
_INVOKER: ContextVar[Invoker | None] = ContextVar("moelambda_invoker", default=None)


class ConfigError(MoelambdaError):
    """A function's environment lacks a setting or holds an invalid one: a deployment bug."""


def lambda_invoker(function: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Invoke a Lambda function synchronously and return its decoded result, raising its error."""
    import boto3

    response = boto3.client("lambda").invoke(
        FunctionName=function, InvocationType="RequestResponse", Payload=json.dumps(payload)
    )
    body = json.loads(response["Payload"].read() or b"null")
    if response.get("FunctionError"):
        raise RuntimeError(f"expert function {function} failed: {body}")
    return body


@dataclass(frozen=True)
class LayerPlan:
    """MOELAMBDA_LAYER_PLAN: how this layer scatters to its experts."""

    method: str
    beta: int
    replicas: tuple[int, ...]
    expert_functions: tuple[str, ...]

    @classmethod
    def from_json(cls, text: str) -> LayerPlan:
        try:
            raw = json.loads(text)
            plan = cls(
                raw["method"],
                int(raw["beta"]),
                tuple(int(r) for r in raw["replicas"]),
                tuple(str(f) for f in raw["expert_functions"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"MOELAMBDA_LAYER_PLAN is not a valid layer plan: {err}") from err
        if plan.method not in METHODS or plan.beta < 1 or min(plan.replicas, default=0) < 1:
            raise ConfigError(f"MOELAMBDA_LAYER_PLAN is out of range: {raw}")
        if len(plan.replicas) != len(plan.expert_functions):
            raise ConfigError("MOELAMBDA_LAYER_PLAN needs one replica count per expert function")
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
    def method(self) -> str:
        method = self._get("MOELAMBDA_METHOD")
        if method not in METHODS:
            raise ConfigError(f"MOELAMBDA_METHOD must be one of {METHODS}, got {method!r}")
        return method

    @property
    def layer_plan(self) -> LayerPlan:
        return LayerPlan.from_json(self._get("MOELAMBDA_LAYER_PLAN"))

    @property
    def poll_s(self) -> float:
        """How often a pipelined expert looks for its next minibatch."""
        return float(self._env.get("MOELAMBDA_POLL_S") or 0.02)

    @property
    def timeout_s(self) -> float:
        """How long a pipelined expert waits for a minibatch before failing the request."""
        return float(self._env.get("MOELAMBDA_PIPELINE_TIMEOUT_S") or 60.0)

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
