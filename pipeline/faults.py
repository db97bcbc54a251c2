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
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field, fields

from ground.errors import UsageError

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
            UsageError: An unknown fault, a malformed item, or a rate outside [0, 1].
        """
        rates: dict[str, float] = {}
        for item in (spec or "").split(","):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in cls.names():
                raise UsageError(
                    f"--faults: '{item.strip()}' is not a fault=rate item.",
                    f"use items such as throttle=0.1, from: {', '.join(cls.names())}.",
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
