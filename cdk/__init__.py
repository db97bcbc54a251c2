"""The AWS CDK app built from a Plan: `MoeServingStack` and `build_app`.

A local package named `cdk`: the AWS CDK library itself is the `aws_cdk` package, so nothing
is shadowed. aws_cdk is imported lazily (it starts a Node.js process), so importing `cdk` is cheap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

SUPPORTED_NODE = 22  # jsii's oldest supported Node.js major release


def _quiet_node_banner() -> None:
    """Replace jsii's eleven-line end-of-life banner (printed as Python bytes reprs) by one line.

    jsii skips its banner for the majors listed in JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION;
    we list the one found and say once, as text, what to upgrade.
    """
    variable = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"
    node = shutil.which("node")
    if variable in os.environ or node is None:
        return
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        major = int(version.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return
    os.environ[variable] = str(major)
    if major < SUPPORTED_NODE:
        print(
            f"note: Node.js {version} is end-of-life for aws-cdk-lib's jsii runtime; synthesis "
            f"works, but install Node {SUPPORTED_NODE} or newer to stay supported.",
            file=sys.stderr,
        )


_quiet_node_banner()

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
