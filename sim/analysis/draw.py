"""Draw a cluster topology with plotly: devices as markers, links coloured by class.

Layout: nodes side by side, each node's devices in rows by type (NICs, PCIe switches, host,
NVSwitch, GPUs), leaf and spine switches above; large clusters are drawn up to `max_nodes`.
"""

from __future__ import annotations

from pathlib import Path

from sim.hardware.topology import Topology
from sim.hardware.topology.views import cluster_graph

ROW = {
    "spine": 6.0,
    "ib_switch": 5.0,
    "nic": 3.0,
    "pcie_switch": 2.0,
    "host": 2.5,
    "nvswitch": 1.0,
    "gpu": 0.0,
}


def draw_topology(topo: Topology, path: str | Path, max_nodes: int = 8) -> Path:
    import plotly.graph_objects as go

    g = cluster_graph(topo)
    keep = {n for n, d in g.nodes(data=True) if d.get("node") is None or d["node"] < max_nodes}
    pos: dict[str, tuple[float, float]] = {}
    per_node: dict[tuple[int, str], int] = {}
    width = max(topo.gpus_per_node, 4) + 2
    switches = sorted(n for n in keep if g.nodes[n].get("node") is None)
    for i, n in enumerate(switches):
        typ = g.nodes[n]["type"]
        span = width * min(topo.nodes, max_nodes)
        pos[n] = (span * (i + 0.5) / max(len(switches), 1), ROW.get(typ, 5.0))
    for n in sorted(keep - set(switches)):
        d = g.nodes[n]
        k = per_node.get((d["node"], d["type"]), 0)
        per_node[(d["node"], d["type"])] = k + 1
        pos[n] = (d["node"] * width + k + 0.5, ROW.get(d["type"], 0.0) + 0.15 * (k % 2))
    traces = []
    by_class: dict[str, tuple[list, list]] = {}
    for u, v, d in g.edges(data=True):
        if u in pos and v in pos:
            xs, ys = by_class.setdefault(d["cls"], ([], []))
            xs += [pos[u][0], pos[v][0], None]
            ys += [pos[u][1], pos[v][1], None]
    for cls, (xs, ys) in sorted(by_class.items()):
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", name=cls, hoverinfo="name"))
    for typ in ROW:
        names = [n for n in pos if g.nodes[n]["type"] == typ]
        if names:
            traces.append(
                go.Scatter(
                    x=[pos[n][0] for n in names],
                    y=[pos[n][1] for n in names],
                    mode="markers",
                    name=typ,
                    text=names,
                    hoverinfo="text",
                    marker={"size": 9},
                )
            )
    shown = min(topo.nodes, max_nodes)
    fig = go.Figure(traces)
    fig.update_layout(
        title=f"{topo.name}: {topo.nodes} node(s) x {topo.gpus_per_node} GPUs"
        + (f" (first {shown} drawn)" if shown < topo.nodes else ""),
        xaxis={"visible": False},
        yaxis={"visible": False},
        template="plotly_white",
    )
    from sim.analysis.html import write_page

    legend = (
        "Markers are devices (hover for the name), lines are links coloured by class; click "
        "a legend entry to hide it. The axes are layout positions, not quantities."
    )
    return write_page(path, f"moesim topology: {topo.name}", [fig, legend])
