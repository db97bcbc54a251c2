"""The synthesised policies under enforcement: the local run checks every S3 request and direct
Invoke of a function against that function's own policy (`pipeline.iam`), so a policy one key
too narrow fails a request here, and a handler reaching beyond its layer or expert is refused."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from functions.local import run_workflow
from moe import MoEModel
from pipeline import transports
from pipeline.iam import Policies, Statement
from tests.serving.conftest import METHODS

BUCKET = "arn:aws:s3:::b"


def test_the_evaluator_follows_iam_wildcards_and_prefix_conditions() -> None:
    read = Statement.parse(
        {
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": f"{BUCKET}/requests/*/03/in/01/*",
        }
    )
    assert read.allows("s3:GetObject", f"{BUCKET}/requests/abc/03/in/01/00.bin", None)
    assert read.allows("S3:getobject", f"{BUCKET}/requests/abc/03/in/01/00/0001.bin", None)
    assert not read.allows("s3:GetObject", f"{BUCKET}/requests/abc/03/in/02/00.bin", None)
    assert not read.allows("s3:PutObject", f"{BUCKET}/requests/abc/03/in/01/00.bin", None)
    listing = Statement.parse(
        {
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": BUCKET,
            "Condition": {"StringLike": {"s3:prefix": ["requests/*/03/out/*"]}},
        }
    )
    assert listing.allows("s3:ListBucket", BUCKET, "requests/abc/03/out/")
    assert not listing.allows("s3:ListBucket", BUCKET, "requests/abc/04/out/")
    assert not listing.allows("s3:ListBucket", BUCKET, None)  # no prefix: the condition fails
    assert not listing.allows("s3:ListBucket", f"{BUCKET}/x", "requests/abc/03/out/")
    for unsupported in (
        {"Effect": "Deny", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"},
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": BUCKET,
            "Condition": {"StringEquals": {"s3:prefix": "x"}},
        },
    ):
        with pytest.raises(ValueError, match="supported"):
            Statement.parse(unsupported)
    policies = Policies({"fn": [read]})
    assert policies.knows("fn") and not policies.knows("testing") and not policies.knows(None)
    assert not policies.allows("fn", "s3:GetObject", f"{BUCKET}/outputs/x.bin")
    assert policies.denied == [("fn", "s3:GetObject", f"{BUCKET}/outputs/x.bin")]


class _DeniedS3:
    """A client whose GETs S3 refuses with 403, holding `keys` (what a listing shows)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.listed: list[str] = []

    def get_object(self, **kwargs: Any) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, "GetObject")

    def list_objects_v2(self, *, Bucket: str, Prefix: str, MaxKeys: int) -> dict[str, Any]:
        self.listed.append(Prefix)
        found = sorted(k for k in self.keys if k.startswith(Prefix))[:MaxKeys]
        return {"Contents": [{"Key": k} for k in found]}


def test_a_403_on_a_missing_key_reads_as_missing_and_on_a_present_one_is_raised() -> None:
    """S3 may answer a missing key with 403 (no listing that counts): the poll must go on."""
    s3 = _DeniedS3(["requests/r/00/in/01/00/0000.bin0"])  # a longer key, not the one asked
    assert transports.get_object(s3, "b", "requests/r/00/in/01/00/0000.bin") is None
    assert s3.listed == ["requests/r/00/in/01/00/0000.bin"]
    s3 = _DeniedS3(["requests/r/00/in/01/00/0000.bin"])
    with pytest.raises(ClientError, match="AccessDenied"):
        transports.get_object(s3, "b", "requests/r/00/in/01/00/0000.bin")


def _role_policy(template: dict[str, Any], function: str) -> list[dict[str, Any]]:
    resources = template["Resources"]
    own = re.compile(rf"[A-Za-z]*{function}[0-9A-F]{{8}}")  # CDK: construct path + hash
    (logical,) = [
        k
        for k, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function" and own.fullmatch(k)
    ]
    role = resources[logical]["Properties"]["Role"]["Fn::GetAtt"][0]
    return resources[role]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]


def _refused(minilm: MoEModel, weights: Path, narrowed: dict[str, Any], error: str) -> set:
    """Run one request on `narrowed`: it must fail with `error`, leaving nothing behind; the
    (function, action) pairs the policies refused."""
    text = "every function may touch only its own keys"
    ids = minilm.tokenizer([text], return_tensors="pt")["input_ids"].numpy()
    result = run_workflow(narrowed, weights, [ids])
    (run,) = result["requests"]
    assert run["status"] == "FAILED" and error in run["cause"], run["cause"]
    assert run["intermediates_left"] == 0  # the cleanup's own policy still lets it delete
    return {(who, action) for who, action, _ in result["denied"]}


def test_an_expert_denied_its_own_shards_fails_the_request_with_access_denied(
    minilm: MoEModel, weights: Path, template: dict[str, Any]
) -> None:
    assert METHODS[0] == "s3"
    narrowed = copy.deepcopy(template)
    statements = _role_policy(narrowed, "Layer00Expert01")
    text = json.dumps(statements)
    assert "requests/*/00/in/01/*" in text
    statements[:] = json.loads(text.replace("requests/*/00/in/01/*", "requests/*/00/in/02/*"))
    denied = _refused(minilm, weights, narrowed, "AccessDenied")
    assert ("layer00/expert01", "s3:GetObject") in denied
    assert all(who == "layer00/expert01" for who, _ in denied)


def test_a_direct_gate_may_invoke_only_the_experts_its_policy_names(
    minilm: MoEModel, weights: Path, template: dict[str, Any]
) -> None:
    assert METHODS[2] == "direct"
    narrowed = copy.deepcopy(template)
    statements = _role_policy(narrowed, "Layer02")
    (invoke,) = [s for s in statements if s["Action"] == "lambda:InvokeFunction"]
    invoke["Resource"] = invoke["Resource"][1:]  # expert 0 is no longer its to invoke
    denied = _refused(minilm, weights, narrowed, "AccessDeniedException")
    assert denied == {("layer02", "lambda:InvokeFunction")}
