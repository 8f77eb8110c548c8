"""Cluster topologies as data: a YAML node template replicated `nodes` times around a fabric.

Every node is identical (a node template of GPUs, NVSwitch, PCIe switches, host root complex
and NICs); NICs attach to the fabric. Links are full duplex: each direction is a separate link
instance with its own bandwidth, so traffic in opposite directions never competes.

Routing is hierarchical and exact for the single-switch fabric: inside a node, the cheapest
path (time per byte, GPUs never forward); across nodes, the source GPU's NIC, the fabric, then
the destination GPU's NIC. `sim.hardware.topology.views.cluster_graph` builds the whole cluster
as a networkx graph, which the tests use as the reference for the hierarchical routes; the YAML
is read and its fields checked in `sim.hardware.topology.spec`.

Link instances are numbered `node * links_per_node + local_id`, so a route between two ranks
is a template route shifted by node offsets; this is what lets `sim.hardware.network` build the link
incidence of 10^6 flows with numpy instead of a Python loop.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from sim.core import limits
from sim.core.errors import TopologyError
from sim.hardware.topology.fabric import Fabric
from sim.hardware.topology.node_routes import NoPath, add_edge, cheapest_path
from sim.hardware.topology.spec import (
    LinkClass,
    check_spec,
    expand_pairs,
    link_classes,
    read_spec,
)


class Topology:
    def __init__(self, spec: dict[str, Any], nodes: int | None = None, source: str = "<dict>"):
        self.source = source
        self.spec = spec
        check_spec(spec, spec.get("name", source) if isinstance(spec, dict) else source)
        self.name: str = spec["name"]
        n = nodes if nodes is not None else spec.get("nodes", 1)
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise TopologyError(f"{self.name}: nodes must be a positive integer, got {n!r}")
        self.nodes: int = int(n)
        self.gpus_per_node: int = spec["gpus_per_node"]
        # the link arrays grow with the world, whether or not every rank is simulated
        limits.active().check(
            "max_world",
            self.nodes * self.gpus_per_node,
            f"{self.name}: GPUs ({self.nodes:,} nodes x {self.gpus_per_node})",
        )
        self.gpu: dict[str, Any] = spec["gpu"]
        self.network: dict[str, Any] = spec.get("network") or {}
        self.alpha: float = float(self.network.get("alpha", 0.0))
        self.collective_fits: dict[str, list[dict[str, float]]] = spec.get("collectives") or {}
        self.link_classes = link_classes(spec)
        self._build_template()

    # -- loading ----------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        name_or_path: str | Path,
        nodes: int | None = None,
        fabric: dict[str, Any] | None = None,
    ) -> Topology:
        """A preset name or YAML path; `fabric` overrides fields of its fabric section
        (e.g. {"type": "fat_tree", "nodes_per_leaf": 4, "oversubscription": 2})."""
        spec, source = read_spec(name_or_path, fabric)
        return cls(spec, nodes=nodes, source=source)

    def _build_template(self) -> None:
        node = self.spec["node"]
        devices = node.get("devices") or {}
        G = self.gpus_per_node
        self.gpu_names = [f"gpu{i}" for i in range(G)]
        self.devices: dict[str, str] = {g: "gpu" for g in self.gpu_names}
        for name, typ in devices.items():
            if name in self.devices:
                raise TopologyError(f"{self.name}: device name {name!r} used twice")
            self.devices[name] = typ

        # Directed local links: (u, v, class) with local ids 0..2*len-1.
        self.local_links: list[tuple[str, str, LinkClass]] = []
        for i, entry in enumerate(node.get("links") or []):
            for a, b in expand_pairs(entry):
                for x in (a, b):
                    if x not in self.devices:
                        raise TopologyError(
                            f"{self.name}: node.links[{i}] names unknown device {x!r}"
                        )
                cls_name = entry.get("class")
                if cls_name not in self.link_classes:
                    raise TopologyError(
                        f"{self.name}: node.links[{i}] has unknown class {cls_name!r} "
                        f"(defined: {sorted(self.link_classes)})"
                    )
                lc = self.link_classes[cls_name]
                self.local_links.append((a, b, lc))
                self.local_links.append((b, a, lc))

        self.nics = [n for n, t in self.devices.items() if t == "nic"]
        fabric = self.spec.get("fabric")
        self.fabric: Fabric | None = None
        self.fabric_class: LinkClass | None = None
        if fabric is not None:
            self.fabric = Fabric.from_spec(
                fabric, self.name, self.nics, self.devices, set(self.link_classes)
            )
            self.fabric_class = self.link_classes[self.fabric.cls_name]
        if self.nodes > 1 and self.fabric is None:
            raise TopologyError(
                f"{self.name}: {self.nodes} nodes requested but the topology has no fabric "
                f"(it describes a single box)"
            )
        # Each attach point's links to its leaf switch follow the node's local links.
        self.fabric_up: dict[str, int] = {}
        self.fabric_down: dict[str, int] = {}
        base = len(self.local_links)
        if self.fabric is not None:
            for j, dev in enumerate(self.fabric.attach):
                self.fabric_up[dev] = base + 2 * j
                self.fabric_down[dev] = base + 2 * j + 1
        self.links_per_node = base + 2 * len(self.fabric_up)

        names: list[tuple[str, str]] = []
        lcs: list[LinkClass] = []
        for u, v, lc in self.local_links:
            names.append((u, v))
            lcs.append(lc)
        for dev in self.fabric_up:
            for u, v in ((dev, "fabric"), ("fabric", dev)):
                names.append((u, v))
                lcs.append(self.fabric_class)  # type: ignore[arg-type]  # set with fabric_up
        caps = [lc.eff_bw for lc in lcs]
        lats = [lc.latency for lc in lcs]
        classes = [lc.name for lc in lcs]
        self.local_msg = np.array([lc.msg_cost for lc in lcs], dtype=float)
        self.local_conn = np.array([lc.conn_cost for lc in lcs], dtype=float)
        self.local_inflight = np.array([lc.conn_inflight or np.inf for lc in lcs], dtype=float)
        self.local_cap = np.array(caps, dtype=float)
        self.local_lat = np.array(lats, dtype=float)
        self.local_names = names
        self.local_class = classes
        self._template_routes()

    def _template_routes(self) -> None:
        # the node as a directed graph (`node_routes`: a search without networkx)
        succ: dict[str, dict[str, float]] = {d: {} for d in self.devices}
        pred: dict[str, dict[str, float]] = {d: {} for d in self.devices}
        lids: dict[tuple[str, str], int] = {}
        for lid, (u, v, lc) in enumerate(self.local_links):
            # Time per byte, plus a tiny per-hop term so equal-bandwidth ties prefer fewer hops.
            w = 1.0 / lc.eff_bw + 1e-15
            if v not in succ[u] or succ[u][v] > w:
                add_edge(succ, pred, u, v, w)
                lids[u, v] = lid
        G = self.gpus_per_node

        def path(src: str, dst: str) -> list[int]:
            # GPUs and NICs are endpoints: nothing is forwarded through them.
            blocked = {
                n for n, t in self.devices.items() if t in ("gpu", "nic") and n not in (src, dst)
            }
            try:
                nodes = cheapest_path(succ, pred, src, dst, blocked)
            except NoPath:
                raise TopologyError(
                    f"{self.name}: no path from {src} to {dst} inside a node "
                    f"(GPUs and NICs do not forward traffic)"
                ) from None
            return [lids[a, b] for a, b in zip(nodes, nodes[1:])]

        self.intra: list[list[list[int]]] = [
            [path(self.gpu_names[a], self.gpu_names[b]) if a != b else [] for b in range(G)]
            for a in range(G)
        ]
        self.host_out: list[list[int]] = []
        self.host_in: list[list[int]] = []
        hosts = [n for n, t in self.devices.items() if t == "host"]
        for g in self.gpu_names:
            self.host_out.append(path(g, hosts[0]) if hosts else [])
            self.host_in.append(path(hosts[0], g) if hosts else [])
        self.has_host = bool(hosts)
        self.out: list[list[int]] = []
        self.inn: list[list[int]] = []
        if self.fabric_class is not None:
            nic_of = self.spec["node"].get("nic_of_gpu")
            if nic_of is None:
                nic_of = [self._nearest_nic(g, path) for g in self.gpu_names]
            if len(nic_of) != G or any(n not in self.fabric_up for n in nic_of):
                raise TopologyError(
                    f"{self.name}: node.nic_of_gpu must list one fabric-attached NIC of the "
                    f"node per GPU ({G}), got {nic_of}"
                )
            self.nic_of_gpu = list(nic_of)
            attach = self.fabric.attach  # type: ignore[union-attr]  # nic_of: fabric NICs
            self.attach_of_gpu = [attach.index(n) for n in nic_of]
            for g, nic in zip(self.gpu_names, nic_of):
                self.out.append(path(g, nic) + [self.fabric_up[nic]])
                self.inn.append([self.fabric_down[nic]] + path(nic, g))

    def _nearest_nic(self, gpu: str, path: Callable[[str, str], list[int]]) -> str:
        attach = self.fabric.attach  # type: ignore[union-attr]  # called with a fabric only
        return min(attach, key=lambda n: (sum(1.0 / self.local_cap[i] for i in path(gpu, n)), n))

    # -- queries ----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def num_trunks(self) -> int:
        """Leaf-spine trunk links (two per leaf) after the nodes' links; none for one switch."""
        f = self.fabric
        return 2 * f.leaves(self.nodes) if f is not None and f.has_trunks(self.nodes) else 0

    @property
    def trunk_base(self) -> int:
        return self.nodes * self.links_per_node

    @property
    def num_links(self) -> int:
        return self.trunk_base + self.num_trunks

    @cached_property
    def trunk_class(self) -> LinkClass | None:
        """A leaf's uplinks as one trunk: ports x port bandwidth / oversubscription."""
        if not self.num_trunks:
            return None
        f, lc = self.fabric, self.fabric_class
        assert f is not None and lc is not None
        bw = lc.bw * f.ports_per_leaf() / f.oversubscription
        return LinkClass(f"{lc.name}-spine", bw, lc.latency, lc.efficiency)

    @cached_property
    def link_cap(self) -> np.ndarray:
        trunk = self.trunk_class
        extra = np.full(self.num_trunks, trunk.eff_bw if trunk else 0.0)
        return np.concatenate([np.tile(self.local_cap, self.nodes), extra])

    @cached_property
    def link_conn(self) -> np.ndarray:
        """Per link instance: seconds per message per message sharing it in one step."""
        return np.concatenate([np.tile(self.local_conn, self.nodes), np.zeros(self.num_trunks)])

    @cached_property
    def link_inflight(self) -> np.ndarray:
        """Per link instance: messages whose connections it serves at once (inf: no bound)."""
        trunks = np.full(self.num_trunks, np.inf)
        return np.concatenate([np.tile(self.local_inflight, self.nodes), trunks])

    @cached_property
    def link_lat(self) -> np.ndarray:
        trunk = self.trunk_class
        extra = np.full(self.num_trunks, trunk.latency if trunk else 0.0)
        return np.concatenate([np.tile(self.local_lat, self.nodes), extra])

    @cached_property
    def link_class_names(self) -> list[str]:
        """Class name per link instance (trunks are '<fabric class>-spine')."""
        trunk = [self.trunk_class.name] * self.num_trunks if self.trunk_class else []
        return list(self.local_class) * self.nodes + trunk

    def _leaf_name(self, leaf: int) -> str:
        if self.fabric is None or self.fabric.type == "switch":
            return "fabric"
        return f"fabric/leaf{leaf}"

    def _spine_name(self, leaf: int) -> str:
        f = self.fabric
        assert f is not None
        plane = f.plane(leaf % len(f.attach)) if f.type == "rail" else 0
        return f"fabric/spine{plane}" if f.multi_plane else "fabric/spine"

    def endpoints(self, link: int) -> tuple[str, str]:
        """The devices (or switches) at the two ends of a directed link instance."""
        link = int(link)
        if link >= self.trunk_base:
            leaf, down = divmod(link - self.trunk_base, 2)
            ends = (self._leaf_name(leaf), self._spine_name(leaf))
            return (ends[1], ends[0]) if down else ends
        node, lid = divmod(link, self.links_per_node)
        u, v = self.local_names[lid]

        def full(x: str, other: str) -> str:  # a "fabric" end exists with a fabric only
            if x != "fabric":
                return f"n{node}/{x}"
            ia = self.fabric.attach.index(other)  # type: ignore[union-attr]
            return self._leaf_name(int(self.fabric.leaf(node, ia)))  # type: ignore[union-attr]

        return full(u, v), full(v, u)

    def link_name(self, link: int) -> str:
        u, v = self.endpoints(link)
        return f"{u}->{v}"

    def link_class_of(self, link: int) -> str:
        return self.link_class_names[int(link)]

    def locate(self, rank: int) -> tuple[int, int]:
        return divmod(rank, self.gpus_per_node)

    # -- routing ------------------------------------------------------------------------------
    def needs_relay(self, la: int, lb: int) -> bool:
        """Multi-plane rails: GPU la's NIC cannot reach GPU lb's NIC through the network."""
        f = self.fabric
        if f is None or not f.multi_plane:
            return False
        return f.plane(self.attach_of_gpu[la]) != f.plane(self.attach_of_gpu[lb])

    def src_part(self, la: int, lb: int, relay: bool) -> tuple[list[int], int]:
        """Local links on the source node of an inter-node flow la -> lb, and the attach index
        where it enters the fabric. With `relay` (NCCL PXN), or when the planes force it, the
        flow first crosses to the source node's GPU lb over the node's own links."""
        via = lb if (relay or self.needs_relay(la, lb)) else la
        return self.intra[la][via] + self.out[via], self.attach_of_gpu[via]

    def dst_part(self, lb: int) -> tuple[list[int], int]:
        return self.inn[lb], self.attach_of_gpu[lb]

    def trunk_up(self, leaf: np.ndarray | int) -> np.ndarray:
        return self.trunk_base + 2 * np.asarray(leaf)

    def trunk_down(self, leaf: np.ndarray | int) -> np.ndarray:
        return self.trunk_base + 2 * np.asarray(leaf) + 1

    def route(self, src: int, dst: int, relay: bool = False) -> list[int]:
        """Directed link instances from GPU `src` to GPU `dst` (global rank numbers)."""
        na, la = self.locate(src)
        nb, lb = self.locate(dst)
        L = self.links_per_node
        if na == nb:
            return [na * L + i for i in self.intra[la][lb]]
        sp, ia = self.src_part(la, lb, relay)
        dp, ib = self.dst_part(lb)
        f = self.fabric
        assert f is not None
        ls, ld = int(f.leaf(na, ia)), int(f.leaf(nb, ib))
        trunks = [] if ls == ld else [int(self.trunk_up(ls)), int(self.trunk_down(ld))]
        return [na * L + i for i in sp] + trunks + [nb * L + i for i in dp]

    def host_route(self, rank: int, to_host: bool) -> list[int]:
        if not self.has_host:
            raise TopologyError(f"{self.name}: no host device, so d2h/h2d copies have no route")
        n, l = self.locate(rank)
        local = self.host_out[l] if to_host else self.host_in[l]
        return [n * self.links_per_node + i for i in local]

    def route_latency(self, links: list[int]) -> float:
        return float(self.link_lat[np.asarray(links, dtype=np.int64)].sum()) if links else 0.0
