"""Metering a conversion: its wall time and the process's peak resident memory while it ran.

Peak memory is sampled (`SAMPLE_S`) from the process's resident set, not read from
``ru_maxrss``: that is the peak of the whole process's life, and a command that converts several
options in turn (`choose`, `bench quality`) would report the largest so far for each.

Its own module, apart from what a conversion costs (`moe._meter`), because building a model runs
the meter while the cost of an option reads the model cache, which builds models.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import psutil

__all__ = ["ConversionMeter"]

SAMPLE_S = 0.2


class ConversionMeter:
    """Meter a block: `seconds` (plus `earlier_s`, time spent before a resume) and
    `peak_rss_mib`, the largest resident set sampled while it ran."""

    def __init__(self, earlier_s: float = 0.0) -> None:
        self.earlier_s = earlier_s
        self.seconds = 0.0
        self.peak_rss_mib = 0.0
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()

    def _sample(self) -> None:
        rss = self._process.memory_info().rss / 2**20
        self.peak_rss_mib = max(self.peak_rss_mib, rss)

    def _watch(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def __enter__(self) -> ConversionMeter:
        self._started = time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._watch, name="conversion-meter", daemon=True)
        self._thread.start()
        return self

    def elapsed(self) -> float:
        """Seconds so far, the time before a resume included."""
        return self.earlier_s + time.perf_counter() - self._started

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self.seconds = self.elapsed()
