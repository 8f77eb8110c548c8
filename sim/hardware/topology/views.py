"""Views of a topology for people: the whole cluster as a networkx graph (drawing, printing,
and the tests' reference routing) and a text description (`moesim topology show`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from sim.hardware.topology import Topology


def cluster_graph(topo: Topology) -> nx.DiGraph[str]:
    """The whole cluster as a networkx graph (for drawing, printing and reference routing)."""
    g: nx.DiGraph[str] = nx.DiGraph()
    for n in range(topo.nodes):
        for d, t in topo.devices.items():
            g.add_node(f"n{n}/{d}", type=t, node=n)
    cap, lat, cls = topo.link_cap, topo.link_lat, topo.link_class_names
    for link in range(topo.num_links):
        u, v = topo.endpoints(link)
        for x in (u, v):
            if x not in g:
                g.add_node(x, type="spine" if "spine" in x else "ib_switch", node=None)
        g.add_edge(u, v, link=link, cls=cls[link], bw=float(cap[link]), latency=float(lat[link]))
    return g


def describe(topo: Topology) -> str:
    """The topology as text: link classes, the node template, the fabric."""
    lines = [
        f"{topo.name}: {topo.spec.get('description', '')}",
        f"  nodes={topo.nodes} gpus_per_node={topo.gpus_per_node} "
        f"world={topo.world_size} links={topo.num_links} GPU={topo.gpu.get('model')}",
        "  link classes (per direction):",
    ]
    classes = list(topo.link_classes.values())
    if topo.trunk_class is not None:
        classes.append(topo.trunk_class)
    for lc in classes:
        lines.append(
            f"    {lc.name:12s} {lc.bw / 1e9:8.1f} GB/s x {lc.efficiency:.2f} eff, "
            f"latency {lc.latency * 1e6:.2f} us, per message {lc.msg_cost * 1e6:.2f} us"
        )
    lines.append("  node template:")
    for lid in range(0, len(topo.local_links), 2):
        u, v, lc = topo.local_links[lid]
        lines.append(f"    {u} <-> {v} [{lc.name}]")
    f = topo.fabric
    if f is not None:
        extra = ""
        if f.type == "fat_tree":
            extra = f", {f.group} node(s) per leaf, {f.oversubscription:g}:1 oversubscribed"
        elif f.type == "rail":
            planes = "multi-plane" if f.multi_plane else "single plane"
            extra = (
                f", {f.group} node(s) per unit, leaf per rail, {planes}, {f.oversubscription:g}:1"
            )
        lines.append(
            f"  fabric: {f.type} [{f.cls_name}]{extra}; attached: {', '.join(f.attach)}; "
            f"{f.leaves(topo.nodes)} leaf switch(es)"
        )
    return "\n".join(lines)
