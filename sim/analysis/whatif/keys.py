"""`--set KEY=VALUE` for what-if studies: the keys, their values, absolute or relative (`*2`).

A value is a number (`4`, `1e-6`) or YAML (`zipf`, `[1, 2]`); `*k` multiplies the
base's value by k (`link.nvlink3.bw=*2`, `strategy.degree=*2`, `compute.speed=*0.5`).
`host.speed` (the host's CPU ops of a measured trace, apart from the device's compute) applies
to trace bases only.
`apply` puts changes into a run config; sweeps (`sim.analysis.sweep.spec`) vary the same keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from sim.config import RunConfig
from sim.config.model_schema import ModelSpec
from sim.config.run_schema import FabricSpec, ParallelSpec
from sim.core.errors import ConfigError
from sim.strategies import resolve_params

KNOWN = (
    "topology",
    "nodes",
    "link.<class>.bw",
    "link.<class>.latency",
    "link.*.bw",
    "link.*.latency",
    "compute.speed",
    "host.speed",
    "model.<field>",
    "model.routing.s",
    "model.routing.<field>",
    "fabric.<field>",
    "parallel.<field>",
    "strategy",
    "strategy.<param>",
    "costs.<field>",
    "costs.resources.<field>",
)
LINK_FIELDS = ("bw", "latency")
# `*k` factors and compute speeds past these are nonsense, not studies: compute.speed=*1e-300
# gives a 300-digit makespan in which communication vanishes, compute.speed=inf free compute
FACTOR_RANGE = (1e-6, 1e6)
SPEED_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class Change:
    key: str
    text: str  # the value as given
    value: Any  # parsed (None for a relative value)
    factor: float | None = None  # `*k`
    where: str = "--set"  # how errors name where the change came from

    def number(self, old: Any, integer: bool = False) -> float | int:
        """The new value of a numeric field whose base value is `old`."""
        if self.factor is not None:
            if isinstance(old, bool) or not isinstance(old, (int, float)):
                raise ConfigError(
                    f"{self.where} {self.key}={self.text}: relative, but the base has no number "
                    f"there (it has {old!r}); give an absolute value"
                )
            new = old * self.factor
        else:
            new = self.value
            if isinstance(new, bool) or not isinstance(new, (int, float)):
                raise ConfigError(f"{self.where} {self.key}={self.text}: expected a number")
        if not math.isfinite(new):  # 1e400 reads as inf; int(inf) / int(nan) would raise
            raise ConfigError(f"{self.where} {self.key}={self.text}: expected a finite number")
        if integer:
            if float(new) != int(new):
                raise ConfigError(
                    f"{self.where} {self.key}={self.text}: gives {new}, not an integer"
                )
            return int(new)
        return new

    def nodes(self, old: Any) -> int:
        """The new node count (base `old`): a positive integer, also where a graph base
        would read 0 as "enough nodes"."""
        n = int(self.number(old, integer=True))
        if n < 1:
            raise ConfigError(f"{self.where} {self.key}={self.text}: gives {n}, need >= 1")
        return n

    def speed(self) -> float:
        """The compute speed factor (base 1), within SPEED_RANGE."""
        new = float(self.number(1.0))
        lo, hi = SPEED_RANGE
        if not lo <= new <= hi:
            raise ConfigError(
                f"{self.where} {self.key}={self.text}: gives a speed of {new:g}; expected a "
                f"factor from {lo:g} to {hi:g}"
            )
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
        if not text.startswith("*") and _read(text) is None:
            raise ConfigError(f"--set {key}=: expected a value")
        out.append(change(key, text if text.startswith("*") else _read(text), text))
    return out


def change(key: str, value: Any, text: str | None = None, where: str = "--set") -> Change:
    """A change of `key` to `value` (already parsed; a string `*k` is relative). The key is
    checked by the caller (`check_key`)."""
    text = str(value) if text is None else text
    if isinstance(value, str) and value.startswith("*"):
        try:
            factor = float(value[1:])
        except ValueError:
            raise ConfigError(f"{where} {key}={value}: expected *<number>, e.g. *2") from None
        lo, hi = FACTOR_RANGE
        if not lo <= factor <= hi:  # also nan and inf
            raise ConfigError(f"{where} {key}={value}: the factor must be from {lo:g} to {hi:g}")
        return Change(key, value, None, factor, where)
    if isinstance(value, float) and not math.isfinite(value):  # no key takes inf or nan
        raise ConfigError(f"{where} {key}={text}: expected a finite number")
    return Change(key, text, value, None, where)


def known() -> str:
    return ", ".join(KNOWN)


def check_key(key: str, where: str = "--set") -> None:
    parts = key.split(".")
    fabric = {f.alias or n for n, f in FabricSpec.model_fields.items()}
    ok = (
        key in ("topology", "nodes", "strategy", "compute.speed", "host.speed")
        or (parts[0] == "link" and len(parts) == 3 and parts[1] and parts[2] in LINK_FIELDS)
        or (parts[0] == "model" and len(parts) == 2 and parts[1] in ModelSpec.model_fields)
        or (parts[:2] == ["model", "routing"] and len(parts) == 3 and parts[2])
        or (parts[0] == "fabric" and len(parts) == 2 and parts[1] in fabric)
        or (parts[0] == "parallel" and len(parts) == 2 and parts[1] in ParallelSpec.model_fields)
        or (parts[0] in ("strategy", "costs") and len(parts) == 2 and parts[1])
        or (parts[:2] == ["costs", "resources"] and len(parts) == 3 and parts[2])
    )
    if not ok:
        raise ConfigError(f"{where} {key}: unknown key (known: {known()})")


@dataclass(frozen=True)
class Applied:
    """A run config's raw mapping with the changes applied, and what is not a config field:
    link classes changed on the loaded topology and the compute speed factor."""

    raw: dict[str, Any]
    links: list[Change]
    speed: float


def apply(cfg: RunConfig, changes: list[Change], notes: list[str]) -> Applied:
    """`changes` applied to `cfg` (not validated: `RunConfig.from_dict(result.raw)` does)."""
    raw = cfg.to_dict()
    links: list[Change] = []
    speed = 1.0
    # the strategy first, so that its parameters apply to the new one
    for c in sorted(changes, key=lambda c: c.key != "strategy"):
        k, field = c.key, c.key.split(".", 1)[-1]
        if k == "topology":
            raw["topology"] = str(c.value)
        elif k == "nodes":
            # the schema names a count under 1 (a graph base checks it: `Change.nodes`)
            raw["nodes"] = c.number(raw.get("nodes") or cfg.load_topology().nodes, integer=True)
        elif k == "strategy":
            raw["strategy"] = _strategy(c)
        elif k.startswith("strategy."):
            s = raw["strategy"]
            full = resolve_params(s["name"], {p: v for p, v in s.items() if p != "name"})
            s[field] = c.plain(full.get(field))
        elif k.startswith("model.routing."):
            raw["model"]["routing"] = _routing(raw["model"].get("routing"), c, notes)
        elif k.startswith("costs."):
            raw["costs"] = set_cost(raw.get("costs"), c)
        elif k.startswith(("model.", "fabric.", "parallel.")):
            section = dict(raw.get(k.split(".")[0]) or {})
            section[field] = c.plain(section.get(field))
            raw[k.split(".")[0]] = section
        elif k.startswith("link."):
            links.append(c)
        elif k == "compute.speed":
            speed = c.speed()
        elif k == "host.speed":
            raise ConfigError(
                f"{c.where} host.speed: scales the host's (CPU) ops of a measured trace; a run "
                "config simulates no host ops (compute.speed scales its compute)"
            )
    return Applied(raw, links, speed)


def set_cost(costs: dict[str, Any] | None, c: Change) -> dict[str, Any]:
    """A run's `costs` mapping with `costs.<field>` or `costs.resources.<field>` changed."""
    out = dict(costs or {})
    parts = c.key.split(".")
    if parts[1] == "resources" and len(parts) == 3:  # the GPU's SMs, queues, launches
        res = dict(out.get("resources") or {})
        res[parts[2]] = c.plain(res.get(parts[2]))
        out["resources"] = res
    else:
        out[parts[1]] = c.plain(out.get(parts[1]))
    return out


def _strategy(c: Change) -> dict[str, Any]:
    """`pipelined`, `pipelined:degree=4` (as `moesim compare --strategies`) or a mapping
    `{name: pipelined, degree: 4}`."""
    from sim.analysis.compare import parse_entry

    v = c.value
    if isinstance(v, dict):
        if not isinstance(v.get("name"), str):
            raise ConfigError(f"{c.where} strategy={c.text}: a mapping needs a 'name'")
        return dict(v)
    if not isinstance(v, str):
        raise ConfigError(f"{c.where} strategy={c.text}: expected name[:k=v,...] or a mapping")
    name, params = parse_entry(v)
    return {"name": name, **params}


def _routing(routing: Any, c: Change, notes: list[str]) -> dict[str, Any]:
    r = {"kind": routing} if isinstance(routing, str) else dict(routing or {"kind": "uniform"})
    field = c.key.rsplit(".", 1)[1]
    if field == "s" and r.get("kind") == "uniform":
        r = {"kind": "zipf", "seed": 0}
        notes.append("model.routing: uniform switched to zipf (seed 0) to take a skew s")
    r[field] = c.plain(r.get(field))
    return r


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
