"""The synthesised stack's IAM policies, enforced on the local run's requests.

moto does not enforce IAM by default, and where it does it ignores the `StringLike` conditions
our listing relies on, so a policy that denies a handler what it needs would pass every local
test and fail on AWS. The local runner therefore gives each function its own identity (an
access key id, `functions.config.Config.local_identity`), and this module checks every S3
request and every direct Invoke a function makes against that function's policy, read from the
template: a denied request gets S3's 403 AccessDenied (Lambda's AccessDeniedException), as on
AWS, and is recorded. A stream plan's worker and endpoint use its queue: `sqs_request` checks
their SQS requests the same way (the action of each operation, the queue's ARN from its URL).

The evaluator covers exactly the policy language the stack uses: Allow statements, actions and
resources with `*` and `?` wildcards, and `StringLike` on `s3:prefix`. Anything else in a
policy (a Deny, another condition) is refused when the policies are read, never guessed at.
"""

from __future__ import annotations

import json
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pipeline.meter import identity_of, object_key

__all__ = ["Policies", "Statement", "queue_arn", "s3_request", "sqs_request"]

# The IAM action of each S3 operation the handlers make (a HEAD is authorised as a GET).
_S3_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "DeleteObject": "s3:DeleteObject",
    "DeleteObjects": "s3:DeleteObject",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
}

# The IAM action of each SQS operation: a batch is authorised as its single form.
_SQS_BATCHES = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}


@lru_cache(maxsize=4096)
def _pattern(wildcard: str) -> re.Pattern[str]:
    """IAM's wildcard match: `*` any run of characters ('/' included), `?` any one."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in wildcard)
    return re.compile("".join(parts), re.DOTALL)


def _matches(patterns: tuple[str, ...], value: str, *, case: bool = True) -> bool:
    if not case:
        return any(_pattern(p.lower()).fullmatch(value.lower()) for p in patterns)
    return any(_pattern(p).fullmatch(value) for p in patterns)


def _strings(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Statement:
    """One Allow statement; `prefixes` is its `StringLike` `s3:prefix` condition, if any."""

    actions: tuple[str, ...]
    resources: tuple[str, ...]
    prefixes: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, statement: dict[str, Any]) -> Statement:
        """A statement of the supported language; anything else is a ValueError."""
        if statement.get("Effect") != "Allow" or "NotAction" in statement:
            raise ValueError(f"only Allow statements with Action are supported: {statement}")
        if "NotResource" in statement or "Principal" in statement:
            raise ValueError(f"unsupported statement element in {statement}")
        condition = statement.get("Condition")
        prefixes = None
        if condition is not None:
            if set(condition) != {"StringLike"} or set(condition["StringLike"]) != {"s3:prefix"}:
                raise ValueError(f"only StringLike on s3:prefix is supported: {condition}")
            prefixes = _strings(condition["StringLike"]["s3:prefix"])
        return cls(_strings(statement["Action"]), _strings(statement["Resource"]), prefixes)

    def allows(self, action: str, resource: str, prefix: str | None) -> bool:
        if not _matches(self.actions, action, case=False):
            return False
        if not _matches(self.resources, resource):
            return False
        if self.prefixes is None:
            return True
        # A condition on a key the request lacks does not match (IAM's rule for StringLike).
        return prefix is not None and _matches(self.prefixes, prefix)


class Policies:
    """Each identity's statements; a request is allowed if one of them allows it."""

    def __init__(self, statements: dict[str, list[Statement]]) -> None:
        self._statements = statements
        self._lock = threading.Lock()
        self.denied: list[tuple[str, str, str]] = []  # (identity, action, resource)

    @classmethod
    def from_template(
        cls, resources: dict[str, Any], identities: dict[str, str], concrete: Any
    ) -> Policies:
        """The inline policies of each function's role in a template.

        `identities` maps a function's logical id to its identity; `concrete` resolves the
        template's intrinsic functions as deployed (`pipeline.local.concrete`).
        """
        statements: dict[str, list[Statement]] = {}
        for logical, identity in identities.items():
            role_ref = resources[logical]["Properties"]["Role"]["Fn::GetAtt"][0]
            role = resources[role_ref]["Properties"]
            if role.get("ManagedPolicyArns"):
                raise ValueError(f"{role_ref} has managed policies, which are not evaluated")
            statements[identity] = [
                Statement.parse(s)
                for policy in role.get("Policies", [])
                for s in concrete(policy["PolicyDocument"])["Statement"]
            ]
        return cls(statements)

    def knows(self, identity: str | None) -> bool:
        """Whether `identity` is one of the functions (the runner's own requests are not)."""
        return identity in self._statements

    def allows(self, identity: str, action: str, resource: str, prefix: str | None = None) -> bool:
        allowed = any(s.allows(action, resource, prefix) for s in self._statements[identity])
        if not allowed:
            with self._lock:
                self.denied.append((identity, action, resource))
        return allowed


def _deleted_keys(body: bytes) -> Iterator[str]:
    """The keys of a DeleteObjects request body."""
    root = ET.fromstring(body)
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == "Key" and element.text:
            yield element.text


def s3_request(policies: Policies, operation: str, request: Any, bucket: str) -> bool:
    """Whether the function that made this S3 request may; True for the runner's own.

    A DeleteObjects is allowed only if every key is (S3 would fail the others one by one;
    the handlers treat any failed key as the request's failure alike).
    """
    identity = identity_of(request)
    if not policies.knows(identity):
        return True
    assert identity is not None
    key = object_key(request.url, bucket)
    action = _S3_ACTIONS.get(operation)
    if key is None or action is None:  # another bucket, or an operation no handler makes
        return policies.allows(identity, f"s3:{operation}", request.url)
    if action == "s3:ListBucket":
        query = parse_qs(urlsplit(request.url).query)
        prefix = query.get("prefix", [None])[0]
        return policies.allows(identity, action, f"arn:aws:s3:::{bucket}", prefix)
    if operation == "DeleteObjects":
        body = request.body if isinstance(request.body, bytes) else request.body.read()
        keys = list(_deleted_keys(body))
        return all(policies.allows(identity, action, f"arn:aws:s3:::{bucket}/{k}") for k in keys)
    return policies.allows(identity, action, f"arn:aws:s3:::{bucket}/{key}")


def queue_arn(queue_url: str) -> str:
    """The ARN of the queue at `queue_url` (https://sqs.<region>.<domain>/<account>/<name>, as
    AWS and moto write it)."""
    parts = urlsplit(queue_url)
    host = (parts.hostname or "").split(".")
    region = host[1] if len(host) > 2 and host[0] == "sqs" else host[0]
    account, name = parts.path.strip("/").split("/", 1)
    return f"arn:aws:sqs:{region}:{account}:{name}"


def _queue_url(request: Any) -> str | None:
    """The QueueUrl of an SQS request, in the JSON protocol's body or the query protocol's."""
    body = request.body or b""
    if not isinstance(body, bytes | str):
        body = body.read()
    text = body.decode() if isinstance(body, bytes) else body
    url = None
    if text.lstrip().startswith("{"):
        try:
            url = json.loads(text).get("QueueUrl")
        except ValueError:
            url = None
    if url is None:
        url = parse_qs(text).get("QueueUrl", [None])[0]
    return url


def sqs_request(policies: Policies, operation: str, request: Any) -> bool:
    """Whether the function that made this SQS request (`operation`: botocore's name, e.g.
    ReceiveMessage) may, on the queue its QueueUrl names; True for the runner's own."""
    identity = identity_of(request)
    if not policies.knows(identity):
        return True
    assert identity is not None
    action = f"sqs:{_SQS_BATCHES.get(operation, operation)}"
    url = _queue_url(request)
    resource = queue_arn(url) if url else "*"
    return policies.allows(identity, action, resource)
