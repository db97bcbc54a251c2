"""Errors a user can act on.

Every error the user can cause or fix derives from `MoelambdaError`. The CLI turns one into a
message on stderr and exit code 2, without a traceback, so messages must say what went wrong and
end with what to do about it ("To fix: ...").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "CalibrationError",
    "CorpusError",
    "InfeasibleError",
    "ModelError",
    "MoelambdaError",
    "OutputExistsError",
    "TraceError",
    "UsageError",
    "did_you_mean",
]


class MoelambdaError(Exception):
    """Base of every error the user can act on; the CLI maps it to exit code 2."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\nTo fix: {fix}")


class UsageError(MoelambdaError):
    """An argument is out of range or inconsistent with another one."""


class ModelError(MoelambdaError):
    """The model cannot be found, loaded or turned into a Mixture-of-Experts model."""


class CorpusError(MoelambdaError):
    """The text to profile on is missing, empty or unreadable."""


class TraceError(MoelambdaError):
    """A routing-trace file is missing, corrupt or of an unknown version."""


class CalibrationError(MoelambdaError):
    """The calibration file is missing a value or holds one out of range."""


class InfeasibleError(MoelambdaError):
    """No plan meets the constraints (the SLO, a limit, or a confidence level).

    `smallest_slo_s`, when latency is what binds, is the smallest SLO a plan meets.
    """

    def __init__(
        self, problem: str, fix: str | None = None, *, smallest_slo_s: float | None = None
    ) -> None:
        super().__init__(problem, fix)
        self.smallest_slo_s = smallest_slo_s


class OutputExistsError(MoelambdaError):
    """The output path already holds data that the command would overwrite."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A ' Did you mean X?' suffix for an unknown name, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""
