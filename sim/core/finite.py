"""The last line of defence for numbers: no NaN or infinity leaves in an exit-0 result.

Inputs are checked on load (finite, in range); should a combination of valid inputs still
produce a non-finite number (an overflow, a 0/0 in a model), the result is refused with the
path of the first offending key instead of printing `Infinity` into a summary.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sim.core.errors import MoesimError


def check_finite(value: Any, what: str) -> None:
    """MoesimError naming the first NaN or +-inf found in `value` (nested mappings,
    lists, tuples and numpy scalars/arrays); numbers kept as such elsewhere are fine."""
    bad = _first_bad(value, what)
    if bad is not None:
        path, x = bad
        raise MoesimError(
            f"{path} is {x}: the run produced a non-finite number (an input or model "
            "parameter out of a meaningful range?); nothing was reported as a result"
        )


def _first_bad(value: Any, path: str) -> tuple[str, float] | None:
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return where, v
        elif isinstance(v, Mapping):
            stack.extend((f"{where}.{k}", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
        elif hasattr(v, "tolist") and getattr(getattr(v, "dtype", None), "kind", "") in "fc":
            stack.append((where, v.tolist()))  # numpy scalars and arrays
    return None
