"""Reading a topology: the YAML file of a preset or a path, and the checks of its fields that
do not need the node's routes (link classes, link entries, required fields).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import TopologyError, yaml_problem

DEVICE_TYPES = ("nvswitch", "pcie_switch", "host", "nic")


def topologies_dir() -> Path:
    env = os.environ.get("MOESIM_TOPOLOGIES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "topologies"


def list_presets() -> list[str]:
    return sorted(p.stem for p in topologies_dir().glob("*.yaml"))


def read_spec(
    name_or_path: str | Path, fabric: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """The spec of a preset name or YAML path, and where it came from; `fabric` overrides
    fields of its fabric section (e.g. {"type": "fat_tree", "nodes_per_leaf": 4})."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = topologies_dir() / f"{name_or_path}.yaml"
    if not p.is_file():
        raise TopologyError(
            f"unknown topology {str(name_or_path)!r}: no preset of that name "
            f"(presets: {', '.join(list_presets())}) and no such YAML file"
        )
    try:
        spec = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise TopologyError(f"topology file {p}: not valid YAML ({yaml_problem(e)})") from None
    if not isinstance(spec, dict):
        raise TopologyError(f"topology file {p}: expected a mapping at top level")
    if fabric:
        if not isinstance(fabric, dict):
            raise TopologyError("fabric overrides: expected a mapping")
        if not isinstance(spec.get("fabric"), dict):
            raise TopologyError(f"{spec.get('name', p)}: has no fabric to override")
        spec["fabric"] = {**spec["fabric"], **fabric}
    return spec, str(p)


@dataclass(frozen=True)
class LinkClass:
    name: str
    bw: float  # bytes/s per direction (line rate)
    latency: float  # s
    efficiency: float  # share of line rate a large transfer achieves
    msg_cost: float = 0.0  # s a message occupies the link before its payload (message rate)

    @property
    def eff_bw(self) -> float:
        return self.bw * self.efficiency


def required(spec: dict[str, Any], key: str, typ: type, source: str) -> Any:
    if key not in spec:
        raise TopologyError(f"topology {source}: missing field {key!r}")
    v = spec[key]
    if typ is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, typ):
        raise TopologyError(f"topology {source}: field {key!r} must be {typ.__name__}, got {v!r}")
    return v


def load_link_classes(spec: dict[str, Any], name: str) -> dict[str, LinkClass]:
    raw = spec.get("link_classes") or {}
    if not isinstance(raw, dict) or not raw:
        raise TopologyError(f"{name}: link_classes must be a non-empty mapping")
    out = {}
    for cname, c in raw.items():
        try:
            bw, lat, eff, msg = (
                float(c["bw"]),
                float(c.get("latency", 0.0)),
                float(c.get("efficiency", 1.0)),
                float(c.get("msg_cost", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyError(f"{name}: link_classes.{cname} needs numeric bw ({e})") from None
        if not bw > 0:
            raise TopologyError(f"{name}: link_classes.{cname}.bw must be > 0, got {bw}")
        if not 0 < eff <= 1:
            raise TopologyError(f"{name}: link_classes.{cname}.efficiency must be in (0, 1]")
        if lat < 0:
            raise TopologyError(f"{name}: link_classes.{cname}.latency must be >= 0")
        if msg < 0:
            raise TopologyError(f"{name}: link_classes.{cname}.msg_cost must be >= 0")
        out[cname] = LinkClass(cname, bw, lat, eff, msg)
    return out


def expand_pairs(entry: Any, i: int, name: str) -> list[tuple[str, str]]:
    if not isinstance(entry, dict) or "a" not in entry or "b" not in entry:
        raise TopologyError(f"{name}: node.links[{i}] needs 'a', 'b' and 'class'")
    a, b = entry["a"], entry["b"]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise TopologyError(
                f"{name}: node.links[{i}]: lists a ({len(a)}) and b ({len(b)}) differ in length"
            )
        return list(zip(a, b))
    if isinstance(a, list):
        return [(x, b) for x in a]
    if isinstance(b, list):
        return [(a, y) for y in b]
    return [(a, b)]
