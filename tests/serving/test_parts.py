"""Transport and weight-cache behaviour that the end-to-end runs do not reach."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from functions import weights
from functions.common import ExpertFailed, gather_previous, s3_client
from ground import layout
from moe import Manifest
from pipeline import transports
from pipeline.local import InProcessLambdas, placeholder_zip
from tests.serving.conftest import BUCKET
from tests.serving.driver import Deployment, clean


def test_pipelined_expert_times_out_when_no_gate_writes(s3: object) -> None:
    with pytest.raises(transports.TransportError, match="no minibatch at .* after 0.2 s"):
        transports.serve_pipelined(
            s3, BUCKET, "lonely", 0, 1, 0, lambda x: x, poll_s=0.02, timeout_s=0.2
        )


def test_gather_refuses_outputs_that_do_not_match_the_routing(s3: object) -> None:
    experts = np.array([[0, 1], [1, 0], [0, 1]], np.int64)
    routing = (experts, np.ones((3, 2), np.float32))
    transports.write_tensors(s3, BUCKET, layout.routing_key("short", 0), *routing)
    for expert in (0, 1):  # expert 1 got 3 tokens but returns only 2 rows
        rows = np.ones((3 if expert == 0 else 2, 4), np.float32)
        transports.write_tensors(s3, BUCKET, layout.out_key("short", 0, expert, 0), rows)
    with pytest.raises(transports.TransportError, match="expert 1: its outputs hold 2 rows"):
        transports.gather(s3, BUCKET, "short", 0, "s3", 2, 4)
    with pytest.raises(transports.TransportError, match="unexpected output"):
        transports.gather(s3, BUCKET, "short", 0, "pipelined", 2, 4)
    transports.delete_request(s3, BUCKET, "short")


def test_cleanup_deletes_more_than_one_batch_of_keys(s3: object) -> None:
    for i in range(1005):
        s3.put_object(Bucket=BUCKET, Key=f"requests/many/{i:04d}.bin", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key="requests/many-other/keep.bin", Body=b"x")
    assert clean(Deployment(BUCKET, [], 1, []), "many")["deleted"] == 1005
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="requests/many")
    assert [obj["Key"] for obj in listed["Contents"]] == ["requests/many-other/keep.bin"]
    s3.delete_object(Bucket=BUCKET, Key="requests/many-other/keep.bin")


def test_warm_stage_is_reused_until_its_object_changes(
    exported: tuple[Path, Manifest], s3: object, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    root, _ = exported
    client = s3_client()
    first = weights.expert(client, BUCKET, "weights/", 5, 3)
    assert weights.expert(client, BUCKET, "weights/", 5, 3) is first
    key = "layers/05/experts/03.safetensors"
    save_file(load_file(root / key), tmp_path / "new", metadata={"revision": "2"})  # new ETag
    s3.upload_file(str(tmp_path / "new"), BUCKET, "weights/" + key)
    try:
        assert weights.expert(client, BUCKET, "weights/", 5, 3) is not first
    finally:
        s3.upload_file(str(root / key), BUCKET, "weights/" + key)


def _waits_for_another_threads_put(event: dict, context: object) -> dict:
    """A handler like the direct gate: it blocks on S3 requests made from its worker threads."""
    worker = threading.Thread(
        target=s3_client().put_object, kwargs={"Bucket": BUCKET, "Key": event["key"], "Body": b"x"}
    )
    worker.start()
    worker.join(timeout=10)
    return {"finished": not worker.is_alive()}


def test_an_invoked_handler_never_holds_the_s3_lock(s3: object) -> None:
    """Regression: nesting the S3 lock around moto put Lambda invokes under it, a deadlock."""
    import boto3

    trust = {"Version": "2012-10-17", "Statement": []}
    role = boto3.client("iam").create_role(
        RoleName="parts", AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]["Arn"]
    client = boto3.client("lambda")
    name = "waits-for-s3"
    handler = f"{__name__}._waits_for_another_threads_put"
    client.create_function(
        FunctionName=name,
        Runtime="python3.11",
        Role=role,
        Handler=handler,
        Code={"ZipFile": placeholder_zip()},
    )
    lambdas = InProcessLambdas()
    lambdas.register(name, handler, {"MOELAMBDA_BUCKET": BUCKET})
    with lambdas.installed():  # nested inside the session's atomic_s3
        answer = client.invoke(FunctionName=name, Payload=json.dumps({"key": "lock-test"}))
    assert json.loads(answer["Payload"].read()) == {"finished": True}
    s3.delete_object(Bucket=BUCKET, Key="lock-test")  # type: ignore[attr-defined]


def test_pipelined_experts_stop_at_once_when_their_gate_failed(s3: object) -> None:
    transports.abort_pipelined(s3, BUCKET, "aborted", 0, [1, 2])
    started = time.monotonic()
    with pytest.raises(transports.TransportError, match="layer 0 function .* failed"):
        transports.serve_pipelined(
            s3, BUCKET, "aborted", 0, 1, 1, lambda x: x, poll_s=0.02, timeout_s=30
        )
    assert time.monotonic() - started < 5
    assert clean(Deployment(BUCKET, [], 1, []), "aborted")["deleted"] == 3


def test_the_next_function_raises_the_first_failed_expert_with_its_cause() -> None:
    cause = json.dumps({"errorType": "ModelError", "errorMessage": "weights missing"})
    failures = [{"ok": True}, {"error": {"Error": "ModelError", "Cause": cause}}, {"ok": True}]
    with pytest.raises(ExpertFailed, match="1 expert invocation.* layer 3 .*ModelError: weights"):
        gather_previous(None, "r", {"layer": 3, "method": "s3"}, 3, failures)  # type: ignore[arg-type]
