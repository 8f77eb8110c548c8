"""Trace times as integer nanoseconds, and back to the microsecond numbers of a Chrome trace.

Every time in an exported trace goes through `to_ns` once; durations are differences of the
integers. `us` writes them as `ns / 1000`: Python's shortest repr of the double nearest that
value, which for any time below 2**43 us (about 100 days) is its exact decimal, e.g. 1234.567,
1234.5 or 1234.0. Perfetto reads such a number back as exactly `ns`, whether it rounds
`value * 1000` or shifts the decimal point of the text.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_ns(seconds: Any) -> np.ndarray:
    """Seconds as integer nanoseconds (the one rounding every time in a trace goes through)."""
    return np.rint(np.asarray(seconds, dtype=float) * 1e9).astype(np.int64)


def us(ns: Any) -> list[Any]:
    """Integer nanoseconds as the microsecond numbers a trace holds (nested lists for an
    array of more than one dimension)."""
    return (np.asarray(ns, dtype=np.int64).astype(float) / 1000.0).tolist()
