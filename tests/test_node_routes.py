"""Routes inside a node come from `sim.hardware.topology.node_routes.cheapest_path`, moesim's
own Dijkstra search: on every preset it picks exactly the route networkx picked before it (so no
result moved), and on random graphs full of equal-cost paths it finds a path of networkx's
cost through no blocked node, or none where networkx finds none."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from sim.hardware.topology import Topology
from sim.hardware.topology.node_routes import NoPath, add_edge, cheapest_path
from sim.hardware.topology.spec import list_presets


def _nx_routes(topo: Topology) -> dict[str, list]:
    """The node's routes as networkx computed them (the code before node_routes)."""
    tg = nx.DiGraph()
    tg.add_nodes_from(topo.devices)
    for lid, (u, v, lc) in enumerate(topo.local_links):
        w = 1.0 / lc.eff_bw + 1e-15
        if not tg.has_edge(u, v) or tg[u][v]["weight"] > w:
            tg.add_edge(u, v, weight=w, lid=lid)

    def path(src: str, dst: str) -> list[int]:
        blocked = {
            n for n, t in topo.devices.items() if t in ("gpu", "nic") and n not in (src, dst)
        }
        view = nx.subgraph_view(tg, filter_node=lambda n: n not in blocked)
        nodes = nx.shortest_path(view, src, dst, weight="weight")
        return [tg[a][b]["lid"] for a, b in zip(nodes, nodes[1:])]

    g = topo.gpu_names
    hosts = [n for n, t in topo.devices.items() if t == "host"]
    out = {"intra": [[path(a, b) if a != b else [] for b in g] for a in g]}
    out["host_out"] = [path(x, hosts[0]) if hosts else [] for x in g]
    out["host_in"] = [path(hosts[0], x) if hosts else [] for x in g]
    if topo.fabric_class is not None:
        nics = topo.nic_of_gpu
        out["out"] = [path(x, n) + [topo.fabric_up[n]] for x, n in zip(g, nics)]
        out["inn"] = [[topo.fabric_down[n]] + path(n, x) for x, n in zip(g, nics)]
    return out


@pytest.mark.parametrize("preset", list_presets())
def test_preset_routes_equal_networkx(preset):
    topo = Topology.load(preset, nodes=1)
    for name, routes in _nx_routes(topo).items():
        assert getattr(topo, name) == routes, name


def test_random_graphs_with_ties_cost_what_networkx_finds():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(2, 12)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        succ: dict = {i: {} for i in range(n)}
        pred: dict = {i: {} for i in range(n)}
        for _ in range(rng.randint(0, 4 * n)):
            u, v = rng.randrange(n), rng.randrange(n)
            if u == v:
                continue
            w = rng.choice([1.0, 1.0, 2.0, 0.5])  # many equal-cost paths
            if not g.has_edge(u, v) or g[u][v]["weight"] > w:
                g.add_edge(u, v, weight=w)
                add_edge(succ, pred, u, v, w)
        s, t = rng.randrange(n), rng.randrange(n)
        blocked = {x for x in range(n) if x not in (s, t) and rng.random() < 0.2}
        view = nx.subgraph_view(g, filter_node=lambda x, b=blocked: x not in b)
        try:
            want = nx.shortest_path(view, s, t, weight="weight")
        except nx.NetworkXNoPath:
            with pytest.raises(NoPath):
                cheapest_path(succ, pred, s, t, blocked)
            continue
        got = cheapest_path(succ, pred, s, t, blocked)
        assert got[0] == s and got[-1] == t and not blocked & set(got[1:-1])
        cost = sum(g[a][b]["weight"] for a, b in zip(got, got[1:]))
        assert cost == pytest.approx(nx.path_weight(g, want, "weight"), rel=1e-12)
