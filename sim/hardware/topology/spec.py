"""Reading a topology: the YAML file of a preset or a path, read safely, with its fields
checked against the topology schema (`sim.hardware.topology.schema`) before the node's links
and routes are wired.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core import inputcache
from sim.core.errors import ConfigError, TopologyError
from sim.core.kinds import DEVICE_TYPES

__all__ = ["DEVICE_TYPES", "LinkClass", "check_spec", "expand_pairs", "link_classes", "read_spec"]


SHIPPED = Path(__file__).resolve().parents[3] / "topologies"  # the project's own presets


def topologies_dir() -> Path:
    env = os.environ.get("MOESIM_TOPOLOGIES")
    return Path(env) if env else SHIPPED


def list_presets() -> list[str]:
    return sorted(p.stem for p in topologies_dir().glob("*.yaml"))


def read_spec(
    name_or_path: str | Path, fabric: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """The spec of a preset name or YAML path, and where it came from; `fabric` overrides
    fields of its fabric section (e.g. {"type": "fat_tree", "nodes_per_leaf": 4}). The file
    is read as `sim.core.safeload` reads every input (a regular UTF-8 file, bounded YAML)."""
    from sim.core.safeload import load_yaml

    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = topologies_dir() / f"{name_or_path}.yaml"
        if not p.is_file():
            raise TopologyError(
                f"unknown topology {str(name_or_path)!r}: no preset of that name "
                f"(presets: {', '.join(list_presets())}) and no such YAML file"
            )
    shipped = p.parent == SHIPPED  # a project preset: read by libyaml (see load_yaml_text)
    try:
        spec = load_yaml(p, "topology file", libyaml=shipped)
    except ConfigError as e:
        raise TopologyError(str(e)) from None
    if not isinstance(spec, dict):
        raise TopologyError(f"topology file {p}: expected a mapping at top level")
    if fabric:
        if not isinstance(fabric, dict):
            raise TopologyError("fabric overrides: expected a mapping")
        if not isinstance(spec.get("fabric"), dict):
            raise TopologyError(f"{spec.get('name', p)}: has no fabric to override")
        spec["fabric"] = {**spec["fabric"], **fabric}
    return spec, str(p)


def check_spec(spec: Any, source: str) -> None:
    """Every field of a topology spec (types, ranges, spelling), all problems in one line; a
    spec that passed before is not checked again where the validated-input cache is on
    (`sim.core.inputcache`: the command line)."""
    seen = inputcache.Seen("topology", spec)
    if seen.hit:
        return
    from sim.core.schema import check
    from sim.hardware.topology.schema import TopologySpec

    check(TopologySpec, spec, f"topology {source}", error=TopologyError)
    seen.passed()


@dataclass(frozen=True)
class LinkClass:
    """A kind of link: line rate, latency, efficiency and message costs."""

    name: str
    bw: float  # bytes/s per direction (line rate)
    latency: float  # s
    efficiency: float  # share of line rate a large transfer achieves
    msg_cost: float = 0.0  # s a message occupies the link before its payload (message rate)
    conn_cost: float = 0.0  # s more per message, per message sharing the link in one step
    conn_inflight: int = 0  # messages whose connections the link serves at once; 0: no bound

    @property
    def eff_bw(self) -> float:
        return self.bw * self.efficiency


def link_classes(spec: dict[str, Any]) -> dict[str, LinkClass]:
    """The link classes of a checked spec (defaults filled in as the schema gives them)."""
    return {
        name: LinkClass(
            name,
            float(c["bw"]),
            float(c.get("latency", 0.0)),
            float(c.get("efficiency", 1.0)),
            float(c.get("msg_cost", 0.0)),
            float(c.get("conn_cost", 0.0)),
            int(c.get("conn_inflight", 0)),
        )
        for name, c in spec["link_classes"].items()
    }


def expand_pairs(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """The (a, b) device pairs of a checked `node.links` entry."""
    a, b = entry["a"], entry["b"]
    if isinstance(a, list) and isinstance(b, list):
        return list(zip(a, b))
    if isinstance(a, list):
        return [(x, b) for x in a]
    if isinstance(b, list):
        return [(a, y) for y in b]
    return [(a, b)]
