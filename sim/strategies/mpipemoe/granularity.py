"""MPipeMoE's adaptive pipeline granularity search (paper 001, Sec. III-C, Algorithm 1).

The batch of tokens B a GPU dispatches changes from iteration to iteration; each B needs its
number of micro-batches n, found by trials (`searchBestGran`: run the step at several n and
keep the fastest). Algorithm 1 cuts the trials with the hypothesis that the best n grows
monotonically with B: the B seen so far form disjoint ranges R_n, one per n, ordered like n.

    get(B):  B cached                 -> its n                       (lines 3-5)
             B inside some R_n        -> that n, no trial            (line 6)
             otherwise                -> trials (line 8), then B opens R_n = [B, B] or
                                         widens the existing R_n to reach it (lines 9-15)
             cache[B] = n                                            (line 17)

The trials themselves use the hypothesis too (as the authors' code does): a B between R_a
(below) and R_b (above) only tries a <= n <= b, so the ranges stay ordered and disjoint. The
ranges live in a sorted list searched by bisection (the paper's binary search tree: O(log k)
lookups). What a trial costs is the caller's: `trial(B, n)` returns the step time.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.core.errors import ConfigError


@dataclass
class Range:
    lo: int
    hi: int
    n: int


class GranularitySearch:
    def __init__(self, trial: Callable[[int, int], float], candidates: Sequence[int]):
        cands = sorted(set(candidates))
        if not cands or any(not isinstance(n, int) or n < 1 for n in cands):
            raise ConfigError(
                f"granularity search: candidates must be positive integers, got {candidates!r}"
            )
        self.trial = trial
        self.candidates = cands
        self.ranges: list[Range] = []  # sorted by lo; n increases along the list
        self.cache: dict[int, int] = {}
        self.trials: list[tuple[int, int, float]] = []  # (B, n, time) of every trial run

    def get(self, B: int) -> int:
        if B in self.cache:
            return self.cache[B]
        i = self._find(B)
        if i is not None:
            n = self.ranges[i].n
        else:
            n = self._search(B)
            self._insert(B, n)
        self.cache[B] = n
        return n

    def _find(self, B: int) -> int | None:
        """Index of the range containing B, or None."""
        i = bisect.bisect_right([r.lo for r in self.ranges], B) - 1
        if i >= 0 and self.ranges[i].lo <= B <= self.ranges[i].hi:
            return i
        return None

    def bounds(self, B: int) -> tuple[int, int]:
        """The n the ranges around B allow (by monotonicity) for a B in none of them."""
        i = bisect.bisect_right([r.lo for r in self.ranges], B) - 1
        low = self.ranges[i].n if i >= 0 else self.candidates[0]
        high = self.ranges[i + 1].n if i + 1 < len(self.ranges) else self.candidates[-1]
        return low, high

    def _search(self, B: int) -> int:
        """searchBestGran(B): a trial per allowed n; ties keep the smaller n."""
        low, high = self.bounds(B)
        best: tuple[float, int] | None = None
        for n in self.candidates:
            if low <= n <= high:
                t = self.trial(B, n)
                self.trials.append((B, n, t))
                if best is None or t < best[0]:
                    best = (t, n)
        assert best is not None  # low and high are candidates
        return best[1]

    def _insert(self, B: int, n: int) -> None:
        for r in self.ranges:
            if r.n == n:  # widen R_n to reach B (lines 13-15)
                r.lo, r.hi = min(r.lo, B), max(r.hi, B)
                return
        bisect.insort(self.ranges, Range(B, B, n), key=lambda r: r.lo)  # lines 10-12
