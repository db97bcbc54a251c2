"""A moto S3 bucket holding the MiniLM export, shared by every serving test of the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto import mock_aws

from moe import Manifest, MoEModel, export_model
from pipeline.local import atomic_s3

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
