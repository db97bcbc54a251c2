"""How a long call shows its progress: a `Status` wraps each slow step.

A call that takes `status` enters `status(message)` around a slow step and calls `update(text)`
on what it yields as the step advances; the command line passes its console's spinner
(`err.status`), a notebook or a test the default, `quiet`, which shows nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["Status", "quiet"]

Status = Callable[[str], AbstractContextManager[Any]]


class _Silent:
    def update(self, status: Any = None, **_: Any) -> None:
        """Show nothing."""


def quiet(message: str) -> AbstractContextManager[Any]:
    """A `Status` that shows nothing."""
    return nullcontext(_Silent())
