"""A strategy's parameters with every `auto` replaced by what its selector chose.

Each strategy with `auto` parameters has a `resolve(layer, params, passes, cluster)` beside its
builder; the builder builds from it and `sim.strategies.resolve_auto` returns it to others
(the executor runs the parameters the simulator would have built with, on the same cluster).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Resolved:
    """A strategy's parameters as its builder resolved them (every `auto` chosen)."""

    params: dict[str, Any]  # every parameter, `auto` ones replaced by the value chosen
    chosen: dict[str, Any] = field(default_factory=dict)  # parameter -> value, where auto
    info: dict[str, Any] = field(default_factory=dict)  # what the selector saw (meta.selector)

    def describe(self) -> list[str]:
        """One line per auto parameter: 'degree: auto -> 4 (selector: theorem1, case t3, ...)'."""
        return [f"{k}: auto -> {_value(v)} ({self.selector()})" for k, v in self.chosen.items()]

    def selector(self) -> str:
        i = self.info
        name = i.get("selector") or i.get("router") or "?"
        parts = [f"selector: {name}"]
        for k, v in i.items():
            if k in ("selector", "router") or k in self.chosen:
                continue
            if isinstance(v, float):
                parts.append(f"{k[:-2]} {v * 1e3:.4g} ms" if k.endswith("_s") else f"{k} {v:.4g}")
            elif isinstance(v, (str, int)):
                parts.append(f"{k} {v}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"params": self.params, "auto": self.chosen, "selector": self.info}


def _value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)
