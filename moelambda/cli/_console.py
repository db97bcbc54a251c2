"""The consoles every command prints on: its summary on stdout, progress and messages on stderr.

When a stream is not a terminal (a pipe, a file, a CI log) the summary is not cut to 80 columns,
`--help` is `HELP_PIPE_WIDTH` wide (`widen_piped_help`), and progress is plain lines with the
seconds elapsed, not a spinner that leaves blank lines.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import Any

from rich.console import Console, ConsoleDimensions

__all__ = ["PlainProgress", "PlainStatus", "err", "progress", "stdout", "widen_piped_help"]

# Width of a summary written to a pipe or a file: no table is cut (rich's default is 80
# columns, or the width of whichever standard stream is a terminal).
PIPE_WIDTH = 400
# Width of `--help` written to a pipe or a file (rich's default is 80 columns): typer's help
# panels fill the console's width, so not `PIPE_WIDTH`; at this width the docstrings' lines
# (at most 99 columns) are not folded and most options' help fits on one line.
HELP_PIPE_WIDTH = 160
HEARTBEAT_S = 15.0  # a plain-line status says it is still at work this often


class _Console(Console):
    """A rich console that is as wide as the terminal, or `PIPE_WIDTH` when its stream is not
    a terminal (and $COLUMNS is unset), and whose `status` is plain lines with elapsed time
    when its stream is not a terminal (a spinner would only leave blank lines in a log)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        if self.is_terminal or self._width is not None or "COLUMNS" in os.environ:
            return size  # type: ignore[no-any-return]
        return ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def status(self, status: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if self.is_terminal:
            return super().status(status, **kwargs)
        return PlainStatus(self, str(status))


class PlainStatus:
    """`Console.status` for a log: a line when the work starts, one per new message, one every
    `HEARTBEAT_S` seconds of silence, and one when it ends, each with the seconds elapsed."""

    def __init__(self, console: Console, message: str) -> None:
        self.console, self.message, self.last = console, message, message
        self.started = time.perf_counter()
        self.printed = self.started
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._heartbeat, daemon=True)

    def _line(self, text: str) -> None:
        with self.lock:
            now = time.perf_counter()
            self.printed = now
            self.console.print(
                f"[{now - self.started:6.1f} s] {text}", highlight=False, markup=False
            )

    def _heartbeat(self) -> None:
        while not self.stop.wait(1.0):
            if time.perf_counter() - self.printed >= HEARTBEAT_S:
                self._line(f"{self.last} (still at work)")

    def update(self, status: Any = None, **_: Any) -> None:
        """Print `status` if it is a new message."""
        if status is not None and str(status) != self.last:
            self.last = str(status)
            self._line(self.last)

    def __enter__(self) -> PlainStatus:
        self._line(f"{self.message} ...")
        self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop.set()
        self.thread.join()
        self._line(f"{self.message}: {'done' if kind is None else 'stopped'}")


class PlainProgress:
    """The part of `rich.progress.Progress` the commands use, as plain lines for a log: one
    line when a task starts, then at most one every few seconds, and one when it ends."""

    EVERY_S = 5.0

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.perf_counter()
        self.tasks: dict[int, dict[str, Any]] = {}

    def _line(self, task: dict[str, Any]) -> None:
        now = time.perf_counter()
        task["printed"] = now
        total = "" if task["total"] is None else f"/{task['total']:,}"
        done = f": {task['completed']:,}{total}" if task["completed"] or task["total"] else ""
        self.console.print(
            f"[{now - self.started:6.1f} s] {task['description']}{done}",
            highlight=False,
            markup=False,
        )

    def add_task(self, description: str, total: float | None = 100.0, **_: Any) -> int:
        """A new task, announced at once; returns its id."""
        task_id = len(self.tasks)
        total = None if total is None else int(total)
        self.tasks[task_id] = {"description": description, "total": total, "completed": 0}
        self._line(self.tasks[task_id])
        return task_id

    def update(
        self,
        task_id: int,
        *,
        completed: float | None = None,
        total: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **_: Any,
    ) -> None:
        """Record progress; print it when a few seconds passed or the task finished."""
        task = self.tasks[task_id]
        if total is not None:
            task["total"] = int(total)
        if completed is not None:
            task["completed"] = int(completed)
        if advance is not None:
            task["completed"] += int(advance)
        if description is not None:
            task["description"] = description
        finished = task["total"] is not None and task["completed"] >= task["total"]
        if finished and not task.get("finished"):
            task["finished"] = True
            self._line(task)
        elif time.perf_counter() - task["printed"] >= self.EVERY_S:
            self._line(task)

    def advance(self, task_id: int, advance: float = 1) -> None:
        """Add `advance` to the task's completed count."""
        self.update(task_id, advance=advance)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: object) -> None:
        for task in self.tasks.values():
            if not task.get("finished"):
                self._line(task)


def progress(*columns: Any, **kwargs: Any) -> Any:
    """A rich progress bar on stderr (transient), or `PlainProgress` lines when stderr is not a
    terminal. Takes `rich.progress.Progress`'s columns and keyword arguments."""
    if not err.is_terminal:
        return PlainProgress(err)
    from rich.progress import Progress

    return Progress(*columns, console=err, transient=True, **kwargs)


def stdout() -> Console:
    """The console a command's readable summary goes to (stdout): the terminal's width, or wide
    enough that no table is cut when stdout is a pipe or a file."""
    return _Console()


err = _Console(stderr=True)


def widen_piped_help() -> None:
    """Print typer's `--help` (and its usage errors) `HELP_PIPE_WIDTH` wide when stdout is not a
    terminal, unless $COLUMNS or $TERMINAL_WIDTH sets the width."""
    from typer import rich_utils

    piped = not (sys.stdout is not None and sys.stdout.isatty())
    if piped and rich_utils.MAX_WIDTH is None and "COLUMNS" not in os.environ:
        rich_utils.MAX_WIDTH = HELP_PIPE_WIDTH
