"""What several handlers share: the process-wide S3 client and gathering the previous layer."""

from __future__ import annotations

import threading
from typing import Any

import torch

from functions import weights
from functions.config import Config, ConfigError
from pipeline import transports

__all__ = ["gather_previous", "s3_client"]

_LOCK = threading.Lock()
_CLIENT: list[Any] = []


def s3_client() -> Any:
    """One S3 client per process: creating one costs ~50 ms, and clients are thread-safe
    (boto3's default session, which creates them, is not, hence the lock)."""
    with _LOCK:
        if not _CLIENT:
            import boto3

            _CLIENT.append(boto3.client("s3"))
        return _CLIENT[0]


def gather_previous(
    cfg: Config, request_id: str, previous: dict[str, Any] | None, layer: int
) -> torch.Tensor:
    """The expert sum of layer `layer`, which the event's `previous` must name."""
    if not previous or previous.get("layer") != layer:
        raise ConfigError(
            f"this function gathers layer {layer}, but the event's previous is {previous!r}"
        )
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
