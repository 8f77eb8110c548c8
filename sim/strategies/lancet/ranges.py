"""Lancet's partition-range selection (Sec. 5.1) and its pipeline cost simulation (Sec. 5.3).

The forward pass is a sequence of instructions I_0 .. I_{N-1}. T(n), the best time of the
first n, is min over i of T(i) + S(i, n), where S(i, n) is the time of I_i .. I_{n-1} as one
segment: partitioned k ways and pipelined (P(i, n, k), from `pipeline_time`), or a single
instruction left whole. Invalid segments cost infinity (the caller's P says which: a segment
cutting an all-to-all's MoE layer in two, a gate that may not be partitioned, ...). The
search is over segments at most `max_len` long (the paper's range limit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def pipeline_time(kinds: Sequence[bool], durations: Sequence[Sequence[float]]) -> float:
    """End of the last of the partitioned instructions (`kinds[m]`: True where I_m is
    communication; `durations[m][j]`: I_m's partition j). Consecutive instructions of one kind
    form a stage; a stage runs its partitions in index order on its stream (compute or
    communication); an instruction starts when its partition's previous instruction and the
    previous one on its stream have ended (the paper's stage schedule, Fig. 9)."""
    if not kinds:
        return 0.0
    k = len(durations[0])
    stages: list[tuple[bool, list[float]]] = []
    for comm, d in zip(kinds, durations, strict=True):
        if stages and stages[-1][0] == comm:
            stages[-1] = (comm, [a + b for a, b in zip(stages[-1][1], d, strict=True)])
        else:
            stages.append((comm, list(d)))
    ready = [0.0] * k  # when partition j's previous stage ended
    free = {False: 0.0, True: 0.0}  # when each stream is next free
    for comm, d in stages:
        for j in range(k):
            end = max(ready[j], free[comm]) + d[j]
            ready[j] = free[comm] = end
    return max(ready)


def best_segments(
    n: int, segment: Callable[[int, int], float], max_len: int | None = None
) -> tuple[float, list[tuple[int, int]]]:
    """min over segmentations of I_0 .. I_{n-1} of the sum of `segment(i, m)` (the time of
    I_i .. I_{m-1}); returns it and the segments [(i, m)] in order."""
    best = [0.0] + [math.inf] * n
    back = [0] * (n + 1)
    for m in range(1, n + 1):
        lo = 0 if max_len is None else max(0, m - max_len)
        for i in range(lo, m):
            if best[i] == math.inf:
                continue
            t = best[i] + segment(i, m)
            if t < best[m]:
                best[m], back[m] = t, i
    if best[n] == math.inf:
        return math.inf, []
    segs = []
    m = n
    while m > 0:
        segs.append((back[m], m))
        m = back[m]
    return best[n], segs[::-1]
