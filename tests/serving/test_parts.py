"""Transport and weight-cache behaviour that the end-to-end runs do not reach."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from botocore.exceptions import ClientError

from functions import common, config, weights
from functions.common import ExpertFailed, gather_previous, s3_client
from functions.layer import CapacityError, replicas_for
from functions.local import LocalHandlers
from ground import layout
from moe import Manifest
from pipeline import transports
from pipeline.local import InProcessLambdas, placeholder_zip
from pipeline.tensorio import encode
from tests.serving.conftest import BUCKET
from tests.serving.driver import Deployment, clean, s3_requests


def test_pipelined_expert_times_out_when_no_gate_writes(s3: object) -> None:
    with pytest.raises(transports.TransportError, match="no minibatch at .* after 0.2 s"):
        transports.serve_pipelined(
            s3, BUCKET, "lonely", 0, 1, 0, lambda x, hosted_rows: x, poll_s=0.02, timeout_s=0.2
        )


def test_gather_refuses_outputs_that_do_not_match_the_routing(s3: object) -> None:
    experts = np.array([[0, 1], [1, 0], [0, 1]], np.int64)
    routing = (experts, np.ones((3, 2), np.float32), np.arange(2))
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


def test_a_warm_stage_makes_no_s3_request_and_keeps_its_weights(
    exported: tuple[Path, Manifest], s3: object, tmp_path: Path
) -> None:
    """Cached by (bucket, key): a new export goes under a new prefix (see functions.weights)."""
    from safetensors.torch import load_file, save_file

    root, _ = exported
    client = s3_client()
    first = weights.expert(client, BUCKET, "weights/", 5, 3)
    key = "layers/05/experts/03.safetensors"
    local = weights.loader(client, BUCKET, "weights/").root
    assert (local / "manifest.json").is_file()
    assert not (local / key).exists()  # the built stage holds its tensors: its file is gone
    save_file(load_file(root / key), tmp_path / "new", metadata={"revision": "2"})  # new ETag
    s3.upload_file(str(tmp_path / "new"), BUCKET, "weights/" + key)
    try:
        with s3_requests(client) as requests:
            assert weights.expert(client, BUCKET, "weights/", 5, 3) is first
            assert weights.loader(client, BUCKET, "weights/").manifest.experts == 4
        assert requests == {}
    finally:
        s3.upload_file(str(root / key), BUCKET, "weights/" + key)


def test_a_process_removes_its_downloaded_weights_when_it_ends(
    exported: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """The local runner and the tests serve from one process: nothing may stay behind in /tmp."""
    import subprocess
    import sys

    root, _ = exported
    code = (
        "import boto3, moto, pathlib, sys\n"
        "from functions import weights\n"
        "with moto.mock_aws():\n"
        "    s3 = boto3.client('s3', region_name='us-east-1')\n"
        "    s3.create_bucket(Bucket='weights-b')\n"
        "    root = pathlib.Path(sys.argv[1])\n"
        "    for p in sorted(f for f in root.rglob('*') if f.is_file()):\n"
        "        s3.upload_file(str(p), 'weights-b', 'w/' + p.relative_to(root).as_posix())\n"
        "    weights.head(s3, 'weights-b', 'w/')\n"
        "    print(weights.loader(s3, 'weights-b', 'w/').root)\n"
    )
    env = dict(os.environ) | {"TMPDIR": str(tmp_path)}
    command = [sys.executable, "-c", code, str(root)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    used = Path(done.stdout.strip().splitlines()[-1])
    assert used.is_relative_to(tmp_path)
    assert list(tmp_path.iterdir()) == []


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
    lambdas = InProcessLambdas(LocalHandlers())
    lambdas.register(name, handler, {"MOELAMBDA_BUCKET": BUCKET}, memory_mb=128)
    with lambdas.installed():  # nested inside the session's atomic_s3
        answer = client.invoke(FunctionName=name, Payload=json.dumps({"key": "lock-test"}))
    assert json.loads(answer["Payload"].read()) == {"finished": True}
    s3.delete_object(Bucket=BUCKET, Key="lock-test")  # type: ignore[attr-defined]


def test_pipelined_experts_stop_at_once_when_their_gate_failed(s3: object) -> None:
    transports.abort_pipelined(s3, BUCKET, "aborted", 0, [1, 2])
    started = time.monotonic()
    with pytest.raises(transports.TransportError, match="layer 0 function .* failed"):
        transports.serve_pipelined(
            s3, BUCKET, "aborted", 0, 1, 1, lambda x, hosted_rows: x, poll_s=0.02, timeout_s=600
        )
    assert time.monotonic() - started < 300  # at its first poll, not at its 600 s timeout
    assert clean(Deployment(BUCKET, [], 1, []), "aborted")["deleted"] == 3


def test_the_next_function_raises_the_first_failed_expert_with_its_cause() -> None:
    cause = json.dumps({"errorType": "ModelError", "errorMessage": "weights missing"})
    failed = {"error": {"Error": "ModelError", "Cause": cause}}
    failures = [[{"ok": True}], [{"ok": True}, failed], [{"ok": True}, failed]]  # per expert
    with pytest.raises(ExpertFailed, match="2 expert invocation.* layer 3 .*ModelError: weights"):
        gather_previous(None, "r", {"layer": 3, "method": "s3"}, 3, failures)  # type: ignore[arg-type]


def _no_such_key(key: str) -> ClientError:
    return ClientError({"Error": {"Code": "NoSuchKey", "Message": key}}, "GetObject")


class _RacingS3:
    """An S3 stand-in on which each minibatch lands between a replica's miss and its read of
    done.bin: the path where the replica re-checks the minibatch after done.bin."""

    def __init__(self, objects: dict[str, bytes], late: set[str]) -> None:
        self.objects, self.late = objects, late
        self.gets: list[tuple[str, bool]] = []
        self.puts: list[str] = []

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        found = Key in self.objects and Key not in self.late
        self.late.discard(Key)
        self.gets.append((Key, found))
        if not found:
            raise _no_such_key(Key)
        return {"Body": io.BytesIO(self.objects[Key])}

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:  # noqa: N803
        self.puts.append(Key)


def test_a_pipelined_replica_reads_each_minibatch_once_and_everything_else_is_a_poll() -> None:
    """What the meter relies on: one successful GET per minibatch; other GETs are polls."""
    minibatches = [layout.minibatch_key("race", 0, 1, 0, m) for m in range(3)]
    done = layout.done_key("race", 0, 1, 0)
    objects = {
        key: encode(np.full((2, 4), m, np.float32), np.array([2]))
        for m, key in enumerate(minibatches)
    }
    objects[done] = encode(np.array([3, 6], np.int64))
    fake = _RacingS3(objects, late=set(minibatches))
    served = transports.serve_pipelined(
        fake, BUCKET, "race", 0, 1, 0, lambda x, hosted_rows: x, poll_s=0.001, timeout_s=5
    )
    assert served == (3, 6) and len(fake.puts) == 3
    data = Counter(key for key, found in fake.gets if found and key != done)
    assert data == dict.fromkeys(minibatches, 1)
    polls = [(key, found) for key, found in fake.gets if not found or key == done]
    assert len(polls) == len(fake.gets) - 3
    assert polls[-2:] == [(layout.minibatch_key("race", 0, 1, 0, 3), False), (done, True)]


def test_torch_threads_follow_the_function_only_on_lambda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local runner shares one process between handlers: it must keep its thread count."""
    before = torch.get_num_threads()
    wanted = config.Config({"MOELAMBDA_THREADS": str(before + 1)}, config.lambda_invoker)
    monkeypatch.setattr(common, "_THREADS_SET", [])
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    common.use_lambda_threads(wanted)
    assert torch.get_num_threads() == before
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "moelambda-expert")
    try:
        common.use_lambda_threads(wanted)
        assert torch.get_num_threads() == before + 1
        common.use_lambda_threads(config.Config({"MOELAMBDA_THREADS": "1"}, config.lambda_invoker))
        assert torch.get_num_threads() == before + 1  # once per container
    finally:
        torch.set_num_threads(before)


def _layer_plan(method: str, **lists: list[int]) -> config.LayerPlan:
    plan = {"replicas": [1, 2, 1], "max_replicas": [4, 2, 1], "max_tokens": [10, 10, 10]}
    hosted = ((0,), (1,), (2,))
    return config.LayerPlan(
        method,
        4,
        *(tuple(lists.get(k, v)) for k, v in plan.items()),
        6291456,
        ("a", "b", "c"),
        hosted,
    )


def test_the_gate_adapts_replicas_to_real_counts_within_each_cap() -> None:
    routed = torch.tensor([[0, 1]] * 20 + [[0, 2]] * 5 + [[2, 0]] * 5)  # 30, 20 and 10 tokens
    assert replicas_for(_layer_plan("s3"), 2, routed) == [3, 2, 1]
    assert replicas_for(_layer_plan("direct"), 2, routed) == [3, 2, 1]
    assert replicas_for(_layer_plan("pipelined"), 2, routed) == [1, 2, 1]  # started already
    few = torch.tensor([[0, 2]] * 3)
    assert replicas_for(_layer_plan("s3"), 2, few) == [1, 2, 1]  # the plan's, never fewer
    busy = torch.tensor([[1, 2]] * 21)  # expert 1: 21 tokens > 2 x 10; expert 2: 21 > 1 x 10
    with pytest.raises(CapacityError) as caught:
        replicas_for(_layer_plan("s3"), 2, busy)
    assert "layer 2 cannot take this batch (s3): expert 1: 21 tokens, at most 10 per " in str(
        caught.value
    )
    assert "expert 2: 21 tokens, at most 10 per replica on 1 replicas" in caught.value.problem
    assert "more memory" in caught.value.fix and "higher G" in caught.value.fix
