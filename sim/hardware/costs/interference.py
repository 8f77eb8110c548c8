"""Interference between streams on one GPU (MPipeMoE Sec. II-C, Fig. 3).

The table gives the relative speed (<= 1) of a stream kind while a given set of other stream
kinds is busy on the same GPU, keyed by the '+'-joined sorted names of that set
("comm", "copy", "comm+copy"). Missing entries mean no slowdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError

KINDS = ("compute", "comm", "copy")


@dataclass
class Interference:
    """Relative speed of a stream kind while other kinds are busy on its GPU."""

    table: dict[str, dict[frozenset[str], float]]

    @classmethod
    def from_table(cls, raw: dict[str, Any]) -> Interference:
        table: dict[str, dict[frozenset[str], float]] = {}
        for kind, row in raw.items():
            if kind not in KINDS:
                raise ConfigError(f"interference: unknown stream kind {kind!r} (known: {KINDS})")
            entries = {}
            for key, speed in (row or {}).items():
                others = frozenset(key.split("+"))
                if not others <= set(KINDS) or kind in others:
                    raise ConfigError(f"interference.{kind}.{key}: names unknown stream kinds")
                speed = float(speed)
                if not 0 < speed <= 1:
                    raise ConfigError(f"interference.{kind}.{key}: speed must be in (0, 1]")
                entries[others] = speed
            table[kind] = entries
        return cls(table)

    @property
    def trivial(self) -> bool:
        return all(v == 1.0 for row in self.table.values() for v in row.values())

    def affects(self, kind: str) -> bool:
        return any(v != 1.0 for v in self.table.get(kind, {}).values())

    def speed(self, kind: str, busy_others: frozenset[str]) -> float:
        if not busy_others:
            return 1.0
        return self.table.get(kind, {}).get(busy_others, 1.0)
