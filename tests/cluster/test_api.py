"""The cluster commands as Python calls: what `cluster simulate|compare` print is one call."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import compare_schedulers, plot_comparison, simulate_scheduler
from ground.errors import MoelambdaError, UsageError


def test_simulate_and_compare_are_one_call_each(tmp_path: Path) -> None:
    seen: list[tuple[str, int, int | None]] = []
    summary = simulate_scheduler("rubick", trace="naive", progress=lambda *a: seen.append(a))
    assert summary["jobs"] == 10 and summary["avg_jct_s"] == pytest.approx(895.6, rel=0.01)
    assert seen and seen[-1][0] == "rubick on naive"
    table = compare_schedulers(["rubick", "rubick-e"], trace="naive")
    assert (table["trace"], table["cluster"]) == ("naive", "n8g8")
    assert [r["scheduler"] for r in table["results"]] == ["rubick", "rubick-e"]
    png = tmp_path / "c.png"
    assert plot_comparison(table["results"], png, "naive") == str(png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(MoelambdaError, match="already exists"):
        plot_comparison(table["results"], png, "naive")


def test_refusals_come_before_any_replay(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not used by rubick"):
        simulate_scheduler("rubick", days=2)
    with pytest.raises(UsageError, match="different artifacts"):
        compare_schedulers(["rubick", "edf"])
    with pytest.raises(UsageError, match="empty"):
        compare_schedulers([])
    nothing = [{"scheduler": "lyra", "deadline_ratio": None, "avg_jct_s": None}]
    with pytest.raises(UsageError, match="no scheduler finished a job"):
        plot_comparison(nothing, tmp_path / "x.png", "x")
    assert not (tmp_path / "x.png").exists()
