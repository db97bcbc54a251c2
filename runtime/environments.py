"""Lambda execution environments as real processes, for `run-local --traffic`
(`runtime.traffic_replay`): the mechanism the traffic simulator models, realised.

An environment is a fresh `python -c` process started for one function with that function's
environment variables: it imports the function's handler module (Lambda's INIT phase), then
serves one invocation at a time (a JSON line in, a JSON line out); the handler loads its weights
on its first call, as on Lambda. `EnvironmentPool` keeps per function a stack of idle
environments: an invocation takes the most recently used idle one, or starts a new one and
waits for it (a cold start); one idle longer than the idle time is reclaimed (its process
ended) by a reaper thread and at every invocation; a function's reserved concurrency throttles
invocations beyond it (`Throttled`, Lambda's 429); `max_environments` bounds all live processes.
Each environment has a temporary directory of its own (its TMPDIR, Lambda's /tmp), removed when
the environment ends: the process is ended by a signal and could not remove it itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

__all__ = [
    "POLL_S",
    "ColdStart",
    "EnvironmentPool",
    "FunctionSpec",
    "Invocation",
    "Throttled",
]

REAP_S = 0.2  # how often idle environments are checked for reclaim
POLL_S = 0.05  # how often running executions are polled

# An execution environment: import the handler (INIT), say so, then serve one JSON line at a
# time. The handler's own prints (EMF metrics) go to stderr; stdout carries the protocol only.
# It ends itself if the replay's process goes away.
WORKER = r"""
import json, os, sys, threading, time
parent = os.getppid()
def orphaned():  # the replay ended without ending this environment: end it
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
threading.Thread(target=orphaned, daemon=True).start()
out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr
import importlib
module, _, attr = sys.argv[1].rpartition(".")
t0 = time.perf_counter()
handler = getattr(importlib.import_module(module), attr)
out.write(json.dumps({"ready": True, "import_s": time.perf_counter() - t0}) + "\n")
for line in sys.stdin:
    event = json.loads(line)
    t0 = time.perf_counter()
    try:
        body, ok = handler(event, None), True
    except Exception as error:
        body, ok = {"errorType": type(error).__name__, "errorMessage": str(error)}, False
    out.write(json.dumps({"ok": ok, "body": body, "s": time.perf_counter() - t0}) + "\n")
"""


class Throttled(Exception):
    """An invocation refused before it ran: reserved concurrency or the environment bound."""


@dataclasses.dataclass
class FunctionSpec:
    """One deployed function: its label (head, layer03, layer03/expert01, tail, cleanup), the
    template's handler path, its environment variables and its reserved concurrency (0: none)."""

    label: str
    handler: str
    env: dict[str, str]
    reserved: int


class _Environment:
    """One execution environment: a process serving one function, one invocation at a time."""

    def __init__(self, spec: FunctionSpec, base_env: dict[str, str], log: Path) -> None:
        self.spec = spec
        self.spawned = time.monotonic()
        self._log = log.open("ab")
        self._tmp = tempfile.mkdtemp(prefix="moelambda-env-")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, spec.handler],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=base_env | spec.env | {"TMPDIR": self._tmp},
            text=True,
            bufsize=1,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError(f"{spec.label}: the environment died in its INIT (see {log})")
        self.ready = time.monotonic()
        self.init_s = self.ready - self.spawned
        self.import_s = float(json.loads(line)["import_s"])
        self.last_used = self.ready
        self.calls = 0

    def call(self, event: dict[str, Any]) -> tuple[bool, Any]:
        """(ok, body) of one invocation: the result, or the error as Lambda reports it."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(event) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.spec.label}: the environment's process died")
        self.calls += 1
        answer = json.loads(line)
        return bool(answer["ok"]), answer["body"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


@dataclasses.dataclass
class Invocation:
    """One invocation as the pool saw it (monotonic seconds)."""

    function: str
    request_id: str | None
    start: float
    end: float
    cold: bool
    ok: bool


@dataclasses.dataclass
class ColdStart:
    """One environment started: its function, when, its INIT, how many environments were
    starting at the same time (itself included) when it began, and the request whose
    invocation started it and so waited on it (the event's `request_id`; None for a warmer's
    ping), which ties the start to the request it delayed (`traffic_replay.host_bound`)."""

    function: str
    spawned: float
    init_s: float
    import_s: float
    concurrent: int
    queued_s: float = 0.0  # waited for `start_limit` before the process started
    request_id: str | None = None


class EnvironmentPool:
    """Execution environments per function: real processes, MRU first, reclaimed when idle.

    `invoke` runs one invocation: on the most recently used idle environment of the function,
    or on a new one it starts and waits for (a cold start). An environment idle for more than
    `idle_s` is reclaimed: its process ends. `reserved` concurrency and `max_environments`
    refuse an invocation with `Throttled` before it runs. `start_limit` (None: none) bounds
    the environments in INIT at once: a further start waits for one to finish (the wait is
    recorded with the cold start).
    """

    def __init__(
        self,
        functions: dict[str, FunctionSpec],
        base_env: dict[str, str],
        idle_s: float,
        logs: Path,
        max_environments: int,
        start_limit: int | None = None,
    ) -> None:
        self.functions = functions
        self.base_env = base_env
        self.idle_s = idle_s
        self.logs = logs
        self.max_environments = max_environments
        self._start_gate: Any = None
        self.limit_starts(start_limit)
        self.invocations: list[Invocation] = []
        self.cold_starts: list[ColdStart] = []
        self.reclaimed: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()
        self.limit_reached = 0
        self._lock = threading.Lock()
        self._idle: dict[str, list[_Environment]] = defaultdict(list)  # oldest first
        self._in_flight: Counter[str] = Counter()
        self._live = 0
        self._starting = 0
        self.peak: Counter[str] = Counter()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True)
        self._reaper.start()

    def invoke(self, name: str, event: dict[str, Any]) -> tuple[bool, Any]:
        """(ok, body) of `event` run by function `name` (see the class docstring)."""
        spec = self.functions[name]
        rid = event.get("request_id") if isinstance(event, dict) else None
        expired: list[_Environment] = []
        try:
            with self._lock:
                now = time.monotonic()
                expired = self._expire(now)
                if spec.reserved and self._in_flight[name] >= spec.reserved:
                    self.throttled[spec.label] += 1
                    raise Throttled(f"reserved concurrency {spec.reserved} of {spec.label}")
                stack = self._idle[name]
                env = stack.pop() if stack else None
                if env is None:
                    if self._live >= self.max_environments:  # the expired no longer count
                        self.limit_reached += 1
                        raise Throttled(f"{self.max_environments} environments are live")
                    self._live += 1
                    self._starting += 1
                    concurrent = self._starting
                self._in_flight[name] += 1
                self.peak[spec.label] = max(self.peak[spec.label], self._in_flight[name])
        finally:  # a throttled invocation too ends what it took out
            self._reclaim(expired)
        cold = env is None
        ok, body = False, None
        try:
            if env is None:
                try:
                    asked = time.monotonic()
                    with self._start_gate:
                        queued = time.monotonic() - asked
                        log = self.logs / f"{spec.label.replace('/', '-')}.log"
                        env = _Environment(spec, self.base_env, log)
                except BaseException:
                    with self._lock:
                        self._live -= 1
                        self._starting -= 1
                    raise
                with self._lock:
                    self._starting -= 1
                    self.cold_starts.append(
                        ColdStart(
                            spec.label,
                            env.spawned,
                            env.init_s,
                            env.import_s,
                            concurrent,
                            queued,
                            rid,
                        )
                    )
            ok, body = env.call(event)
            return ok, body
        finally:
            end = time.monotonic()
            with self._lock:
                self._in_flight[name] -= 1
                if env is not None and env.proc.poll() is None:
                    env.last_used = end
                    self._idle[name].append(env)
                elif env is not None:
                    self._live -= 1
                self.invocations.append(Invocation(spec.label, rid, now, end, cold, ok))

    def _expire(self, now: float) -> list[_Environment]:
        """Take out (under the lock) every environment idle longer than the idle time; they no
        longer count as live, and `_reclaim` ends them."""
        expired = []
        for stack in self._idle.values():
            expired += [e for e in stack if e.last_used < now - self.idle_s]
            stack[:] = [e for e in stack if e.last_used >= now - self.idle_s]
        self._live -= len(expired)
        return expired

    def _reclaim(self, expired: list[_Environment]) -> None:
        """End the environments `_expire` took out (outside the lock: ending one takes up to
        seconds), and only then count each reclaimed, so that a reclaim once counted has
        already removed its process and its temporary directory."""
        for env in expired:
            env.close()
            with self._lock:
                self.reclaimed[env.spec.label] += 1

    def _reap_loop(self) -> None:
        while not self._stop.wait(REAP_S):
            with self._lock:
                expired = self._expire(time.monotonic())
            self._reclaim(expired)

    def limit_starts(self, limit: int | None) -> None:
        """From now on, at most `limit` environments in INIT at once (None: no bound)."""
        self._start_gate = threading.BoundedSemaphore(limit) if limit else contextlib.nullcontext()

    def touch_idle(self, at: float) -> None:
        """Start every idle environment's idle clock at `at` (monotonic): the trace's start."""
        with self._lock:
            for stack in self._idle.values():
                for env in stack:
                    env.last_used = at

    def reset_counts(self) -> None:
        """Forget the invocations, cold starts and reclaims so far (the trace starts now)."""
        with self._lock:
            self.invocations.clear()
            self.cold_starts.clear()
            self.reclaimed.clear()
            self.throttled.clear()
            self.peak.clear()
            self.limit_reached = 0

    def close(self) -> None:
        """End every environment (idle ones; busy ones are ended by their invocation's end)."""
        self._stop.set()
        self._reaper.join()
        with self._lock:
            envs = [e for stack in self._idle.values() for e in stack]
            self._idle.clear()
        for env in envs:
            env.close()
