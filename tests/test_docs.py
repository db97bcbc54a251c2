"""The documentation: the site builds with --strict (no broken link), the README stays a front
door (at most 200 lines) and reaches every page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        mkdocs = Path(shutil.which("mkdocs") or "mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("load_model") > 0


def test_readme_is_a_front_door_to_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([a-z-]+\.md)", readme))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, pages - linked


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_page_is_in_the_site_navigation(page: str) -> None:
    assert page in (ROOT / "mkdocs.yml").read_text()


def _docs_numbers():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_numbers", ROOT / "scripts/docs_numbers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_measured_block_is_its_benchmark_s_json() -> None:
    """Tables and sentences between `<!-- numbers: NAME -->` markers are rendered from the
    JSON a benchmark wrote (scripts/docs_numbers.py): none may differ, every renderer is used,
    and every JSON kept names the command that wrote it."""
    numbers = _docs_numbers()
    assert numbers.stale() == []
    used = {
        m.group(2) for page in numbers.pages() for m in numbers.BLOCK.finditer(page.read_text())
    }
    assert used == set(numbers.RENDERERS)
    kept = {p.name for p in numbers.RESULTS.glob("*.json")}
    assert kept == set(numbers.SOURCES)


def test_a_number_edited_by_hand_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    numbers = _docs_numbers()
    page = tmp_path / "README.md"
    block = numbers.RENDERERS["quality-minilm"]()
    edited = block.replace("0.", "0.9", 1)
    assert edited != block
    page.write_text(f"intro\n<!-- numbers: quality-minilm -->\n{edited}<!-- /numbers -->\nend\n")
    monkeypatch.setattr(numbers, "ROOT", tmp_path)
    assert numbers.stale() == ["README.md: quality-minilm"]
    assert numbers.stale(write=True) and numbers.stale() == []
    assert block in page.read_text() and page.read_text().startswith("intro\n")


NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def test_the_results_page_cites_the_numbers_of_the_page_it_links() -> None:
    """docs/results.md repeats each page's headline numbers: every number of a row must be on
    the page the row links (a stale copy, 0.924 against the page's 0.555, once slipped in)."""
    rows = [
        line
        for line in (ROOT / "docs" / "results.md").read_text().splitlines()
        if line.startswith("| ") and "](" in line
    ]
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        link = re.search(r"\]\(([a-z-]+\.md)", cells[3])
        assert link, row
        page = (ROOT / "docs" / link.group(1)).read_text()
        missing = [n for n in NUMBER.findall(cells[1]) if n not in page]
        assert not missing, f"{link.group(1)} does not say {missing}: {row}"


def test_the_readme_traffic_table_is_the_traffic_page_s() -> None:
    readme = (ROOT / "README.md").read_text().split("## Traffic", 1)[1].split("\n## ", 1)[0]
    table = [line for line in readme.splitlines() if line.startswith("| ") and "---" not in line]
    page = (ROOT / "docs" / "traffic.md").read_text()
    assert len(table) >= 3
    for row in table[1:]:
        missing = [n for n in NUMBER.findall(row) if n not in page]
        assert not missing, f"docs/traffic.md does not say {missing}: {row}"
