"""Topology presets, hierarchical routing against a networkx reference, and spec errors."""

from __future__ import annotations

import copy
import math
from functools import cache

import networkx as nx
import pytest
import yaml

from sim.core.errors import TopologyError
from sim.hardware.topology import Topology
from sim.hardware.topology.spec import list_presets, topologies_dir
from sim.hardware.topology.views import cluster_graph

PRESETS = list_presets()


@cache
def _raw(name: str) -> dict:
    return yaml.safe_load((topologies_dir() / f"{name}.yaml").read_text())


def _spec(name: str = "dgx-a100") -> dict:
    return copy.deepcopy(_raw(name))


def _has_fabric(name: str) -> bool:
    return _raw(name).get("fabric") is not None


@cache
def _topo(name: str, nodes: int | None) -> Topology:
    return Topology.load(name, nodes=nodes)


def _gpu(topo: Topology, rank: int) -> str:
    n, l = topo.locate(rank)
    return f"n{n}/gpu{l}"


def _hops(topo: Topology, route: list[int]) -> list[tuple[str, str]]:
    return [tuple(topo.link_name(lk).split("->")) for lk in route]


def test_presets_exist():
    assert {"dgx-a100", "dgx-h100", "p3dn-v100", "p4de-a100", "parm-4090", "pipemoe-2080ti"} <= set(
        PRESETS
    )


def _load_cases():
    out = []
    for name in PRESETS:
        # 512 GPUs' 262,144 routes take ~20 s: slow; "2units" below covers the same routes
        # (across scalable units, through the spines) on 5 nodes
        big = _raw(name).get("nodes", 1) * _raw(name).get("gpus_per_node", 1) > 256
        marks = (pytest.mark.slow,) if big else ()
        out.append(pytest.param(name, None, None, id=f"{name}-default", marks=marks))
        if _has_fabric(name):
            out.append(pytest.param(name, 3, None, id=f"{name}-3nodes"))
        if _raw(name).get("fabric", {}).get("nodes_per_unit"):
            out.append(pytest.param(name, 5, {"nodes_per_unit": 2}, id=f"{name}-2units"))
    return out


@pytest.mark.parametrize("name, nodes, fabric", _load_cases())
def test_preset_loads_and_every_pair_has_a_route(name, nodes, fabric):
    topo = Topology.load(name, nodes=nodes, fabric=fabric)
    expected_nodes = nodes if nodes is not None else _raw(name).get("nodes", 1)
    assert topo.nodes == expected_nodes
    assert topo.world_size == expected_nodes * topo.gpus_per_node
    for a in range(topo.world_size):
        for b in range(topo.world_size):
            r = topo.route(a, b)
            if a == b:
                assert r == []
                continue
            assert r, (a, b)
            hops = _hops(topo, r)
            assert hops[0][0] == _gpu(topo, a) and hops[-1][1] == _gpu(topo, b)
            assert all(x[1] == y[0] for x, y in zip(hops, hops[1:])), hops


def _reference(topo: Topology, src: str, dst: str | None = None) -> dict[str, float]:
    """Dijkstra costs (sum of 1/bw) from GPU `src` in `cluster_graph`, with GPUs other than the
    endpoints never forwarding, and NICs only forwarding between their node and the fabric
    (each NIC is split into an uplink half and a downlink half). Where the topology pins each
    GPU to a NIC (`nic_of_gpu`, NCCL's affinity), traffic leaves through src's NIC and
    enters through dst's."""
    g = cluster_graph(topo)
    types = nx.get_node_attributes(g, "type")
    pinned = getattr(topo, "nic_of_gpu", None) and topo.spec["node"].get("nic_of_gpu")
    nic_of = {}
    if pinned:
        for x in (src, dst):
            if x is not None:
                node, gpu = x.split("/")
                nic_of[x] = f"{node}/{topo.nic_of_gpu[int(gpu[3:])]}"
    h = nx.DiGraph()
    for u, v, attrs in g.edges(data=True):
        if types.get(u) == "gpu" and u != src:
            continue  # other GPUs are endpoints only
        if pinned and types.get(u) == "nic" and v.startswith("fabric") and u != nic_of[src]:
            continue
        if (
            pinned
            and dst is not None
            and types.get(v) == "nic"
            and u.startswith("fabric")
            and v != nic_of[dst]
        ):
            continue
        w = 1.0 / attrs["bw"]
        # local -> nic#up -> fabric and fabric -> nic#down -> local; nothing else crosses a NIC.
        a, b = u, v
        if types.get(u) == "nic":
            a = f"{u}#up" if v.startswith("fabric") else f"{u}#down"
        if types.get(v) == "nic":
            b = f"{v}#down" if u.startswith("fabric") else f"{v}#up"
        if not h.has_edge(a, b) or h[a][b]["weight"] > w:
            h.add_edge(a, b, weight=w)
    return nx.single_source_dijkstra_path_length(h, src, weight="weight")


def _route_cost(topo: Topology, route: list[int]) -> float:
    g = cluster_graph(topo)
    return sum(1.0 / g[u][v]["bw"] for u, v in _hops(topo, route))


def _reference_cases():
    out = []
    for name in PRESETS:
        # a Dijkstra per GPU pair: two 72-GPU racks (gb200-nvl72) take minutes
        big = _raw(name).get("gpus_per_node", 1) > 16
        marks = (pytest.mark.slow,) if big else ()
        out.append(pytest.param(name, 2 if _has_fabric(name) else 1, id=name, marks=marks))
    return out


@pytest.mark.parametrize("name, nodes", _reference_cases())
def test_route_matches_networkx_shortest_path(name, nodes):
    topo = _topo(name, nodes)
    g = cluster_graph(topo)
    edge_of_link = {d["link"]: (u, v) for u, v, d in g.edges(data=True)}
    cost = {}
    for a in range(topo.world_size):
        src = _gpu(topo, a)
        for b in range(topo.world_size):
            if a == b:
                continue
            dst = _gpu(topo, b)
            ref = _reference(topo, src, dst)
            route = topo.route(a, b)
            # a valid path in graph(): link ids map to edges that chain src -> dst
            edges = [edge_of_link[lk] for lk in route]
            assert edges[0][0] == src and edges[-1][1] == dst
            assert all(x[1] == y[0] for x, y in zip(edges, edges[1:]))
            assert edges == _hops(topo, route)
            c = sum(1.0 / g[u][v]["bw"] for u, v in edges)
            assert c == pytest.approx(ref[dst], rel=1e-9), (name, a, b, edges)
            cost[(a, b)] = c
    # Routing over full-duplex links is symmetric in cost.
    for (a, b), c in cost.items():
        assert c == pytest.approx(cost[(b, a)], rel=1e-9)


@pytest.mark.parametrize("name, nodes", _reference_cases())
def test_route_never_transits_a_gpu_or_nic_locally(name, nodes):
    topo = _topo(name, nodes)
    types = nx.get_node_attributes(cluster_graph(topo), "type")
    for a in range(topo.world_size):
        for b in range(topo.world_size):
            if a == b:
                continue
            hops = _hops(topo, topo.route(a, b))
            inner = [v for _, v in hops[:-1]]
            assert not [n for n in inner if types[n] == "gpu"], (a, b, hops)
            assert len(inner) == len(set(inner)), "route revisits a device"
            for (u, v), (_, w) in zip(hops, hops[1:]):
                if types[v] == "nic":  # a NIC only hands traffic to or from the fabric
                    assert u.startswith("fabric") or w.startswith("fabric"), (a, b, hops)
            same_node = topo.locate(a)[0] == topo.locate(b)[0]
            assert any(x.startswith("fabric") for x in inner) == (not same_node)


@pytest.mark.parametrize("name", PRESETS)
def test_link_cap_is_bw_times_efficiency(name):
    topo = _topo(name, 2 if _has_fabric(name) else 1)
    classes = _raw(name)["link_classes"]
    assert len(topo.link_cap) == topo.num_links
    fabric = _raw(name).get("fabric") or {}
    for lk in range(topo.num_links):
        cls = topo.link_class_of(lk)
        if cls.endswith("-spine"):  # a leaf's uplinks as one trunk
            c = classes[fabric["class"]]
            ports = fabric.get("nodes_per_unit", fabric.get("nodes_per_leaf", 1))
            if fabric["type"] == "fat_tree":
                ports *= len(
                    fabric.get(
                        "attach",
                        [n for n, t in _raw(name)["node"]["devices"].items() if t == "nic"],
                    )
                )
            want = float(c["bw"]) * ports / fabric.get("oversubscription", 1.0)
            want *= float(c.get("efficiency", 1.0))
        else:
            c = classes[cls]
            want = float(c["bw"]) * float(c.get("efficiency", 1.0))
        assert topo.link_cap[lk] == pytest.approx(want, rel=1e-12), topo.link_name(lk)
        assert topo.link_lat[lk] == pytest.approx(float(c.get("latency", 0.0)))
    if fabric:
        on_fabric = [lk for lk in range(topo.num_links) if "fabric" in topo.link_name(lk)]
        assert on_fabric
        assert all(
            topo.link_class_of(lk) in (fabric["class"], fabric["class"] + "-spine")
            for lk in on_fabric
        )


# -- errors ----------------------------------------------------------------------------------


def test_unknown_preset_lists_presets():
    with pytest.raises(TopologyError) as ei:
        Topology.load("no-such-cluster")
    msg = str(ei.value)
    assert "no-such-cluster" in msg
    for name in PRESETS:
        assert name in msg


def _zero_bw(s):
    s["link_classes"]["hdr"]["bw"] = 0


def _eff_gt_1(s):
    s["link_classes"]["pcie4"]["efficiency"] = 1.5


def _unknown_device(s):
    s["node"]["links"].append({"a": "gpu0", "b": "nvswitch9", "class": "nvlink3"})


def _unknown_class(s):
    s["node"]["links"][0]["class"] = "nvlink9"


def _disconnected_gpu(s):
    s["gpus_per_node"] = 2
    s["node"]["devices"] = {"nvswitch": "nvswitch"}
    s["node"]["links"] = [{"a": "gpu0", "b": "nvswitch", "class": "nvlink3"}]
    s["node"].pop("nic_of_gpu")
    s.pop("fabric")
    s["nodes"] = 1


def _nic_of_gpu_len(s):
    s["node"]["nic_of_gpu"] = s["node"]["nic_of_gpu"][:3]


SPEC_ERRORS = [
    ("zero_bandwidth", _zero_bw, ["link_classes.hdr.bw", ">= 1000, got 0"]),
    ("efficiency_above_1", _eff_gt_1, ["pcie4", "efficiency"]),
    ("unknown_device", _unknown_device, ["nvswitch9", "unknown device"]),
    ("unknown_class", _unknown_class, ["nvlink9", "unknown class"]),
    ("disconnected_gpu", _disconnected_gpu, ["gpu1", "no path"]),
    ("nic_of_gpu_length", _nic_of_gpu_len, ["nic_of_gpu", "(8)"]),
]


@pytest.mark.parametrize(
    "mutate, needles", [e[1:] for e in SPEC_ERRORS], ids=[e[0] for e in SPEC_ERRORS]
)
def test_bad_spec_raises(mutate, needles):
    s = _spec()
    mutate(s)
    with pytest.raises(TopologyError) as ei:
        Topology(s)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, (n, msg)


def test_unmodified_spec_is_valid():
    topo = Topology(_spec())
    assert topo.world_size == 16


def test_nodes_without_fabric():
    with pytest.raises(TopologyError, match="no fabric") as ei:
        Topology.load("parm-4090", nodes=2)
    assert "parm-4090" in str(ei.value)
    assert Topology.load("parm-4090").world_size == 8


def test_two_gpu_node_connected_is_fine():
    s = _spec()
    _disconnected_gpu(s)
    s["node"]["links"][0]["a"] = ["gpu0", "gpu1"]
    topo = Topology(s)
    assert len(topo.route(0, 1)) == 2
    assert math.isclose(_route_cost(topo, topo.route(0, 1)), 2 / (300e9 * 0.8))


def test_a_dtype_the_gpu_lacks_is_refused_by_name():
    """No silent fallback to the fp32 rate (tf32 on an A100 is 8x the fp32 rate)."""
    from sim.core.errors import ConfigError
    from sim.core.graph import Task
    from sim.hardware.costs import CostModel

    topo = Topology.load("dgx-a100", nodes=1)
    roof = CostModel.build(topo, {}).compute
    gemm = Task("g", 0, "compute", "gemm", flops=2e12, tags={"dtype": "tf32"})
    fp32 = Task("h", 0, "compute", "gemm", flops=2e12, tags={"dtype": "fp32"})
    assert roof.duration(fp32) / roof.duration(gemm) == pytest.approx(156.0 / 19.5, rel=1e-3)
    with pytest.raises(ConfigError, match=r"no 'fp8' entry.*model.dtype"):
        roof.duration(Task("f", 0, "compute", "gemm", flops=1.0, tags={"dtype": "fp8"}))
