"""Tail function: gathers the last layer, runs the task head, writes the output, cleans up.

Behind the front door its payload also carries the execution's input, whose `requests` list
each client request's SQS message id and rows: it writes each request's rows to
`results/<message id>.bin` (`ground.frontdoor`), all of them before the batch's output, so a
second delivery that finds the output finds every result too.
"""

from __future__ import annotations

from typing import Any

import torch

# Building this stage needs Hugging Face's model classes: their common base (the bulk of the
# import) loads in INIT, where the cold-start model (`ground.coldstart`) counts each role's
# imports, not in the first call's weight load. The expert handler needs none of it.
import transformers.modeling_utils  # noqa: F401
from botocore.exceptions import ClientError

from functions import config, warm, weights
from functions.common import gather_previous, s3_client, use_lambda_threads, write_results
from ground import layout
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "hidden_key", "previous", "expert_failures"?, "input"?} ->
    {..., "output_key"}.

    The intermediates are deleted only after the output is written, so a failure before that
    leaves them for the cleanup function and never loses the result; a second delivery after
    the delete returns the output it finds (at-least-once delivery changes nothing).
    """
    if warm.is_ping(event):
        return warm.answer("tail")
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    key = layout.output_key(request_id)
    last = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest.num_layers - 1
    try:
        expert_sum = gather_previous(
            cfg, request_id, event.get("previous"), last, event.get("expert_failures")
        )
        hidden = transports.read_tensors(s3, cfg.bucket, event["hidden_key"])[0]
    except transports.TransportError:
        # A second delivery after the first deleted the intermediates: its output stands.
        if _exists(s3, cfg.bucket, key):
            return {"request_id": request_id, "output_key": key}
        raise
    output = weights.tail(s3, cfg.bucket, cfg.weights_prefix).run(
        torch.from_numpy(hidden), expert_sum
    )
    result = output.numpy().astype("float32")
    write_results(s3, cfg.bucket, result, (event.get("input") or {}).get("requests"))
    transports.write_tensors(s3, cfg.bucket, key, result)
    transports.delete_request(s3, cfg.bucket, request_id)
    return {"request_id": request_id, "output_key": key}


def _exists(s3: Any, bucket: str, key: str) -> bool:
    """Whether `key` exists (only asked on the failure path: the plan bills no such request)."""
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as err:
        if transports.is_missing(s3, bucket, key, err):
            return False
        raise
    return True


warm.preload_if_provisioned("tail")
