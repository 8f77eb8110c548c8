"""Engine semantics: stream order, rendezvous, interference, memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.core.errors import GraphError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from tests.test_network import star

TOPO = star()


def costs(**extra) -> CostModel:
    spec = {
        "compute": "alpha_beta",
        "alpha": 0.0,
        "alpha_beta": {
            "gemm": {"alpha": 10.0, "beta": 0.0},
            "elementwise": {"alpha": 1.0, "beta": 0.0},
        },
    }
    spec.update(extra)
    return CostModel.build(TOPO, spec)


def ends(res) -> dict[str, float]:
    return {t.id: float(e) for t, e in zip(res.graph, res.end)}


def test_stream_program_order_and_cross_stream_deps():
    g = TaskGraph(1)
    g.add(Task("a", 0, "compute", "elementwise"))
    g.add(Task("b", 0, "compute", "elementwise"))
    g.add(Task("c", 0, "copy", "elementwise", deps=["a"]))
    g.add(Task("d", 0, "copy", "elementwise"))
    res = simulate(g, TOPO, costs())
    e = ends(res)
    assert (e["a"], e["b"], e["c"], e["d"]) == (1.0, 2.0, 2.0, 3.0)


def test_dispatch_latency_same_stream_and_cross_stream():
    """Closed form: each start is (what made the task ready) + its dispatch latency."""
    g = TaskGraph(1)
    g.add(Task("a", 0, "compute", "elementwise"))
    g.add(Task("b", 0, "compute", "elementwise"))
    g.add(Task("c", 0, "copy", "elementwise", deps=["a"]))
    g.add(Task("d", 0, "copy", "elementwise"))
    res = simulate(g, TOPO, costs(dispatch={"stream": 0.25, "cross": 0.5}))
    starts = {t.id: float(s) for t, s in zip(res.graph, res.start)}
    # a at 0 (ready at the start); b after a on its stream; c woken by a from another
    # stream; d after c on its stream
    assert starts == {"a": 0.0, "b": 1.25, "c": 1.5, "d": 2.75}
    assert ends(res) == {"a": 1.0, "b": 2.25, "c": 2.5, "d": 3.75}
    # the default is the ideal engine
    assert ends(simulate(g, TOPO, costs()))["d"] == 3.0


@pytest.mark.parametrize(
    "bad, field",
    [({"stream": -1.0}, "costs.dispatch.stream"), ({"wake": 0.1}, "unknown"), (3, "mapping")],
)
def test_dispatch_latency_bad_input(bad, field):
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        costs(dispatch=bad)


def test_collective_starts_when_last_member_launches():
    g = TaskGraph(2)
    g.add(Task("late", 1, "compute", "gemm"))  # 10 s
    g.add(Task("x0", 0, "comm", "all_to_all", bytes=0.0, group=[0, 1], coll="x"))
    g.add(Task("x1", 1, "comm", "all_to_all", bytes=0.0, group=[0, 1], coll="x", deps=["late"]))
    c = costs(network="collective", collectives={"all_to_all": {"alpha": 2.0, "beta": 0.0}})
    res = simulate(g, TOPO, c)
    e = ends(res)
    assert e["x0"] == e["x1"] == 12.0
    waits = {t.id: w for t, w in zip(res.graph, res.sync_wait)}
    assert waits["x0"] == 10.0 and waits["x1"] == 0.0


def _overlap_graph() -> TaskGraph:
    g = TaskGraph(1)
    g.add(Task("gemm", 0, "compute", "gemm"))  # 10 s alone
    g.add(Task("a2a", 0, "comm", "all_to_all", bytes=0.0, group=[0], coll="x"))  # 4 s alone
    return g


def test_interference_slows_compute_while_comm_runs():
    c = costs(
        network="collective",
        collectives={"all_to_all": {"alpha": 4.0, "beta": 0.0}},
        interference={"compute": {"comm": 0.5}},
    )
    e = ends(simulate(_overlap_graph(), TOPO, c))
    # 4 s at half speed = 2 s of work, then 8 s at full speed
    assert e["a2a"] == 4.0 and math.isclose(e["gemm"], 12.0)


def test_interference_slows_comm_while_compute_runs():
    c = costs(
        network="collective",
        collectives={"all_to_all": {"alpha": 4.0, "beta": 0.0}},
        interference={"comm": {"compute": 0.5}},
    )
    e = ends(simulate(_overlap_graph(), TOPO, c))
    assert e["gemm"] == 10.0 and math.isclose(e["a2a"], 8.0)


def test_no_interference_by_default():
    c = costs(network="collective", collectives={"all_to_all": {"alpha": 4.0, "beta": 0.0}})
    e = ends(simulate(_overlap_graph(), TOPO, c))
    assert (e["gemm"], e["a2a"]) == (10.0, 4.0)


def test_interference_scales_flows():
    g = TaskGraph(4)
    g.add(Task("gemm", 0, "compute", "elementwise"))  # 1 s
    g.add(Task("s", 0, "comm", "send", peer=1, bytes=15e9, coll="p"))  # 1.5 s alone at 10 GB/s
    g.add(Task("r", 1, "comm", "recv", peer=0, bytes=15e9, coll="p"))
    c = costs(interference={"comm": {"compute": 0.5}})
    e = ends(simulate(g, TOPO, c))
    # 1 s at 5 GB/s moves 5 GB; the other 10 GB take 1 s at full rate
    assert math.isclose(e["s"], 2.0, rel_tol=1e-12)


def test_memory_peak_and_free():
    g = TaskGraph(1)
    g.add(Task("a", 0, "compute", "elementwise", allocs={"x": 100.0}))
    g.add(Task("b", 0, "compute", "elementwise", allocs={"y": 50.0}, frees=["x"]))
    g.add(Task("c", 0, "compute", "elementwise", frees=["y"]))
    res = simulate(g, TOPO, costs())
    assert res.mem_peak[0] == 150.0
    assert res.mem_timeline[-1][2] == 0.0


def test_freeing_an_unknown_buffer_is_an_error():
    g = TaskGraph(1)
    g.add(Task("a", 0, "compute", "elementwise", frees=["nope"]))
    with pytest.raises(GraphError, match="'a'.*'nope'"):
        simulate(g, TOPO, costs())


def test_graph_larger_than_cluster_is_an_error():
    g = TaskGraph(8)
    g.add(Task("a", 7, "compute", "elementwise"))
    with pytest.raises(GraphError, match="8 ranks.*only 4 GPUs"):
        simulate(g, TOPO, costs())


def test_copies_use_the_host_route():
    from sim.hardware.topology import Topology

    topo = Topology.load("dgx-a100", nodes=1)
    g = TaskGraph(8)
    g.add(Task("off", 0, "copy", "d2h", bytes=1e9))
    g.add(Task("off1", 1, "copy", "d2h", bytes=1e9))  # shares pcie0 -> host with rank 0
    res = simulate(g, topo, CostModel.build(topo, {"alpha": 0.0}))
    pcie = topo.link_classes["pcie4"]
    lat = 2 * pcie.latency
    assert math.isclose(res.makespan, lat + 2e9 / pcie.eff_bw, rel_tol=1e-12)


def test_copy_interference_applies_to_host_copies():
    from sim.hardware.topology import Topology

    topo = Topology.load("dgx-a100", nodes=1)
    pcie = topo.link_classes["pcie4"]
    g = TaskGraph(8)
    g.add(Task("work", 0, "compute", "elementwise"))
    g.add(Task("off", 0, "copy", "d2h", bytes=2 * pcie.eff_bw))  # 2 s alone
    spec = {
        "compute": "alpha_beta",
        "alpha": 0.0,
        "alpha_beta": {"elementwise": {"alpha": 1.0, "beta": 0.0}},
    }
    slow = CostModel.build(topo, {**spec, "interference": {"copy": {"compute": 0.5}}})
    comm_only = CostModel.build(topo, {**spec, "interference": {"comm": {"compute": 0.5}}})
    lat = 2 * pcie.latency
    # the copy starts after the path latency; while the 1 s of compute runs it moves at half rate
    e = ends(simulate(g, topo, slow))
    assert math.isclose(e["off"], lat + 2.0 + 0.5 * (1.0 - lat), rel_tol=1e-9)
    e = ends(simulate(g, topo, comm_only))
    assert math.isclose(e["off"], lat + 2.0, rel_tol=1e-9)


def test_exposed_communication_is_comm_time_not_covered_by_compute():
    from sim.analysis.summary import exposed

    comm = np.array([[0.0, 4.0], [6.0, 10.0]])
    compute = np.array([[1.0, 2.0], [3.0, 7.0], [9.0, 12.0]])
    # comm covers [0,4] u [6,10] = 8; compute covers [1,2], [3,4], [6,7], [9,10] of it = 4
    assert exposed(comm, compute) == pytest.approx(4.0)
    assert exposed(comm, np.zeros((0, 2))) == pytest.approx(8.0)
