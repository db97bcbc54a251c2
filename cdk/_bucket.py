"""The stack's one S3 bucket: the weights under `weights/`, request intermediates, outputs."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

from ground.layout import INPUTS_PREFIX, OUTPUTS_PREFIX, REQUESTS_PREFIX

__all__ = ["INPUTS_PREFIX", "OUTPUTS_PREFIX", "REQUESTS_PREFIX", "ServingBucket"]


class ServingBucket(Construct):
    """SSE-S3, no public access, TLS only; request intermediates expire after a day.

    The bucket holds the weights, so it is retained when the stack is deleted.
    """

    def __init__(self, scope: Construct, id_: str, *, request_expiry_days: int = 1) -> None:
        super().__init__(scope, id_)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireRequestIntermediates",
                    prefix=REQUESTS_PREFIX,
                    expiration=Duration.days(request_expiry_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                # Uploaded inputs are the callers': the workflow reads them and leaves them.
                s3.LifecycleRule(
                    id="ExpireRequestInputs",
                    prefix=INPUTS_PREFIX,
                    expiration=Duration.days(request_expiry_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
        )
