"""The scatter-gather method of one MoE layer: the paper's a = 1, 2, 3.

The planner reasons with the numbers, the Plan and the functions' environment carry the labels;
both come from this one enum so they cannot drift apart.
"""

from __future__ import annotations

from enum import IntEnum

from ground.errors import UsageError

__all__ = ["METHODS", "Method"]


class Method(IntEnum):
    """Scatter-gather method of one MoE layer (the paper's a = 1, 2, 3)."""

    PIPELINED = 1  # indirect via S3, minibatches of beta tokens, overlapped
    S3 = 2  # indirect via S3, one object per shard
    DIRECT = 3  # the payload travels inline with the invocation

    @property
    def label(self) -> str:
        return {1: "pipelined", 2: "s3", 3: "direct"}[int(self)]

    @classmethod
    def parse(cls, name: str) -> Method:
        for method in cls:
            if method.label == name:
                return method
        raise UsageError(
            f"unknown scatter-gather method '{name}'.", "use pipelined, s3 or direct."
        )


METHODS = tuple(method.label for method in Method)
