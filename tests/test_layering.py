"""Imports run downward: no package imports the CLI package, and the local runner in pipeline/
never imports the handlers of functions/ it runs (they are passed in)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "cdk",
    "cluster",
    "functions",
    "gpu",
    "ground",
    "moe",
    "pipeline",
    "planner",
    "predictor",
)


def _importing(packages: tuple[str, ...], target: str) -> list[str]:
    pattern = re.compile(
        rf"^\s*(from|import)\s+{target}(\.|\s|$)|import_module\(\s*[\"']{target}", re.M
    )
    return [
        str(path.relative_to(ROOT))
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]


def test_no_package_imports_the_cli() -> None:
    assert _importing(PACKAGES, "moelambda") == []


def test_pipeline_does_not_import_the_handlers() -> None:
    assert _importing(("pipeline",), "functions") == []
