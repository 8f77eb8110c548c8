"""The network between nodes: which leaf switch each NIC hangs off, and the leaf-spine trunks.

Types:
- `switch`: one non-blocking switch (no trunks): every NIC-to-NIC path is NIC up, NIC down.
- `fat_tree`: two levels; all NICs of `nodes_per_leaf` nodes share a leaf; a leaf's uplinks
  to the spines carry `ports x bw / oversubscription`.
- `rail`: rail-optimised; in each scalable unit of `nodes_per_unit` nodes, NIC i of every
  node goes to leaf (unit, i). With `planes: multi` each rail is its own plane: traffic
  cannot cross rails in the network, so it is relayed over NVLink to the GPU on the
  destination's rail first (NCCL PXN), which the router does automatically.

Traffic between leaves is sprayed evenly over all spine uplinks (adaptive routing / packet
spraying, as InfiniBand AR and Spectrum-X do), so a leaf's uplinks are always equally loaded
and act as one trunk of their summed capacity per direction. That is exact for spraying and
keeps 2,048-GPU fabrics at a few thousand link instances; per-flow ECMP hashing is not
modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.errors import TopologyError

FABRIC_TYPES = ("switch", "fat_tree", "rail")


@dataclass(frozen=True)
class Fabric:
    """The fabric between a topology's nodes: its kind, links and shape."""

    type: str
    cls_name: str  # link class of NIC <-> leaf links
    attach: tuple[str, ...]  # node devices wired to the fabric; index = attach index
    group: int  # fat_tree: nodes per leaf; rail: nodes per scalable unit; switch: unused
    oversubscription: float
    multi_plane: bool

    @classmethod
    def from_spec(
        cls, raw: object, name: str, nics: list[str], devices: dict[str, str], classes: set[str]
    ) -> Fabric:
        if not isinstance(raw, dict):
            raise TopologyError(f"{name}: fabric must be a mapping with 'type' and 'class'")
        typ = raw.get("type")
        if typ not in FABRIC_TYPES:
            raise TopologyError(f"{name}: fabric.type {typ!r}: expected one of {FABRIC_TYPES}")
        cname = raw.get("class")
        if cname not in classes:
            raise TopologyError(f"{name}: fabric.class {cname!r} is not a link class")
        attach = raw.get("attach", nics)
        if not attach:
            raise TopologyError(f"{name}: a fabric needs at least one NIC in the node")
        for a in attach:
            if devices.get(a) not in ("nic", "gpu"):
                raise TopologyError(f"{name}: fabric.attach names {a!r}, not a NIC or GPU")
        group_key = {"fat_tree": "nodes_per_leaf", "rail": "nodes_per_unit"}.get(typ)
        group = raw.get(group_key, 1) if group_key else 1
        if not isinstance(group, int) or group < 1:
            raise TopologyError(f"{name}: fabric.{group_key} must be a positive integer")
        over = float(raw.get("oversubscription", 1.0))
        if not over >= 1.0:
            raise TopologyError(f"{name}: fabric.oversubscription must be >= 1, got {over}")
        planes = raw.get("planes", "single")
        if planes not in ("single", "multi") or (planes == "multi" and typ != "rail"):
            raise TopologyError(f"{name}: fabric.planes must be 'single', or 'multi' for rail")
        return cls(typ, cname, tuple(attach), group, over, planes == "multi")

    def leaves(self, nodes: int) -> int:
        if self.type == "switch":
            return 1
        units = -(-nodes // self.group)
        return units * (len(self.attach) if self.type == "rail" else 1)

    def leaf(self, node: np.ndarray | int, ia: int) -> np.ndarray:
        node = np.asarray(node)
        if self.type == "switch":
            return np.zeros_like(node)
        if self.type == "fat_tree":
            return node // self.group
        return (node // self.group) * len(self.attach) + ia

    def plane(self, ia: int) -> int:
        return ia if self.multi_plane else 0

    def ports_per_leaf(self) -> int:
        return self.group * (len(self.attach) if self.type == "fat_tree" else 1)

    def has_trunks(self, nodes: int) -> bool:
        return self.leaves(nodes) > 1
