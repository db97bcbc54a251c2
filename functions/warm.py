"""Keeping environments warm: what a warmer's ping and a provisioned environment's INIT do.

A plan made with `moelambda plan --traffic` may keep a function warm with a scheduled warmer
(the CDK app's EventBridge Scheduler schedules invoke it with `{"warmer": true}`) or with
provisioned concurrency. The traffic simulator counts a warmed or provisioned environment as
fully warm: its weights already loaded (`ground.coldstart`). The handlers load their weights on
their first call (`functions.weights`), so to be what the simulator bills:
- a ping loads the function's own weights (at once if they are cached) and returns
  `{"warm": true}` without reading or writing any request key;
- an environment that Lambda initialises for provisioned concurrency
  (`AWS_LAMBDA_INITIALIZATION_TYPE=provisioned-concurrency`) loads them in its INIT.
"""

from __future__ import annotations

import os
from typing import Any

from functions import config, weights
from functions.common import s3_client

__all__ = ["PING", "answer", "is_ping", "load_own_weights", "preload_if_provisioned"]

PING = {"warmer": True}


def is_ping(event: Any) -> bool:
    """Whether `event` is a warmer's ping (exactly `{"warmer": true}`)."""
    return isinstance(event, dict) and event.get("warmer") is True and len(event) == 1


def load_own_weights(role: str) -> None:
    """Load (or find cached) the weights a `role` function serves with."""
    cfg = config.current()
    s3, bucket, prefix = s3_client(), cfg.bucket, cfg.weights_prefix
    if role == "head":
        weights.head(s3, bucket, prefix)
    elif role == "layer":
        weights.layer(s3, bucket, prefix, cfg.layer)
    elif role == "expert":
        for number in cfg.hosted:
            weights.expert(s3, bucket, prefix, cfg.layer, number)
    elif role == "tail":
        weights.tail(s3, bucket, prefix)
    elif role in ("driver", "worker"):  # the whole non-MoE stack and the local experts
        layers = weights.loader(s3, bucket, prefix).manifest.num_layers
        weights.head(s3, bucket, prefix)
        for layer, experts in zip(range(layers), cfg.driver_local, strict=True):
            weights.layer(s3, bucket, prefix, layer)
            for number in experts:
                weights.expert(s3, bucket, prefix, layer, number)
        weights.tail(s3, bucket, prefix)
    else:
        raise ValueError(f"unknown role {role!r}")


def answer(role: str) -> dict[str, Any]:
    """A ping's answer, after making sure the weights are resident."""
    load_own_weights(role)
    return {"warm": True}


def preload_if_provisioned(role: str) -> None:
    """At import (INIT): load the weights when Lambda initialises for provisioned concurrency."""
    if os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "provisioned-concurrency":
        load_own_weights(role)
