"""A synthesised cloud assembly as one template: the parent stack with its nested stacks merged.

A plan with many expert functions puts them in nested stacks (`cdk._functions`) so no template
passes CloudFormation's limits. CloudFormation wires them through parameters (the parent passes
the bucket in) and outputs (the parent reads the functions' names and ARNs); the local runner
deploys functions and a state machine, not stacks, so it takes the merged template, in which
every parameter and output reference is replaced by the value it stands for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ground.errors import MoelambdaError

__all__ = ["AssemblyError", "flat_template"]

_NESTED = "AWS::CloudFormation::Stack"


class AssemblyError(MoelambdaError):
    """A cloud assembly that is not what `moelambda synth` writes."""


def _replace(value: Any, swap: Any) -> Any:
    """`value` with every dict that `swap` maps to something else replaced, depth first."""
    if isinstance(value, dict):
        replaced = swap(value)
        if replaced is not value:
            return replaced
        return {k: _replace(v, swap) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, swap) for v in value]
    return value


def _nested_template(root: Path, stack: str, resource: dict[str, Any]) -> dict[str, Any]:
    """The template a nested stack resource points at, found by its asset hash."""
    parts = resource["Properties"]["TemplateURL"]["Fn::Join"][1]
    asset = str(parts[-1]).rsplit("/", 1)[-1].removesuffix(".json")
    files = json.loads((root / f"{stack}.assets.json").read_text())["files"]
    if asset not in files:
        raise AssemblyError(
            f"the nested template {asset}.json is not among {stack}'s assets",
            "synthesise the plan again with `moelambda synth`.",
        )
    return json.loads((root / files[asset]["source"]["path"]).read_text())


def flat_template(root: str | Path, stack: str) -> dict[str, Any]:
    """Stack `stack` of the cloud assembly at `root`, its nested stacks' resources merged in.

    Raises:
        AssemblyError: A nested template is missing, or two stacks share a logical id.
    """
    root = Path(root)
    template = json.loads((root / f"{stack}.template.json").read_text())
    resources = dict(template["Resources"])
    outputs: dict[tuple[str, str], Any] = {}
    for logical, resource in list(resources.items()):
        if resource["Type"] != _NESTED:
            continue
        nested = _nested_template(root, stack, resource)
        given = resource["Properties"].get("Parameters", {})

        def parameter(value: dict[str, Any], given: dict[str, Any] = given) -> Any:
            ref = value.get("Ref")
            return given[ref] if len(value) == 1 and ref in given else value

        inner = _replace(nested["Resources"], parameter)
        clash = set(inner) & set(resources)
        if clash:
            raise AssemblyError(
                f"the nested stack {logical} and its parent share logical ids {sorted(clash)}",
                "synthesise the plan again with `moelambda synth`.",
            )
        del resources[logical]
        resources |= inner
        for name, output in nested.get("Outputs", {}).items():
            outputs[logical, f"Outputs.{name}"] = _replace(output["Value"], parameter)

    def output(value: dict[str, Any]) -> Any:
        att = value.get("Fn::GetAtt")
        if len(value) == 1 and isinstance(att, list) and tuple(att) in outputs:
            return outputs[tuple(att)]
        return value

    return template | {"Resources": _replace(resources, output)}
