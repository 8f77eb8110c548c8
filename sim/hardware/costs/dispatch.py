"""Dispatch latency: the time between a task becoming ready and it starting to run.

Two cases differ by an order of magnitude on real runtimes, so they are separate parameters:
- `stream`: the stream's previous task just finished and this one was already free to go
  (the issuing thread moves on: a CUDA kernel launch gap, or a Python loop iteration);
- `cross`: the task waited on a task of another stream, and that one just finished (an event
  wait on a GPU; on the CPU executor a sleeping worker thread has to be woken and scheduled,
  tens to hundreds of microseconds on a busy host).

Both default to 0 (the ideal engine); a calibration measures them (exec.measure.microbench).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sim.core.errors import ConfigError

FIELDS = ("stream", "cross")


@dataclass(frozen=True)
class Dispatch:
    """Ready to running: after its stream's last task, and after another stream's."""

    stream: float = 0.0
    cross: float = 0.0

    @classmethod
    def from_spec(cls, raw: Any, where: str = "costs.dispatch") -> Dispatch:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping with keys {FIELDS}, got {raw!r}")
        unknown = set(raw) - set(FIELDS)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)} (known: {FIELDS})")
        vals = {}
        for k, v in raw.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ConfigError(f"{where}.{k}: expected seconds in [0, 1), got {v!r}")
            vals[k] = float(v)
        return cls(**vals)

    def overlay(self, raw: Any, where: str = "costs.dispatch") -> Dispatch:
        """These values with the fields `raw` gives replaced (a config over a topology)."""
        given = Dispatch.from_spec(raw, where)
        return replace(self, **{k: getattr(given, k) for k in raw})
