"""Execution environments as real processes: warm reuse, reclaim, and each one's own /tmp."""

from __future__ import annotations

import os
import time
from pathlib import Path

from moelambda.environments import EnvironmentPool, FunctionSpec

REPO = Path(__file__).resolve().parents[2]


def _pool(tmp_path: Path, idle_s: float) -> EnvironmentPool:
    spec = FunctionSpec("fn", "tests.traffic.tmp_handler.handler", {}, reserved=0)
    base = dict(os.environ) | {"PYTHONPATH": str(REPO)}
    return EnvironmentPool({"fn": spec}, base, idle_s, tmp_path, max_environments=2)


def test_a_warm_environment_is_reused_and_its_tmp_goes_with_it(tmp_path: Path) -> None:
    """A replay ends its environments by a signal: their weights must not stay on disk."""
    pool = _pool(tmp_path, idle_s=60.0)
    try:
        ok, first = pool.invoke("fn", {})
        ok2, second = pool.invoke("fn", {})
        assert ok and ok2
        assert second["pid"] == first["pid"]  # warm: the same process
        assert [i.cold for i in pool.invocations] == [True, False]
        written = Path(first["path"])
        assert written.is_file() and not written.is_relative_to(tmp_path)
    finally:
        pool.close()
    assert not written.parent.exists()


def test_an_idle_environment_is_reclaimed_with_its_tmp(tmp_path: Path) -> None:
    pool = _pool(tmp_path, idle_s=0.3)
    try:
        _, first = pool.invoke("fn", {})
        deadline = time.monotonic() + 10
        while pool.reclaimed["fn"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.reclaimed["fn"] == 1
        assert not Path(first["path"]).parent.exists()
        _, second = pool.invoke("fn", {})
        assert second["pid"] != first["pid"]
        assert len(pool.cold_starts) == 2
    finally:
        pool.close()
