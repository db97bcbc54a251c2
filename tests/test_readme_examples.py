"""The README's example runs as written after `make demo`.

The demo's profile and predict steps are read from the Makefile (so the example sees the model,
trace and counts that `make demo` leaves in out/), then every line of the README's example block
and its Python snippet run in that directory. The demo's plan, synth and run-local steps are
left out: the example does not read what they write, and other tests cover them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moelambda.cli import app

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DEMO_STEPS = {"plan", "synth", "run-local"}


def _demo_steps() -> list[list[str]]:
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    joined = recipe.replace("\\\n", " ")
    steps = [
        shlex.split(line.split("$(BIN)/moelambda", 1)[1])
        for line in joined.splitlines()
        if "$(BIN)/moelambda" in line
    ]
    return [s for s in steps if s[0] not in SKIPPED_DEMO_STEPS]


def _example_lines() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- example -->\n```bash\n(.*?)```", readme, re.S)
    assert block, "the README lost its example block (<!-- example --> then a bash fence)"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    assert all(line[0] == "moelambda" for line in lines if line)
    return [line[1:] for line in lines if line]


def _python_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S)
    assert snippet, "the README lost its Python example"
    return snippet.group(1)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os

    cwd = Path.cwd()
    root = tmp_path_factory.mktemp("demo")
    os.chdir(root)
    try:
        for step in _demo_steps():
            result = CliRunner().invoke(app, step)
            assert result.exit_code == 0, (step, result.output)
    finally:
        os.chdir(cwd)
    return root


def test_readme_example_runs_as_written(demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One test, the lines in order: a line reads what the lines before it wrote (run-local
    reads plan's output), and separate tests may land on different xdist workers."""
    monkeypatch.chdir(demo_dir)
    for args in _example_lines():
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert "Traceback" not in result.output, args


def test_readme_python_snippet_runs(demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(demo_dir)
    exec(compile(_python_snippet(), "README.md", "exec"), {})
