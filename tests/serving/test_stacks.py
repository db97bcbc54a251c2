"""pipeline.stacks: a parent template and its nested ones merged into the one run-local runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.stacks import AssemblyError, flat_template


def _assembly(root: Path, nested_resources: dict[str, Any]) -> None:
    nested = {
        "Parameters": {"BucketName": {"Type": "String"}},
        "Resources": nested_resources,
        "Outputs": {
            "FnRef": {"Value": {"Ref": "Fn"}},
            "FnArn": {"Value": {"Fn::GetAtt": ["Fn", "Arn"]}},
        },
    }
    (root / "child.nested.template.json").write_text(json.dumps(nested))
    (root / "Top.assets.json").write_text(
        json.dumps({"files": {"abc123": {"source": {"path": "child.nested.template.json"}}}})
    )
    url = {"Fn::Join": ["", ["https://s3.", {"Ref": "AWS::Region"}, "/bucket/abc123.json"]]}
    parent = {
        "Resources": {
            "Bucket": {"Type": "AWS::S3::Bucket"},
            "Child": {
                "Type": "AWS::CloudFormation::Stack",
                "Properties": {
                    "Parameters": {"BucketName": {"Ref": "Bucket"}},
                    "TemplateURL": url,
                },
            },
            "Gate": {
                "Type": "AWS::Lambda::Function",
                "Properties": {
                    "Environment": {
                        "Variables": {"CALLS": {"Fn::GetAtt": ["Child", "Outputs.FnRef"]}}
                    },
                    "Arn": {"Fn::GetAtt": ["Child", "Outputs.FnArn"]},
                },
            },
        }
    }
    (root / "Top.template.json").write_text(json.dumps(parent))


def test_parameters_and_outputs_are_replaced_by_what_they_stand_for(tmp_path: Path) -> None:
    fn = {
        "Type": "AWS::Lambda::Function",
        "Properties": {"Environment": {"Variables": {"BUCKET": {"Ref": "BucketName"}}}},
    }
    _assembly(tmp_path, {"Fn": fn})
    flat = flat_template(tmp_path, "Top")["Resources"]
    assert set(flat) == {"Bucket", "Gate", "Fn"}  # the nested stack resource is gone
    assert flat["Fn"]["Properties"]["Environment"]["Variables"]["BUCKET"] == {"Ref": "Bucket"}
    gate = flat["Gate"]["Properties"]
    assert gate["Environment"]["Variables"]["CALLS"] == {"Ref": "Fn"}
    assert gate["Arn"] == {"Fn::GetAtt": ["Fn", "Arn"]}


def test_a_logical_id_in_both_stacks_or_a_missing_nested_template_is_refused(
    tmp_path: Path,
) -> None:
    _assembly(tmp_path, {"Fn": {"Type": "AWS::Lambda::Function"}, "Gate": {"Type": "X"}})
    with pytest.raises(AssemblyError, match="share logical ids"):
        flat_template(tmp_path, "Top")
    (tmp_path / "Top.assets.json").write_text(json.dumps({"files": {}}))
    with pytest.raises(AssemblyError, match="not among Top's assets"):
        flat_template(tmp_path, "Top")
