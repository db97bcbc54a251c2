"""Step functions of scheduling slots: free-GPU profiles and per-job GPU plans.

The deadline planners (ElasticFlow, EDF) look far ahead (deadlines days away are thousands of
slots), but what they read changes only where some job's plan starts, scales or ends. Keeping
just those breakpoints makes a profile as long as the number of jobs, not the horizon, and
makes adding or removing a plan a merge of two short sorted arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Steps"]


@dataclass(frozen=True)
class Steps:
    """`vals[i]` from slot `starts[i]` up to the next start; the last value holds forever.
    `starts[0]` is 0 (now). Adjacent equal values are merged, so every start is a change."""

    starts: np.ndarray
    vals: np.ndarray

    @classmethod
    def constant(cls, value: int) -> Steps:
        return cls(np.zeros(1, dtype=np.int64), np.full(1, value, dtype=np.int64))

    @classmethod
    def of(cls, starts: np.ndarray | list[int], vals: np.ndarray | list[int]) -> Steps:
        """From breakpoints in order (a later duplicate start wins), merged."""
        starts, vals = np.asarray(starts, dtype=np.int64), np.asarray(vals, dtype=np.int64)
        if starts.size > 1:
            last = np.empty(starts.size, dtype=bool)
            np.not_equal(starts[1:], starts[:-1], out=last[:-1])
            last[-1] = True
            starts, vals = starts[last], vals[last]
            keep = np.empty(vals.size, dtype=bool)
            keep[0] = True
            np.not_equal(vals[1:], vals[:-1], out=keep[1:])
            starts, vals = starts[keep], vals[keep]
        return cls(starts, vals)

    def at(self, slots: np.ndarray | int) -> np.ndarray:
        return self.vals[np.searchsorted(self.starts, slots, side="right") - 1]

    def plus(self, other: Steps, sign: int = 1) -> Steps:
        points = np.concatenate((self.starts, other.starts))
        points.sort()
        return Steps.of(points, self.at(points) + sign * other.at(points))

    def minus(self, other: Steps) -> Steps:
        return self.plus(other, -1)

    def breaks(self, lo: int, hi: float) -> np.ndarray:
        """`lo` and every change strictly inside (lo, hi): the starts of its periods there."""
        first = np.searchsorted(self.starts, lo, side="right")
        last = np.searchsorted(self.starts, hi, side="left")
        out = np.empty(max(last - first, 0) + 1, dtype=np.int64)
        out[0] = lo
        out[1:] = self.starts[first:last]
        return out
