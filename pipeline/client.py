"""What a client of a traffic plan's front door does: send a request, read its result.

A plan made with `--traffic` is deployed behind an SQS queue (the stack's `RequestQueueUrl`
output) and serves from one bucket (`BucketName`). A client sends each request as one message
(`ground.frontdoor.body`) and keeps the `MessageId` SQS returns: the tail writes the request's
rows of its batch's output to `results/<MessageId>.bin` (`ground.layout.result_key`) in the
tensor codec every object of the stack uses (`pipeline.tensorio`). `fetch_result` waits for
that object and decodes it, so a client needs neither the key scheme nor the codec.

The clients are boto3's, made by the caller with its own credentials: the stack grants no one
`sqs:SendMessage`, `s3:GetObject` on `results/*` or `s3:ListBucket` on the bucket; whoever runs
clients grants them. `s3:ListBucket` is what lets a result not yet written read as missing: S3
answers a missing key with 404 only to a caller that may list the bucket, and with 403 to any
other, which `fetch_result` cannot tell from a real denial and so does not wait on.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from botocore.exceptions import ClientError

from ground import frontdoor, layout
from ground.errors import MoelambdaError, UsageError
from pipeline.tensorio import decode

__all__ = ["ResultAccessDenied", "ResultTimeout", "fetch_result", "send_request"]

_NOT_YET = ("NoSuchKey", "404", "NotFound")
_DENIED = ("403", "AccessDenied")


class ResultTimeout(MoelambdaError):
    """A request's result did not appear in time (its batch still runs, or failed)."""


class ResultAccessDenied(MoelambdaError):
    """S3 refused to read a result (403): these credentials lack a permission, which waiting
    does not grant."""


def send_request(sqs: Any, queue_url: str, request: str, input_ids: Any) -> str:
    """Send one request (`request`: the client's id, 1 to 64 characters; `input_ids`: windows of
    token ids of the deployment's length) and return the id its result will be found under.

    Raises:
        UsageError: The ids are not a non-empty 2-D array of non-negative integers.
    """
    try:
        ids = np.asarray(input_ids)
    except ValueError:  # ragged: windows of different lengths
        ids = np.zeros((0,), dtype=np.int64)
    if (
        ids.ndim != 2
        or ids.size == 0
        or not np.issubdtype(ids.dtype, np.integer)
        or (ids < 0).any()
    ):
        raise UsageError(
            "input_ids must be a non-empty 2-D array of non-negative integer token ids (windows "
            "of equal length)",
            "pass windows of equal length, e.g. tokenizer(texts, padding='max_length', ...).",
        )
    sent = sqs.send_message(
        QueueUrl=queue_url, MessageBody=frontdoor.body(request, ids.astype(np.int64).tolist())
    )
    return str(sent["MessageId"])


def fetch_result(
    s3: Any,
    bucket: str,
    message_id: str,
    *,
    timeout_s: float = 300.0,
    poll_s: float = 0.25,
    max_poll_s: float = 5.0,
) -> np.ndarray:
    """The result of the request sent as `message_id`: its rows of the batch's output.

    Polls `results/<message_id>.bin` with doubling intervals from `poll_s` up to `max_poll_s`
    (each poll is an S3 GET the caller pays) until it exists or `timeout_s` has passed.

    Raises:
        ResultTimeout: The result did not appear within `timeout_s`.
        ResultAccessDenied: S3 answered 403, at the first poll that did: the credentials may
            not read the result, or (S3's answer to a missing key for a caller that may not
            list the bucket) may not tell a result not yet written from one they may not read.
    """
    key = layout.result_key(message_id)
    deadline = time.monotonic() + timeout_s
    wait = poll_s
    while True:
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in _DENIED:
                raise ResultAccessDenied(
                    f"S3 refused to read s3://{bucket}/{key} ({code}): these credentials may "
                    "not read it, or may not list the bucket, to which S3 answers 403 for a "
                    "result not yet written too.",
                    f"grant them s3:GetObject on arn:aws:s3:::{bucket}/results/* and "
                    f"s3:ListBucket on arn:aws:s3:::{bucket} (with it, a result not yet "
                    "written reads as 404, which fetch_result waits on).",
                ) from err
            if code not in _NOT_YET:
                raise
        else:
            return decode(body)[0]
        if time.monotonic() + wait > deadline:
            raise ResultTimeout(
                f"no result at s3://{bucket}/{key} after {timeout_s:g} s.",
                "its batch may still run (wait longer) or have failed (the state machine's "
                "executions and their log group say which).",
            )
        time.sleep(wait)
        wait = min(wait * 2, max_poll_s)
