"""Step functions of scheduling slots: free-GPU profiles and per-job GPU plans.

The deadline planners (ElasticFlow, EDF) look far ahead (deadlines days away are thousands of
slots), but what they read changes only where some job's plan starts, scales or ends. Keeping
just those breakpoints makes a profile as long as the number of jobs, not the horizon, and
adding or removing a plan a merge of two short sorted lists. They stay plain lists: a profile
holds a few dozen breakpoints, where numpy's per-call cost outweighs its speed (ElasticFlow
merges and plans on them about 60,000 times on the 195-job trace).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

__all__ = ["Steps"]


class Steps:
    """`vals[i]` from slot `starts[i]` up to the next start; the last value holds forever.
    `starts[0]` is 0 (now). Adjacent equal values are merged, so every start is a change."""

    __slots__ = ("starts", "vals")

    def __init__(self, starts: list[int], vals: list[int]) -> None:
        self.starts, self.vals = starts, vals

    @classmethod
    def constant(cls, value: int) -> Steps:
        return cls([0], [value])

    @classmethod
    def of(cls, starts: Iterable[int], vals: Iterable[int]) -> Steps:
        """From breakpoints in order (a later duplicate start wins), merged."""
        out_s: list[int] = []
        out_v: list[int] = []
        for s, v in zip(starts, vals, strict=True):
            if out_s and out_s[-1] == s:
                out_s.pop()
                out_v.pop()
            if out_v and out_v[-1] == v:
                continue
            out_s.append(int(s))
            out_v.append(int(v))
        return cls(out_s, out_v)

    def at(self, slot: float) -> int:
        return self.vals[bisect_right(self.starts, slot) - 1]

    def values(self, slots: Iterable[float]) -> list[int]:
        return [self.at(s) for s in slots]

    def plus(self, other: Steps, sign: int = 1) -> Steps:
        """The pointwise sum (or difference): one walk over both breakpoint lists."""
        a_s, a_v, b_s, b_v = self.starts, self.vals, other.starts, other.vals
        i = j = 0
        out_s: list[int] = []
        out_v: list[int] = []
        while i < len(a_s) or j < len(b_s):
            if j == len(b_s) or (i < len(a_s) and a_s[i] < b_s[j]):
                point = a_s[i]
                i += 1
            elif i == len(a_s) or b_s[j] < a_s[i]:
                point = b_s[j]
                j += 1
            else:
                point = a_s[i]
                i += 1
                j += 1
            value = a_v[i - 1] + sign * b_v[j - 1]  # both start at slot 0
            if out_v and out_v[-1] == value:
                continue
            out_s.append(point)
            out_v.append(value)
        return Steps(out_s, out_v)

    def minus(self, other: Steps) -> Steps:
        return self.plus(other, -1)

    def breaks(self, lo: int, hi: float) -> list[int]:
        """`lo` and every change strictly inside (lo, hi): the starts of its periods there."""
        first = bisect_right(self.starts, lo)
        last = first
        while last < len(self.starts) and self.starts[last] < hi:
            last += 1
        return [lo, *self.starts[first:last]]

    def __repr__(self) -> str:
        return f"Steps({self.starts}, {self.vals})"
