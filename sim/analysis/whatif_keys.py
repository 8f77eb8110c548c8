"""`--set KEY=VALUE` for what-if studies: the keys, their values, absolute or relative (`*2`).

A value is a number (`4`, `1e-6`) or YAML (`zipf`, `[1, 2]`); `*k` multiplies the
base's value by k (`link.nvlink3.bw=*2`, `strategy.degree=*2`, `compute.speed=*0.5`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from sim.config.schema import ModelSpec
from sim.core.errors import ConfigError

KNOWN = (
    "topology",
    "nodes",
    "link.<class>.bw",
    "link.<class>.latency",
    "link.*.bw",
    "link.*.latency",
    "compute.speed",
    "model.<field>",
    "model.routing.s",
    "model.routing.<field>",
    "strategy",
    "strategy.<param>",
    "costs.<field>",
)
LINK_FIELDS = ("bw", "latency")


@dataclass(frozen=True)
class Change:
    key: str
    text: str  # the value as given
    value: Any  # parsed (None for a relative value)
    factor: float | None = None  # `*k`

    def number(self, old: Any, integer: bool = False) -> float | int:
        """The new value of a numeric field whose base value is `old`."""
        if self.factor is not None:
            if isinstance(old, bool) or not isinstance(old, (int, float)):
                raise ConfigError(
                    f"--set {self.key}={self.text}: relative, but the base has no number "
                    f"there (it has {old!r}); give an absolute value"
                )
            new = old * self.factor
        else:
            new = self.value
            if isinstance(new, bool) or not isinstance(new, (int, float)):
                raise ConfigError(f"--set {self.key}={self.text}: expected a number")
        if integer:
            if float(new) != int(new):
                raise ConfigError(f"--set {self.key}={self.text}: gives {new}, not an integer")
            return int(new)
        return new

    def plain(self, old: Any = None) -> Any:
        """The new value of any field: numbers may be relative, anything else absolute."""
        if self.factor is not None:
            return self.number(old, integer=isinstance(old, int) and not isinstance(old, bool))
        return self.value


def parse(sets: list[str]) -> list[Change]:
    out = []
    for item in sets or []:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (known keys: {known()})")
        key, text = (s.strip() for s in item.split("=", 1))
        check_key(key)
        if text.startswith("*"):
            try:
                factor = float(text[1:])
            except ValueError:
                raise ConfigError(f"--set {key}={text}: expected *<number>, e.g. *2") from None
            if not factor > 0:
                raise ConfigError(f"--set {key}={text}: the factor must be > 0")
            out.append(Change(key, text, None, factor))
            continue
        value = _read(text)
        if value is None:
            raise ConfigError(f"--set {key}=: expected a value")
        out.append(Change(key, text, value))
    return out


def known() -> str:
    return ", ".join(KNOWN)


def check_key(key: str) -> None:
    parts = key.split(".")
    ok = (
        key in ("topology", "nodes", "strategy", "compute.speed")
        or (parts[0] == "link" and len(parts) == 3 and parts[1] and parts[2] in LINK_FIELDS)
        or (parts[0] == "model" and len(parts) == 2 and parts[1] in ModelSpec.model_fields)
        or (parts[:2] == ["model", "routing"] and len(parts) == 3 and parts[2])
        or (parts[0] in ("strategy", "costs") and len(parts) == 2 and parts[1])
    )
    if not ok:
        raise ConfigError(f"--set {key}: unknown key (known: {known()})")


def _read(text: str) -> Any:
    """A number as Python reads it (YAML takes 6e11 for a string), anything else as YAML."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text
