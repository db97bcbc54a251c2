"""Execution environments as real processes: warm reuse, reclaim, and each one's own /tmp."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.environments import EnvironmentPool, FunctionSpec, Throttled, _Environment

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0  # generous: a shared machine can take seconds to start or end a process


def _pool(
    tmp_path: Path, idle_s: float, names: tuple[str, ...] = ("fn",), max_environments: int = 2
) -> EnvironmentPool:
    specs = {n: FunctionSpec(n, "tests.traffic.tmp_handler.handler", {}, 0) for n in names}
    base = dict(os.environ) | {"PYTHONPATH": str(REPO)}
    return EnvironmentPool(specs, base, idle_s, tmp_path, max_environments)


def _wait_until(condition: Callable[[], bool]) -> bool:
    """Whether `condition` came true before the deadline (checked every 50 ms)."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


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


def test_an_idle_environment_is_counted_reclaimed_once_its_tmp_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper ends an idle environment, and `reclaimed` counts it only once its process
    and /tmp are gone: held in the middle of ending it, the count is still 0."""
    ending, release = threading.Event(), threading.Event()
    end = _Environment.close

    def held(env: _Environment) -> None:
        ending.set()
        release.wait(DEADLINE_S)
        end(env)

    monkeypatch.setattr(_Environment, "close", held)
    pool = _pool(tmp_path, idle_s=0.3)
    try:
        _, first = pool.invoke("fn", {})
        assert ending.wait(DEADLINE_S)  # the reaper took it out and is ending it
        assert pool.reclaimed["fn"] == 0
        release.set()
        assert _wait_until(lambda: pool.reclaimed["fn"] == 1)
        assert not Path(first["path"]).parent.exists()
        _, second = pool.invoke("fn", {})
        assert second["pid"] != first["pid"]
        assert len(pool.cold_starts) == 2
    finally:
        release.set()
        pool.close()


def test_an_environment_expiring_at_an_invocation_frees_its_place_once(tmp_path: Path) -> None:
    """`max_environments` bounds the live processes: an environment that expires at an
    invocation frees one place, not two. fn's and gn's environments are live when the bound is
    lowered to 1 (as the replay changes the idle time between its phases); fn's then expires
    at fn's invocation, and gn's still holds the one place, so fn may not start another."""
    pool = _pool(tmp_path, idle_s=3600.0, names=("fn", "gn"))
    try:
        _, first = pool.invoke("fn", {})
        pool.touch_idle(time.monotonic() - 100.0)  # fn's environment idle for 100 s
        pool.invoke("gn", {})  # gn's started now
        pool.max_environments = 1
        pool.idle_s = 50.0  # fn's is past it, gn's is not
        with pytest.raises(Throttled, match="1 environments are live"):
            pool.invoke("fn", {})
        assert pool.limit_reached == 1
        assert len(pool.cold_starts) == 2
        # A throttled invocation still ends what it found expired.
        assert _wait_until(lambda: pool.reclaimed["fn"] == 1)
        assert not Path(first["path"]).parent.exists()
    finally:
        pool.close()
