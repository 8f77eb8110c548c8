"""Collective algorithms, fabrics and protocol realism (the network-fidelity contract)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.analysis import collbench
from sim.cli import main
from sim.core.errors import GraphError, TopologyError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.collectives import LocalPhase, UniformPhase, all_to_all_2dh, phases
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

GiB = 2**30


def bench(topo: Topology, kind: str, algo: str | None, size: int, **costs) -> collbench.Row:
    rows, _ = collbench.run(topo, CostModel.build(topo, costs), kind, algo, [size])
    return rows[0]


def one_collective(n: int, kind: str, nbytes: float, algo: str | None = None) -> TaskGraph:
    return collbench.graph_for(kind, algo, n, int(nbytes) if kind != "all_gather" else nbytes)


# -- closed forms --------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 5, 16])
def test_ring_all_reduce_closed_form(n):
    topo = Topology.load("flat-switch", nodes=n)
    alpha, S = 3e-6, 64 * 2**20
    res = simulate(
        one_collective(n, "all_reduce", S), topo, CostModel.build(topo, {"alpha": alpha})
    )
    bw = topo.link_classes["port"].eff_bw
    expect = 2 * (n - 1) / n * S / bw + 2 * (n - 1) * alpha
    assert math.isclose(res.makespan, expect, rel_tol=1e-9)


@pytest.mark.parametrize("n", [4, 64, 300])
def test_linear_all_to_all_on_a_flat_switch(n):
    topo = Topology.load("flat-switch", nodes=n)
    alpha, S = 2e-6, 16 * 2**20
    res = simulate(
        one_collective(n, "all_to_all", S), topo, CostModel.build(topo, {"alpha": alpha})
    )
    expect = (n - 1) / n * S / topo.link_classes["port"].eff_bw + alpha
    assert math.isclose(res.makespan, expect, rel_tol=1e-9)


def test_2dh_phase_volumes_match_tutel():
    """Tutel Sec. 3.4: intra-node S/m to each of m-1 local peers; inter-node n/m - 1 messages
    of m*S/n each to same-local-rank GPUs; a stride copy before each exchange."""
    topo = Topology.load("dgx-a100", nodes=4)
    n, m, S = topo.world_size, topo.gpus_per_node, 96 * 2**20
    tasks = [
        Task(f"t{r}", r, "comm", "all_to_all", bytes=S, group=list(range(n)), coll="x", algo="2dh")
        for r in range(n)
    ]
    ph = all_to_all_2dh(tasks, topo)
    assert [type(p).__name__ for p in ph] == [
        "LocalPhase",
        "UniformPhase",
        "LocalPhase",
        "UniformPhase",
    ]
    copy1, intra, copy2, inter = ph
    assert isinstance(copy1, LocalPhase) and copy1.nbytes == S and copy2.nbytes == S
    assert isinstance(intra, UniformPhase) and intra.pairs == "intra" and intra.per_pair == S / m
    assert isinstance(inter, UniformPhase) and inter.pairs == "rail"
    assert inter.per_pair == m * S / n
    # messages per GPU, counted by the simulator's own flow builder
    res = simulate(
        one_collective(n, "all_to_all", S, "2dh"), topo, CostModel.build(topo, {"fidelity": "flow"})
    )
    assert res.stats["flows"] == n * (m - 1) + n * (n // m - 1)


def test_2dh_needs_whole_nodes():
    topo = Topology.load("dgx-a100", nodes=2)
    tasks = [
        Task(f"t{r}", r, "comm", "all_to_all", bytes=1.0, group=[0, 1, 2, 9], coll="x", algo="2dh")
        for r in (0, 1, 2, 9)
    ]
    with pytest.raises(GraphError, match="nodes x locals"):
        phases(tasks, topo)


def test_unknown_algorithm_is_named():
    topo = Topology.load("dgx-a100", nodes=1)
    g = one_collective(8, "all_to_all", 1024, "telepathy")
    with pytest.raises(GraphError, match="telepathy.*known"):
        simulate(g, topo, CostModel.build(topo, {}))


def test_hierarchical_all_reduce_uses_every_nic():
    """A flat ring crosses each node boundary through one NIC; the hierarchical all-reduce
    runs one cross-node ring per local rank, so all eight NICs share the inter-node part."""
    topo = Topology.load("dgx-a100", nodes=4)
    n, S = topo.world_size, 256 * 2**20
    c = CostModel.build(topo, {})
    ring = simulate(one_collective(n, "all_reduce", S, "ring"), topo, c)
    hier = simulate(one_collective(n, "all_reduce", S, "hierarchical"), topo, c)
    nic = np.array([i for i in range(topo.num_links) if topo.link_class_of(i) == "hdr"])
    assert (ring.link_bytes[nic] > 0).sum() == 8  # 4 boundaries, up + down
    assert (hier.link_bytes[nic] > 0).sum() == len(nic)
    assert hier.makespan < 0.5 * ring.makespan


def test_pairwise_runs_n_minus_1_rounds():
    topo = Topology.load("flat-switch", nodes=6)
    S = 6 * 2**20
    res = simulate(
        one_collective(6, "all_to_all", S, "pairwise"), topo, CostModel.build(topo, {"alpha": 1e-6})
    )
    # each round: one S/n message per rank at full port rate
    expect = 5 * (1e-6 + S / 6 / topo.link_classes["port"].eff_bw)
    assert math.isclose(res.makespan, expect, rel_tol=1e-9)


# -- fabrics -------------------------------------------------------------------------------
def test_oversubscription_2_to_1_halves_cross_spine_bandwidth():
    def busbw(ratio: float) -> float:
        topo = Topology.load(
            "dgx-a100",
            nodes=8,
            fabric={"type": "fat_tree", "nodes_per_leaf": 1, "oversubscription": ratio},
        )
        return bench(topo, "all_to_all", "linear", GiB).busbw

    assert busbw(2.0) / busbw(1.0) == pytest.approx(0.5, rel=0.02)


def test_rail_fabric_routes_cross_rail_traffic_through_the_spine():
    topo = Topology.load("dgx-h100-superpod", nodes=4)
    same_rail = topo.route(0, 8 + 0)  # gpu0 -> gpu0 of the next node: one leaf
    cross_rail = topo.route(0, 8 + 3)
    assert not any("spine" in topo.link_name(x) for x in same_rail)
    assert sum("spine" in topo.link_name(x) for x in cross_rail) == 2
    relayed = topo.route(0, 8 + 3, relay=True)  # PXN: NVLink to local gpu3, then rail 3
    names = [topo.link_name(x) for x in relayed]
    assert names[0] == "n0/gpu0->n0/nvswitch" and not any("spine" in x for x in names)


def test_multi_plane_rails_relay_automatically():
    topo = Topology.load("dgx-h100-superpod", nodes=2, fabric={"planes": "multi"})
    names = [topo.link_name(x) for x in topo.route(0, 8 + 3)]
    assert "n0/nvswitch->n0/gpu3" in names and not any("spine" in x for x in names)


@pytest.mark.parametrize(
    "preset,nodes,fabric,algo",
    [
        (
            "dgx-a100",
            6,
            {"type": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 2.0},
            "linear",
        ),
        ("dgx-a100", 4, {"type": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 4.0}, "2dh"),
        ("dgx-h100-superpod", 4, {"nodes_per_unit": 2}, "linear"),
        ("dgx-h100-superpod", 4, {"nodes_per_unit": 2}, "rail_relay"),
        ("dgx-h100-superpod", 4, {"nodes_per_unit": 2, "planes": "multi"}, "linear"),
        ("pipemoe-2080ti", 4, {"type": "fat_tree", "nodes_per_leaf": 2}, "2dh"),
        ("p4de-a100", 3, None, "rail_relay"),
    ],
)
def test_bundled_agrees_with_per_flow_on_fabrics(preset, nodes, fabric, algo):
    topo = Topology.load(preset, nodes=nodes, fabric=fabric)
    g = one_collective(topo.world_size, "all_to_all", 8 * 2**20, algo)
    per = simulate(g, topo, CostModel.build(topo, {"fidelity": "flow"}))
    bun = simulate(g, topo, CostModel.build(topo, {"fidelity": "bundled"}))
    assert "bundled" in bun.stats["fidelity"] and "bundled" not in per.stats["fidelity"]
    assert bun.stats["flows"] == per.stats["flows"]
    assert math.isclose(bun.makespan, per.makespan, rel_tol=1e-9)
    np.testing.assert_allclose(bun.link_bytes, per.link_bytes, rtol=1e-9, atol=1e-3)


def test_uneven_leaves_fall_back_to_per_flow():
    topo = Topology.load("dgx-a100", nodes=3, fabric={"type": "fat_tree", "nodes_per_leaf": 2})
    res = simulate(
        one_collective(24, "all_to_all", 2**20),
        topo,
        CostModel.build(topo, {"fidelity": "bundled"}),
    )
    assert res.stats["fidelity"] == {"flow": 1}


@pytest.mark.parametrize(
    "fabric,match",
    [
        ({"type": "torus"}, "fabric.type"),
        ({"oversubscription": 0.5}, "oversubscription"),
        ({"type": "fat_tree", "planes": "multi"}, "planes"),
        ({"attach": ["nic0", "nvswitch"]}, "attach"),
        ({"type": "fat_tree", "nodes_per_leaf": 0}, "nodes_per_leaf"),
    ],
)
def test_bad_fabrics(fabric, match):
    with pytest.raises(TopologyError, match=match):
        Topology.load("dgx-a100", nodes=2, fabric=fabric)


# -- protocol realism ----------------------------------------------------------------------
def test_h100_nvswitch_all_to_all_busbw_matches_nccl_tests():
    """nccl-tests #212: ~370 GB/s all-to-all busbw on 8x H100 at large sizes; DeepEP #303:
    ~10.5 us for small intra-node all-to-alls."""
    topo = Topology.load("dgx-h100", nodes=1)
    assert bench(topo, "all_to_all", None, GiB).busbw == pytest.approx(370, rel=0.02)
    assert bench(topo, "all_to_all", None, 4096).time_us == pytest.approx(10.5, rel=0.05)


def test_ndr_nic_throughput_matches_nccl_tests():
    """nccl-tests #267: 48-49 GB/s per CX-7 NIC: a ring of sendrecv across two nodes."""
    topo = Topology.load("dgx-h100", nodes=2)
    assert 48.0 <= bench(topo, "sendrecv", None, GiB).busbw <= 49.5


def test_many_small_messages_pay_per_message_cost():
    topo = Topology.load("dgx-a100", nodes=32)
    small_linear = bench(topo, "all_to_all", "linear", 64 * 2**10)
    hdr = topo.link_classes["hdr"]
    # 248 inter-node messages through one NIC dominate a 64 KiB all-to-all
    assert small_linear.time_us * 1e-6 > 248 * hdr.msg_cost


# -- Tutel: 2DH against linear -------------------------------------------------------------
def test_2dh_wins_small_messages_at_scale_and_loses_large_ones_on_few_gpus():
    """Tutel Fig. 20: 2DH beats linear for small per-peer chunks on many GPUs, loses for
    large messages on few GPUs."""
    many = Topology.load("dgx-a100", nodes=64)  # 512 GPUs
    assert (
        bench(many, "all_to_all", "2dh", 2**20).time_us
        < 0.5 * bench(many, "all_to_all", "linear", 2**20).time_us
    )
    few = Topology.load("dgx-a100", nodes=2)  # 16 GPUs
    assert (
        bench(few, "all_to_all", "2dh", GiB).time_us
        > bench(few, "all_to_all", "linear", GiB).time_us
    )


# -- the CLI -------------------------------------------------------------------------------
def test_collectives_cli_table_and_json(capsys, tmp_path):
    assert (
        main(
            [
                "collectives",
                "--topology",
                "dgx-h100",
                "--nodes",
                "1",
                "-b",
                "1K",
                "-e",
                "1M",
                "-f",
                "4",
                "--out",
                str(tmp_path / "t.txt"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [1024, 4096, 16384, 65536, 262144, 1048576]
    big = [r for r in rows if float(r[4]) >= 10]  # the table prints two decimals
    assert big and all(float(r[5]) == pytest.approx(float(r[4]) * 7 / 8, rel=1e-2) for r in big)
    assert (tmp_path / "t.txt").read_text().strip() == out.strip()
    assert (
        main(
            [
                "collectives",
                "--topology",
                "dgx-a100",
                "--nodes",
                "2",
                "-c",
                "all_reduce",
                "--algo",
                "hierarchical",
                "-b",
                "1M",
                "-e",
                "4M",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == 16 and len(data["rows"]) == 3
    r = data["rows"][0]
    assert r["busbw"] == pytest.approx(r["algbw"] * 2 * 15 / 16)


def test_collectives_cli_errors(capsys):
    assert main(["collectives", "-c", "all_to_all", "--algo", "ring"]) == 2
    assert "ring" in capsys.readouterr().err
    assert main(["collectives", "-b", "1G", "-e", "1K"]) == 2
    assert "sizes" in capsys.readouterr().err


def test_topology_draw(tmp_path, capsys):
    assert (
        main(
            [
                "topology",
                "show",
                "dgx-h100-superpod",
                "--nodes",
                "2",
                "--draw",
                str(tmp_path / "t.html"),
            ]
        )
        == 0
    )
    html = (tmp_path / "t.html").read_text().replace("\\u002f", "/")  # plotly escapes '/'
    assert "plotly" in html and "n1/gpu7" in html and "fabric/spine" in html
