"""Faults injected into a local run: what AWS does to a workflow now and then, on purpose.

`moelambda run-local --faults throttle=0.1,s3-slowdown=0.05,expert-crash=0.02,duplicate=0.05`
draws, at each of those rates and from one seeded generator:

* throttle: an invocation is refused with Lambda's TooManyRequestsException (HTTP 429) before
  its function runs, as the Invoke API does; the state machine's Retry takes it again, and a
  direct gate's invoker retries it (`functions.config.retry_throttled`);
* s3-slowdown: an S3 request of a handler gets 503 SlowDown; botocore's adaptive retries in the
  handlers' client (`functions.common.s3_client`) send it again;
* expert-crash: an expert's process dies after its work, before it could return, as a timeout
  or an out-of-memory kill does; the request fails with that cause and the cleanup removes
  whatever the expert had written;
* duplicate: an invocation is delivered twice (at-least-once delivery); the handlers are
  idempotent, so the second delivery changes nothing.

A fault the plan gives nothing to apply to is refused before the run (`Faults.check_plan`):
expert-crash needs an expert function, which the fan-out workflow and a driver's remote experts
have and a one-function (monolithic) plan does not. The others apply to every shape: each has
an invoked function, and it reads its input from S3.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from ground.errors import UsageError

if TYPE_CHECKING:
    from ground.plan import Plan

__all__ = ["ExpertCrash", "Faults"]


class ExpertCrash(RuntimeError):
    """The injected death of an expert's process."""


@dataclass
class Faults:
    """Rates in [0, 1] of each fault, and the seeded generator every draw comes from."""

    throttle: float = 0.0
    s3_slowdown: float = 0.0
    expert_crash: float = 0.0
    duplicate: float = 0.0
    seed: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name.replace("_", "-") for f in fields(cls) if f.name not in _NOT_RATES]

    @classmethod
    def parse(cls, spec: str | None, seed: int = 0) -> Faults:
        """`name=rate,...` (names as in `names()`); an empty or missing spec injects nothing.

        Raises:
            UsageError: An unknown fault (the message lists the known ones), an item without
                `=`, or a rate outside [0, 1].
        """
        rates: dict[str, float] = {}
        known = ", ".join(cls.names())
        for item in (spec or "").split(","):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep:
                raise UsageError(
                    f"--faults: '{item.strip()}' is not a fault=rate item.",
                    f"write name=rate items such as throttle=0.1, the name one of: {known}.",
                )
            if name not in cls.names():
                raise UsageError(
                    f"--faults: unknown fault '{name}' (in '{item.strip()}'); the faults a "
                    f"local run injects are: {known}.",
                    f"name one of them, e.g. {cls.names()[0]}=0.1.",
                )
            try:
                rate = float(value)
            except ValueError:
                rate = -1.0
            if not 0.0 <= rate <= 1.0:
                raise UsageError(
                    f"--faults: the rate of {name} is '{value}', not a number in [0, 1].",
                    f"pass {name}=0.05 for 5% of the calls.",
                )
            rates[name.replace("-", "_")] = rate
        return cls(**rates, seed=seed)

    def check_plan(self, plan: Plan) -> None:
        """Refuse a fault with a non-zero rate that `plan`'s shape gives nothing to apply to.

        expert-crash kills an expert function's process: the fan-out workflow's expert
        functions and a driver's remote experts (it then applies to those); a one-function
        plan runs every expert inside its one function, so it cannot apply. Throttling,
        S3 SlowDown and duplicate delivery apply to every shape.

        Raises:
            UsageError: expert-crash on a plan with no expert function.
        """
        functions = sum(len(layer.experts) for layer in plan.layers)
        if self.expert_crash > 0 and functions == 0:
            raise UsageError(
                f"--faults expert-crash={self.expert_crash:g} cannot apply: this "
                f"{plan.deployment} plan has no expert function (its one function runs every "
                "expert in process), so no expert's process could die.",
                "drop expert-crash (throttle, s3-slowdown and duplicate apply to this plan), "
                "or run a plan whose experts are functions: `moelambda plan --deployment "
                "driver` or `--deployment workflow`.",
            )

    @property
    def any(self) -> bool:
        return any(getattr(self, name.replace("-", "_")) > 0 for name in self.names())

    def draw(self, name: str) -> bool:
        """True with the fault's rate (thread-safe); counts what it injected."""
        rate = getattr(self, name.replace("-", "_"))
        if rate <= 0.0:
            return False
        with self._lock:
            hit = self._rng.random() < rate
            if hit:
                self.injected[name] = self.injected.get(name, 0) + 1
        return hit


_NOT_RATES = {"seed", "injected", "_rng", "_lock"}
