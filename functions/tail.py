"""Tail function: gathers the last layer, runs the task head, writes the output, cleans up."""

from __future__ import annotations

from typing import Any

import torch

from functions import config, weights
from functions.common import gather_previous, s3_client, use_lambda_threads
from ground import layout
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "hidden_key", "previous", "expert_failures"?} -> {..., "output_key"}.

    The intermediates are deleted only after the output is written, so a failure before that
    leaves them for the cleanup function and never loses the result.
    """
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    last = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest.num_layers - 1
    expert_sum = gather_previous(
        cfg, request_id, event.get("previous"), last, event.get("expert_failures")
    )
    residual = torch.from_numpy(transports.read_tensors(s3, cfg.bucket, event["hidden_key"])[0])
    output = weights.tail(s3, cfg.bucket, cfg.weights_prefix).run(residual, expert_sum)
    key = layout.output_key(request_id)
    transports.write_tensors(s3, cfg.bucket, key, output.numpy().astype("float32"))
    transports.delete_request(s3, cfg.bucket, request_id)
    return {"request_id": request_id, "output_key": key}
