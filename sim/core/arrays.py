"""Sorted distinct values of integer and float arrays, as `np.unique` gives them.

Why not `np.unique` itself: its plain form (no return_index/inverse/counts) asks
`np.ma.is_masked`, which imports numpy.ma on numpy >= 2.3: ~10 ms of CPU, a twentieth of a
small `moesim simulate`, for arrays that are never masked. These sort and mask instead; on
the arrays the simulator has (ranks, slots, latencies: never NaN) they return what
`np.unique` returns, element for element and of the same dtype.
"""

from __future__ import annotations

import numpy as np


def distinct(x: np.ndarray) -> np.ndarray:
    """The distinct values of `x` (flattened), sorted: `np.unique(x)`."""
    s = np.sort(x, axis=None)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def distinct_rows(x: np.ndarray) -> np.ndarray:
    """The distinct rows of the 2-D array `x`, in lexicographic order: `np.unique(x,
    axis=0)`."""
    if len(x) < 2:
        return x.copy()
    s = x[np.lexsort(x.T[::-1])]
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.any(s[1:] != s[:-1], axis=1, out=keep[1:])
    return s[keep]
