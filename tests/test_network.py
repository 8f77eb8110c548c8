"""Flow-level network: max-min sharing, alpha once per message, bundled == per-flow."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.network.maxmin import max_min_rates
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.workload.moe import MoELayer

GB = 1e9


def star(bw_gpu0: float = 10 * GB, latency: float = 0.0) -> Topology:
    """One node: 4 GPUs on one switch; GPU 0's link may be slower than the others."""
    return Topology(
        {
            "name": "star",
            "nodes": 1,
            "gpus_per_node": 4,
            "gpu": {"peak_flops": {"bf16": 1e14}, "mem_bw": 1e12, "memory_bytes": 80e9},
            "node": {
                "devices": {"sw": "nvswitch"},
                "links": [
                    {"a": "gpu0", "b": "sw", "class": "slow"},
                    {"a": ["gpu1", "gpu2", "gpu3"], "b": "sw", "class": "fast"},
                ],
            },
            "link_classes": {
                "slow": {"bw": bw_gpu0, "latency": latency},
                "fast": {"bw": 10 * GB, "latency": latency},
            },
        }
    )


def p2p_graph(pairs: list[tuple[int, int, float]]) -> TaskGraph:
    g = TaskGraph(4)
    for n, (a, b, nbytes) in enumerate(pairs):
        g.add(Task(f"s{n}", a, f"comm.{n}", "send", peer=b, bytes=nbytes, coll=f"p{n}"))
        g.add(Task(f"r{n}", b, f"comm.{n}", "recv", peer=a, bytes=nbytes, coll=f"p{n}"))
    g.validate()
    return g


def run(topo: Topology, g: TaskGraph, alpha: float = 0.0, **costs):
    return simulate(g, topo, CostModel.build(topo, {"alpha": alpha, **costs}))


def test_two_flows_on_one_link_each_get_half():
    topo = star()
    res = run(topo, p2p_graph([(1, 3, 4 * GB), (2, 3, 4 * GB)]))
    # both share sw->gpu3 (10 GB/s): 5 GB/s each
    assert math.isclose(res.makespan, 4 * GB / (5 * GB), rel_tol=1e-12)


def test_max_min_leaves_the_rest_to_the_unconstrained_flow():
    topo = star(bw_gpu0=2 * GB)
    # flow A 0->3 is held to 2 GB/s by gpu0's link; flow B 1->3 gets the other 8 of sw->gpu3
    res = run(topo, p2p_graph([(0, 3, 2 * GB), (1, 3, 8 * GB)]))
    ends = dict(zip([t.id for t in res.graph], res.end))
    assert math.isclose(ends["r0"], 1.0, rel_tol=1e-12)
    assert math.isclose(ends["r1"], 1.0, rel_tol=1e-12)


def test_rates_are_recomputed_when_a_flow_ends():
    topo = star()
    # Short flow ends at 0.2 s (both at 5 GB/s); the long one then speeds up to 10 GB/s.
    res = run(topo, p2p_graph([(1, 3, 1 * GB), (2, 3, 4 * GB)]))
    assert math.isclose(res.makespan, 0.2 + (4 - 1) / 10, rel_tol=1e-12)


def test_alpha_and_latency_are_paid_once_per_message():
    topo = star(latency=1e-6)
    alpha = 7e-6
    res = run(topo, p2p_graph([(1, 2, 1 * GB)]), alpha=alpha)
    # path gpu1->sw->gpu2: two links of 1 us latency
    assert math.isclose(res.makespan, alpha + 2e-6 + 0.1, rel_tol=1e-12)


def test_efficiency_scales_bandwidth():
    topo = Topology.load("dgx-a100", nodes=1)
    g = TaskGraph(8)
    g.add(Task("s", 0, "comm", "send", peer=1, bytes=1 * GB, coll="p"))
    g.add(Task("r", 1, "comm", "recv", peer=0, bytes=1 * GB, coll="p"))
    res = simulate(g, topo, CostModel.build(topo, {"alpha": 0.0}))
    nv = topo.link_classes["nvlink3"]
    expect = 2 * nv.latency + nv.msg_cost + GB / nv.eff_bw
    assert math.isclose(res.makespan, expect, rel_tol=1e-12)


def test_max_min_rates_unit():
    # links: 0 cap 10, 1 cap 2; bundle 0 crosses both, bundle 1 only link 0 (3 flows)
    rates = max_min_rates(
        2,
        np.array([0, 0, 1]),
        np.array([0, 1, 0]),
        np.array([1.0, 1.0, 3.0]),
        np.array([10.0, 2.0]),
    )
    assert rates[0] == pytest.approx(2.0)
    assert rates[1] == pytest.approx(8.0 / 3)


def test_uniform_all_to_all_on_one_switch_closed_form():
    """n GPUs on a non-blocking switch: alpha + path latency + (n-1)/n * S / bw, plus the
    n-1 messages' per-message cost on the sender's link."""
    topo = Topology.load("dgx-a100", nodes=1)
    n, S, alpha = 8, 64 * 2**20, 5e-6
    g = TaskGraph(n)
    for r in range(n):
        g.add(Task(f"a{r}", r, "comm", "all_to_all", bytes=S, group=list(range(n)), coll="x"))
    res = simulate(g, topo, CostModel.build(topo, {"alpha": alpha}))
    nv = topo.link_classes["nvlink3"]
    expect = alpha + 2 * nv.latency + (n - 1) * nv.msg_cost + (n - 1) / n * S / nv.eff_bw
    assert math.isclose(res.makespan, expect, rel_tol=1e-12)


@pytest.mark.parametrize(
    "preset,nodes",
    [
        ("dgx-a100", 3),
        ("pipemoe-2080ti", 4),
        ("p4de-a100", 2),
        ("p3dn-v100", 2),
        ("dgx-h100", 2),
        ("parm-4090", 1),
    ],
)
@pytest.mark.parametrize("order", ["tutel", "two_streams"])
def test_bundled_agrees_with_per_flow(preset, nodes, order):
    topo = Topology.load(preset, nodes=nodes)
    P = topo.world_size
    layer = MoELayer(
        batch=2,
        seq_len=256,
        model_dim=512,
        hidden_dim=1024,
        experts=P,
        world=P,
        top_k=2,
        capacity_factor=1.0,
    )
    g = build("pipelined", layer, {"degree": 2, "order": order}, ("fwd", "bwd"))
    per = simulate(g, topo, CostModel.build(topo, {"fidelity": "flow"}))
    bun = simulate(g, topo, CostModel.build(topo, {"fidelity": "bundled"}))
    assert bun.stats["fidelity"] == {"bundled": 8}
    assert per.stats["fidelity"] == {"flow": 8}
    assert bun.stats["flows"] == per.stats["flows"]
    if nodes > 1:  # one node: each (src, dst) pair is its own bundle
        assert bun.stats["bundles"] < per.stats["bundles"]
    np.testing.assert_allclose(bun.end, per.end, rtol=1e-9)
    np.testing.assert_allclose(bun.link_bytes, per.link_bytes, rtol=1e-9, atol=1e-3)


def test_auto_fidelity_bundles_large_groups_only():
    topo = Topology.load("dgx-a100", nodes=2)
    P = topo.world_size
    layer = MoELayer(batch=1, seq_len=128, model_dim=256, hidden_dim=512, experts=P, world=P)
    g = build("sequential", layer, {}, ("fwd",))
    small = simulate(g, topo, CostModel.build(topo, {"bundle_min_ranks": 64}))
    large = simulate(g, topo, CostModel.build(topo, {"bundle_min_ranks": 16}))
    assert small.stats["fidelity"] == {"flow": 2}
    assert large.stats["fidelity"] == {"bundled": 2}
    assert math.isclose(small.makespan, large.makespan, rel_tol=1e-9)


def test_skewed_all_to_allv_is_bounded_by_the_hot_ingress():
    """Everything to one rank: time is set by that rank's ingress link, not the senders'."""
    topo = Topology.load("dgx-a100", nodes=1)
    n, S = 8, 256 * 2**20
    g = TaskGraph(n)
    for r in range(n):
        split = [0.0] * n
        split[0] = S if r else 0.0
        recv = [S if (r == 0 and q) else 0.0 for q in range(n)]
        g.add(
            Task(
                f"a{r}",
                r,
                "comm",
                "all_to_allv",
                bytes=sum(split),
                group=list(range(n)),
                coll="x",
                split=split,
                recv_split=recv,
            )
        )
    res = simulate(g, topo, CostModel.build(topo, {"alpha": 0.0}))
    nv = topo.link_classes["nvlink3"]
    expect = 2 * nv.latency + (n - 1) * (nv.msg_cost + S / nv.eff_bw)
    assert math.isclose(res.makespan, expect, rel_tol=1e-9)


def test_finish_rtol_trades_a_bounded_error_for_fewer_events():
    """Flows on separate links, 1 GB and 1.02 GB at 10 GB/s: by default they end at 0.1 s and
    0.102 s; with a window of 5% of the time they end together at the first finish (the
    second up to finish_rtol * now early), one rate solve fewer."""
    topo = star()
    g = p2p_graph([(1, 2, 1 * GB), (3, 0, 1.02 * GB)])
    exact = run(topo, g)
    ends = {t.id: float(e) for t, e in zip(exact.graph, exact.end)}
    assert ends["r0"] == pytest.approx(0.1) and ends["r1"] == pytest.approx(0.102)
    loose = run(topo, g, finish_rtol=0.05)
    assert set(np.round(loose.end, 12)) == {0.1}
    assert loose.stats["rate_recomputes"] < exact.stats["rate_recomputes"]
    assert run(topo, g, finish_rtol=0.01).makespan == pytest.approx(0.102)  # 2 ms > 1 ms


@pytest.mark.parametrize("bad", [-0.1, 0.5, "1e-3", True])
def test_finish_rtol_bad_values(bad):
    with pytest.raises(ConfigError, match="costs.finish_rtol"):
        CostModel.build(star(), {"finish_rtol": bad})
