"""Cluster topologies as data: a YAML node template replicated `nodes` times around a fabric.

`Topology` (`cluster`: link instances, hierarchical routing) is loaded on first use, so that
reading a preset's YAML or its schema (`spec`, `schema`: `moesim topology list`, `moesim
schema topology`) imports no numpy. Beside it: the fabric between nodes (`fabric`: one
switch, fat-tree, rail-optimised), routes inside a node without networkx (`node_routes`),
and the text and networkx views of a cluster (`views`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.hardware.topology.cluster import Topology as Topology

__all__ = ["Topology"]


def __getattr__(name: str) -> Any:
    if name == "Topology":
        from sim.hardware.topology.cluster import Topology

        globals()[name] = Topology  # later lookups skip this function
        return Topology
    raise AttributeError(f"module 'sim.hardware.topology' has no attribute {name!r}")
