"""The AWS CDK app built from a Plan: `MoeServingStack` and `build_app`.

A local package named `cdk`: the AWS CDK library itself is the `aws_cdk` package, so nothing
is shadowed. aws_cdk is imported lazily (it starts a Node.js process), so importing `cdk` is cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FunctionOptions", "MoeServingStack", "build_app"]


def __getattr__(name: str) -> Any:
    if name == "MoeServingStack":
        from cdk.stack import MoeServingStack

        return MoeServingStack
    if name == "FunctionOptions":
        from cdk._functions import FunctionOptions

        return FunctionOptions
    if name == "build_app":
        from cdk.app import build_app

        return build_app
    raise AttributeError(f"module 'cdk' has no attribute {name!r}")
