"""Collective algorithms, fabrics and protocol realism (the network-fidelity contract)."""

from __future__ import annotations

import json
import math
import re

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
from tests.configs import switch_ports

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


def _one_a2a(topo: Topology, group: list[int], S: float, algo: str) -> TaskGraph:
    """One all-to-all of S bytes per member over `group` (any subset of the topology)."""
    g = TaskGraph(topo.world_size)
    for r in group:
        g.add(Task(f"a{r}", r, "comm", "all_to_all", bytes=S, group=group, coll="x", algo=algo))
    return g


def _stride_copy_s(topo: Topology, S: float) -> float:
    """One 2DH stride copy (Tutel Alg. 3, strideMemcpy): a kernel that reads and writes the
    whole per-GPU buffer, at the GPU's memory bandwidth, plus its launch (the roofline)."""
    gpu = topo.spec["gpu"]
    roof = gpu["roofline"]
    return roof["launch_s"] + 2 * S / (gpu["mem_bw"] * roof["mem_efficiency"])


@pytest.mark.parametrize("kind", ["all_to_all", "all_gather", "reduce_scatter", "all_reduce"])
def test_a_one_rank_collective_is_a_local_copy_where_its_output_is_another_buffer(kind):
    """NCCL with one rank copies an out-of-place collective's input into its output: the
    roofline's copy of the payload, read and written; an in-place all-reduce costs nothing."""
    topo = Topology.load("dgx-h100", nodes=1)
    S = 64 * 2**20
    g = TaskGraph(topo.world_size)
    g.add(Task("c", 0, "comm", kind, bytes=S, group=[0], coll="x"))
    res = simulate(g, topo, CostModel.build(topo, {"fidelity": "flow"}))
    want = _stride_copy_s(topo, S) if kind != "all_reduce" else 0.0
    assert math.isclose(res.makespan, want, rel_tol=1e-9, abs_tol=1e-15)


@pytest.mark.parametrize("fidelity", ["flow", "bundled"])
def test_2dh_is_the_sum_of_its_phases_on_2_nodes_x_2_gpus(fidelity):
    """Tutel Fig. 15 / Alg. 3 on the smallest 2D case (GPUs 0, 1 of two dgx-a100 nodes): no two
    messages share a link, so the time is the four phases' closed forms, one after the other:
    stride copy, intra-node exchange (S/2 over NVLink), stride copy, inter-node exchange
    (S/2 through the GPU's own NIC; one message per NIC, so one conn_cost)."""
    topo = Topology.load("dgx-a100", nodes=2)
    alpha, S = 1.7e-6, 8 * 2**20
    res = simulate(
        _one_a2a(topo, [0, 1, 8, 9], S, "2dh"),
        topo,
        CostModel.build(topo, {"alpha": alpha, "fidelity": fidelity}),
    )
    nv, pcie, hdr = (topo.link_classes[c] for c in ("nvlink3", "pcie4", "hdr"))
    # gpu -> nvswitch -> gpu
    intra = alpha + 2 * nv.latency + S / 2 / nv.eff_bw + nv.msg_cost
    # gpu -> pcie switch -> nic -> fabric -> nic -> pcie switch -> gpu; the HDR port is the
    # bottleneck and the largest per-message cost on the route
    bw = min(pcie.eff_bw, hdr.eff_bw)
    inter = alpha + 4 * pcie.latency + 2 * hdr.latency + S / 2 / bw + hdr.msg_cost + hdr.conn_cost
    copy = _stride_copy_s(topo, S)
    assert hdr.conn_cost > 0 and nv.msg_cost > 0  # the closed form does cover both costs
    assert math.isclose(res.makespan, copy + intra + copy + inter, rel_tol=1e-9)


@pytest.mark.parametrize(
    "nodes, group",
    [(1, list(range(8))), (16, list(range(0, 128, 8)))],
    ids=["one-node", "one-gpu-per-node"],
)
def test_2dh_exchanges_cost_what_the_linear_ones_do(nodes, group):
    """2DH's intra-node exchange is the linear all-to-all of one node, and its inter-node
    exchange the linear all-to-all of one GPU per node: the same flows, so the same
    per-message (msg_cost) and per-connection (conn_cost) charges; 2DH adds its two stride
    copies and nothing else."""
    topo = Topology.load("dgx-a100", nodes=nodes)
    S = 2**20
    costs = CostModel.build(topo, {})
    lin = simulate(_one_a2a(topo, group, S, "linear"), topo, costs).makespan
    two = simulate(_one_a2a(topo, group, S, "2dh"), topo, costs).makespan
    assert math.isclose(two, lin + 2 * _stride_copy_s(topo, S), rel_tol=1e-9)


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
    big = [r for r in rows if float(r[6]) >= 10]  # the table prints two decimals
    assert big and all(float(r[7]) == pytest.approx(float(r[6]) * 7 / 8, rel=1e-2) for r in big)
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


def parse_nccl_tests(text: str) -> dict:
    """A reader of nccl-tests' text log (as a script comparing two logs would read one): the
    run line's fields, the column header, each row's out-of-place and in-place results, and
    the footer's average bus bandwidth."""
    lines = text.splitlines()
    run_line = next(line for line in lines if line.startswith("# nThread "))
    run = dict(re.findall(r"(minBytes|maxBytes) (\d+)", run_line))
    run["step"] = re.search(r"step: (\d+)\(factor\)", run_line).group(1)
    names = next(line for line in lines if line.startswith("#") and "#wrong" in line)
    units = lines[lines.index(names) + 1]
    rows = []
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        assert len(f) == 13, line
        rows.append(
            {
                "size": int(f[0]),
                "count": int(f[1]),
                "type": f[2],
                "redop": f[3],
                "root": int(f[4]),
                "out": (float(f[5]), float(f[6]), float(f[7]), f[8]),
                "in": (float(f[9]), float(f[10]), float(f[11]), f[12]),
            }
        )
    avg = re.search(r"^# Avg bus bandwidth    : (\S+)$", text, re.M)
    oob = re.search(r"^# Out of bounds values : (\d+) OK$", text, re.M)
    return {
        "run": run,
        "names": names.split()[1:],
        "units": units.split()[1:],
        "devices": [line for line in lines if line.startswith("#  Rank ")],
        "rows": rows,
        "avg_busbw": float(avg.group(1)),
        "out_of_bounds": int(oob.group(1)),
    }


@pytest.mark.parametrize(
    "kind, algo, redop, root",
    [
        ("all_to_all", "2dh", "none", -1),
        ("all_reduce", None, "sum", -1),
        ("reduce_scatter", None, "sum", -1),
        ("broadcast", None, "none", 0),
    ],
)
def test_collectives_text_reads_back_as_nccl_tests(capsys, kind, algo, redop, root):
    """The table is nccl-tests' log: its header, columns and footer are where a script reading
    a real log looks, and size, time, algbw and busbw read back as the JSON rows give them."""
    args = ["collectives", "--topology", "dgx-h100", "--nodes", "2", "-c", kind]
    args += (["--algo", algo] if algo else []) + ["-b", "1K", "-e", "256M", "-f", "8"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    got = parse_nccl_tests(text)

    assert got["run"] == {"minBytes": "1024", "maxBytes": str(256 * 2**20), "step": "8"}
    assert "# Using devices" in text.splitlines() and len(got["devices"]) == 16
    assert got["devices"][9].startswith("#  Rank  9 Group  0 Pid      0 on      node1 device  1 ")
    names = ["size", "count", "type", "redop", "root", *["time", "algbw", "busbw", "#wrong"] * 2]
    assert got["names"] == names
    assert got["units"] == ["(B)", "(elements)", *["(us)", "(GB/s)", "(GB/s)"] * 2]
    assert "out-of-place" in text and "in-place" in text
    # nccl-tests' exact column header (its printf widths)
    assert (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong" in text.splitlines()
    )

    assert len(got["rows"]) == len(data["rows"]) == 7  # 1K, 8K, ..., 256M
    for row, want in zip(got["rows"], data["rows"]):
        assert row["size"] == want["size"]
        share = 16 if kind in ("all_to_all", "reduce_scatter") else 1
        assert row["count"] == want["size"] // 4 // share  # nccl-tests' count: NCCL's argument
        assert (row["type"], row["redop"], row["root"]) == ("float", redop, root)
        time_us, algbw, busbw, wrong = row["out"]
        assert row["in"] == row["out"] and wrong == "N/A"  # in-place simulated as out-of-place
        # printed to 2 decimals, fewer from 100 us (1 decimal) and 10 ms (none) on
        assert time_us == pytest.approx(want["time_us"], abs=0.5, rel=1e-3)
        assert algbw == pytest.approx(want["algbw"], abs=0.005)
        assert busbw == pytest.approx(want["busbw"], abs=0.005)
    mean = sum(r["busbw"] for r in data["rows"]) / len(data["rows"])
    assert got["avg_busbw"] == pytest.approx(mean, rel=1e-5)  # %g: 6 significant digits
    assert got["avg_busbw"] == pytest.approx(
        collbench.avg_busbw([collbench.Row(**r) for r in data["rows"]]), rel=1e-5
    )
    assert got["out_of_bounds"] == 0


def test_collectives_text_lists_at_most_64_devices():
    rows = [collbench.Row(1024, 256, 10.0, 0.1, 0.1), collbench.Row(2048, 512, 10.0, 0.2, 0.3)]
    header = {
        "collective": "sendrecv",
        "algo": "default",
        "topology": "t",
        "nodes": 16,
        "gpus": 128,
        "fidelity": {},
    }
    text = collbench.format_table(rows, header)  # no setup: derived from the rows
    got = parse_nccl_tests(text)
    assert len(got["devices"]) == 64 and "#  ... ranks 64 to 127 likewise" in text
    assert got["run"] == {"minBytes": "1024", "maxBytes": "2048", "step": "2"}
    assert got["avg_busbw"] == pytest.approx(0.2)
    assert [r["count"] for r in got["rows"]] == [256, 512]


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


# -- a cost per concurrent connection (issue 26) --------------------------------------------
def _ports(n: int, msg: float, conn: float) -> Topology:
    """n GPUs, one port each on one switch: the per-message costs alone decide small sizes."""
    return Topology(switch_ports(n, {"bw": 10e9, "msg_cost": msg, "conn_cost": conn}))


@pytest.mark.parametrize("fidelity", ["bundled", "flow"])
@pytest.mark.parametrize("conn", [0.0, 1e-8])
def test_connection_cost_closed_form(fidelity, conn):
    """Linear all-to-all of S bytes per GPU among n one-port GPUs: each port carries n - 1
    messages of S/n, each occupying it msg + conn * (n - 1) seconds besides its payload, so
    t = (n-1) S / (n bw) + (n-1) msg + conn (n-1)^2; conn = 0 leaves the per-message form."""
    n, S, bw, msg = 6, 6e4, 10e9, 2e-6
    topo = _ports(n, msg, conn)
    g = collbench.graph_for("all_to_all", "linear", n, int(S))
    got = simulate(g, topo, CostModel.build(topo, {"fidelity": fidelity, "alpha": 0.0})).makespan
    want = (n - 1) * S / (n * bw) + (n - 1) * msg + conn * (n - 1) ** 2
    assert got == pytest.approx(want, rel=1e-9)


def test_connection_cost_grows_linear_all_to_all_faster_than_2dh():
    """With the per-connection term the linear all-to-all's per-message cost grows with the
    peers a NIC serves (up to the 256 it serves at once, conn_inflight), 2DH's with the nodes
    only: at 1,024 GPUs the gain passes the GPUs per node (8)."""
    topo = Topology.load("dgx-a100", nodes=128)
    lin = bench(topo, "all_to_all", "linear", 2**20).time_us
    two = bench(topo, "all_to_all", "2dh", 2**20).time_us
    assert lin / two > 8
