"""checkov (pinned in requirements-checkov.txt, its own venv from `make setup`) on the
synthesised template: no failed check, and every skipped one carries its reason.

cdk-nag runs inside every synth (cdk/nag.py; tests/cdk/test_stack.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cdk.test_stack import _synth, small_plan

CHECKOV = Path(__file__).resolve().parents[2] / ".venv-checkov" / "bin" / "checkov"


def _checkov(template: Path) -> dict[str, Any]:
    assert CHECKOV.exists(), f"{CHECKOV} is missing: run `make setup`, which installs it"
    done = subprocess.run(
        [str(CHECKOV), "-f", str(template), "--framework", "cloudformation", "-o", "json"]
        + ["--quiet", "--skip-download", "--compact"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.strip(), done.stderr[-2000:]
    report = json.loads(done.stdout)
    return report[0] if isinstance(report, list) else report


@pytest.mark.parametrize("extra", [[], ["--no-reserve-concurrency", "--tracing"]])
def test_checkov_finds_nothing_unexplained(tmp_path: Path, extra: list[str]) -> None:
    _synth(tmp_path, small_plan(("s3", "pipelined", "direct")), "--no-lint", *extra)
    template = tmp_path / "cdk.out" / "MoeLambda.template.json"
    report = _checkov(template)
    failed = report["results"]["failed_checks"]
    assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]
    assert report["summary"]["passed"] > 100
    resources = json.loads(template.read_text())["Resources"]
    skips = [
        skip
        for res in resources.values()
        for skip in res.get("Metadata", {}).get("checkov", {}).get("skip", [])
    ]
    assert skips and all(len(s["comment"]) > 40 for s in skips)
    assert report["summary"]["skipped"] == len(skips)


def test_checkov_finds_nothing_unexplained_in_nested_stacks(tmp_path: Path) -> None:
    summary, _ = _synth(
        tmp_path,
        small_plan(("s3", "pipelined", "direct")),
        "--no-lint",
        "--experts-per-stack",
        "3",
    )
    assert summary["nested_stacks"] == 3
    for entry in summary["templates"][1:]:
        report = _checkov(Path(entry["template"]))
        failed = report["results"]["failed_checks"]
        assert report["summary"]["failed"] == 0, [(f["check_id"], f["resource"]) for f in failed]
        assert report["summary"]["passed"] > 10 and report["summary"]["skipped"] > 0
