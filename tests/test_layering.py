"""Imports run downward: no package imports the CLI package, and the local runner in pipeline/
never imports the handlers of functions/ it runs (they are passed in); no module imports a
floor above its own, and no import circle exists, counting every import (in functions and
under TYPE_CHECKING too)."""

from __future__ import annotations

import ast
import graphlib
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
    "runtime",
)
# The floors, top first (shared/design/ARCHITECTURE.md): a module imports its own floor or below.
FLOORS = {
    "moelambda": 0,
    "runtime": 1,
    "cdk": 2,
    "functions": 2,
    "pipeline": 2,
    "gpu": 2,
    "cluster": 2,
    "planner": 3,
    "predictor": 4,
    "moe": 5,
    "ground": 6,
}


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


def _modules() -> dict[str, Path]:
    modules = {}
    for package in FLOORS:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from p import m` counts m where m is a
    module, else p: the package's __init__ runs either way)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets |= {
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                }
        graph[name] = {r for t in targets if (r := resolve(t)) is not None and r != name}
    return graph


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = sorted(
        f"{a} imports {b}"
        for a, targets in _import_graph().items()
        for b in targets
        if FLOORS[b.split(".")[0]] < FLOORS[a.split(".")[0]]
    )
    assert upward == []


def test_there_is_no_import_circle() -> None:
    try:
        graphlib.TopologicalSorter(_import_graph()).prepare()
    except graphlib.CycleError as circle:
        raise AssertionError(f"an import circle: {' -> '.join(circle.args[1])}") from None


def test_one_plan_writer() -> None:
    """Every Plan document is written by `planner.plan_writer.write_plan` (a stored plan is
    read with `Plan.load`/`Plan.model_validate`, which write nothing new). Counted: a module
    that imports ground's `Plan` and calls it (cluster/ has a `Plan` of its own)."""
    imports = re.compile(r"from ground\.plan import \(?[^)]*?\bPlan\b", re.S)
    calls = re.compile(r"^(?!\s*class ).*(?<![\w.])Plan\(", re.M)
    writers = sorted(
        str(path.relative_to(ROOT))
        for package in FLOORS
        for path in (ROOT / package).rglob("*.py")
        if imports.search(text := path.read_text(encoding="utf-8")) and calls.search(text)
    )
    assert writers == ["planner/plan_writer.py"]


def test_no_branch_on_a_deployment_name() -> None:
    """What a deployment does is asked of its topology (`ground.topology`) or its planner
    shape (`planner.batch_shapes`), never read off its name: a comparison with a deployment's
    name anywhere else (`plan.deployment == "workflow"`, `shape != "monolithic"`) is the
    branch a new deployment would have to find and extend."""
    named = r"""\b(deployment|shape)\b["'\]]*\s*(==|!=)\s*["'](?!auto["'])"""
    listed = r"""\b(deployment|shape)\b["'\]]*\s+(not\s+)?in\s+[(\[{]"""
    # "driver" is also a function's role and name: those comparisons are not about shapes
    name = r"""["'](workflow|monolithic)["']"""
    literal = rf"(==|!=)\s*{name}|{name}\s*(==|!=)"
    compared = re.compile(f"{named}|{listed}|{literal}")
    homes = {"ground/topology.py", "planner/batch_shapes.py"}
    found = sorted(
        f"{where}:{number}: {line.strip()}"
        for package in FLOORS
        for path in (ROOT / package).rglob("*.py")
        if (where := str(path.relative_to(ROOT))) not in homes
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if compared.search(line)
    )
    assert found == []
