"""A moto S3 bucket holding the MiniLM export, shared by every serving test of the session, and
the mixed plan (every method twice) whose synthesised template several tests run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from cdk.app import build_app
from moe import Manifest, MoEModel, export_model
from moelambda.cli import app
from pipeline.local import atomic_s3
from predictor import PredictedCounts

BUCKET = "moelambda-test"
_FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def _atomic_moto() -> Iterator[None]:
    """The handlers run concurrently in threads here, on one moto: S3 requests must be atomic."""
    with atomic_s3():
        yield


@pytest.fixture(scope="session")
def s3(_atomic_moto: None) -> Iterator[object]:
    """A mocked S3 for the whole session: the handlers' process-wide client is created in it."""
    saved = {name: os.environ.get(name) for name in _FAKE_AWS}
    os.environ.update(_FAKE_AWS)
    with mock_aws():
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def exported(
    minilm: MoEModel, s3: object, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Manifest]:
    """MiniLM exported once and uploaded under weights/, as a deployment would have it."""
    root = tmp_path_factory.mktemp("export") / "w"
    manifest = export_model(minilm, root)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        s3.upload_file(str(path), BUCKET, "weights/" + path.relative_to(root).as_posix())
    return root, manifest


METHODS = ["s3", "pipelined", "direct"] * 2  # the mixed plan's layers


@pytest.fixture(scope="module")
def mixed_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MiniLM plan whose six layers use each method twice, expert 0 with two replicas."""
    tmp = tmp_path_factory.mktemp("plan")
    shares = np.random.default_rng(0).dirichlet(np.ones(4), size=6)
    counts = tmp / "counts.json"
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=256,
        method="test",
        counts=(shares * 512).round(2).tolist(),
    ).save(counts)
    plan = tmp / "plan.json"
    made = CliRunner().invoke(
        app,
        ["plan", "--counts", str(counts), "--tokens", "256", "--pack", "1", "--out", str(plan)]
        + ["--deployment", "workflow"],
    )
    assert made.exit_code == 0, made.output
    doc = json.loads(plan.read_text())
    for layer, method in zip(doc["layers"], METHODS, strict=True):
        layer["method"], layer["beta"] = method, 4 if method == "pipelined" else 1
        layer["experts"][0]["replicas"] = 2
    plan.write_text(json.dumps(doc))
    return plan


@pytest.fixture(scope="module")
def template(mixed_plan: Path) -> dict[str, Any]:
    return build_app(mixed_plan, mixed_plan.parent / "cdk.out").stacks[0].template


@pytest.fixture(scope="module")
def weights(minilm: MoEModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights") / "w"
    export_model(minilm, root)
    return root


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries without their waits: botocore's backoff on SlowDown (1 s base for a throttling
    error, doubling) and the state machine's Retry intervals, which moto sleeps for real. The
    retries themselves, and so what is checked, are unchanged; the test takes seconds, not a
    minute."""
    from types import SimpleNamespace

    from botocore.retries.standard import ExponentialBackoff
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    monkeypatch.setattr(retrier_decl, "time", SimpleNamespace(sleep=lambda seconds: None))
