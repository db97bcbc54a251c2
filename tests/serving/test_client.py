"""A front-door client's two calls on moto: the message it sends is the batcher's kind, and its
result is found under the id SQS returned, or a timeout names the key and the likely causes,
and a refused read fails at once, naming the permissions to grant."""

from __future__ import annotations

import json

import numpy as np
import pytest
from botocore.exceptions import ClientError

from functions import batcher
from ground.errors import UsageError
from pipeline.client import ResultAccessDenied, ResultTimeout, fetch_result, send_request
from pipeline.tensorio import encode
from tests.serving.conftest import BUCKET


@pytest.fixture()
def queue(s3: object) -> tuple[object, str]:
    """A queue on the session's moto (the `s3` fixture holds it open)."""
    import boto3

    sqs = boto3.client("sqs", region_name="us-east-1")
    return sqs, sqs.create_queue(QueueName="client-test")["QueueUrl"]


def test_a_request_is_one_message_the_batcher_takes(queue: tuple) -> None:
    sqs, url = queue
    ids = np.array([[101, 2023, 102], [101, 7, 102]])
    message_id = send_request(sqs, url, "r-1", ids)
    (got,) = sqs.receive_message(QueueUrl=url)["Messages"]
    assert got["MessageId"] == message_id
    parsed = batcher.parse({"body": got["Body"], "messageId": got["MessageId"]})
    assert parsed == {"request": "r-1", "input_ids": ids.tolist(), "tokens": 6}
    assert json.loads(got["Body"])["request"] == "r-1"


@pytest.mark.parametrize("ids", [[], [[1, 2], [3]], [[-1]], [[0.5]], [1, 2]])
def test_ids_that_are_not_windows_are_refused_before_sending(queue: tuple, ids: list) -> None:
    sqs, url = queue
    with pytest.raises(UsageError, match="input_ids"):
        send_request(sqs, url, "r", ids)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)


def test_a_result_is_read_under_its_message_id_and_a_missing_one_times_out(s3: object) -> None:
    rows = np.arange(12, dtype=np.float32).reshape(2, 6)
    s3.put_object(Bucket=BUCKET, Key="results/m-1.bin", Body=encode(rows))
    np.testing.assert_array_equal(fetch_result(s3, BUCKET, "m-1", timeout_s=1.0), rows)
    with pytest.raises(ResultTimeout, match="results/m-2.bin"):
        fetch_result(s3, BUCKET, "m-2", timeout_s=0.3, poll_s=0.05)
    with pytest.raises(UsageError):  # an id that would leave results/
        fetch_result(s3, BUCKET, "../weights/manifest", timeout_s=0.1)
    s3.delete_object(Bucket=BUCKET, Key="results/m-1.bin")


class _Denying:
    """An S3 client whose every GET is refused with `code`, as S3 refuses a caller without
    s3:GetObject (or, for a missing key, without s3:ListBucket); it counts the GETs."""

    def __init__(self, code: str) -> None:
        self.code, self.gets = code, 0

    def get_object(self, **_: object) -> dict:
        self.gets += 1
        error = {"Code": self.code, "Message": "Access Denied"}
        raise ClientError(
            {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject"
        )


@pytest.mark.parametrize("code", ["AccessDenied", "403"])
def test_a_refused_read_fails_at_once_naming_the_permissions(code: str) -> None:
    """Waiting does not grant a permission: one GET, then the error, not polls until the
    timeout (300 s by default)."""
    s3 = _Denying(code)
    with pytest.raises(ResultAccessDenied) as raised:
        fetch_result(s3, BUCKET, "m-3", timeout_s=2.0, poll_s=0.01)
    assert s3.gets == 1
    assert "s3://moelambda-test/results/m-3.bin" in raised.value.problem
    assert raised.value.fix is not None
    assert "s3:GetObject on arn:aws:s3:::moelambda-test/results/*" in raised.value.fix
    assert "s3:ListBucket on arn:aws:s3:::moelambda-test" in raised.value.fix
