"""Symmetric runs (sim.engine.symmetric) equal the full simulation wherever both run.

One replica's graph with its data-parallel replicas folded onto the network (and, where the
nodes of a replica are equivalent, one node simulated for all) gives, to 1e-9, the makespan,
every task's start and end, link bytes and peak memory of the full graph built by
`sim.workload.parallel.replicate`. The fabrics put replicas on shared, oversubscribed leaf
uplinks (rail-optimised units holding several replicas), on leaf groups of their own, and on
one switch. Where symmetry does not hold, the run says why and simulates the full graph.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sim.analysis.summary import format_summary, summarize
from sim.analysis.trace import to_frame
from sim.config import RunConfig
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.engine.equivalence import node_classes, place
from sim.engine.symmetric import plan, simulate_replicas
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.workload.parallel import replicate
from tests.golden import outputs

MODEL = outputs.MODEL  # the golden cases' layer
RAIL = {"nodes_per_unit": 4, "oversubscription": 2}  # two 2-node replicas per unit
ZIPF = {"routing": {"kind": "zipf", "s": 1.2, "seed": 3}}


def pieces(
    preset: str,
    nodes: int,
    strategy: dict[str, Any],
    parallel: dict[str, int],
    fabric: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    costs: dict[str, Any] | None = None,
):
    """(one replica's graph, topology, costs, replica ranks, full-graph builder)."""
    cfg = RunConfig.from_dict(
        {
            "topology": preset,
            "nodes": nodes,
            "fabric": fabric or {},
            "model": {**MODEL, **(model or {})},
            "strategy": strategy,
            "parallel": parallel,
            "passes": ["fwd", "bwd"],
            "costs": {"symmetry": "on", **(costs or {})},
        }
    )
    topo = cfg.load_topology()
    wl = cfg.workload(topo)
    c = CostModel.build(topo, cfg.costs)
    g = build(cfg.strategy, wl.layer, wl.params, cfg.passes, Cluster(topo, c))
    lay = wl.layout
    ranks = np.stack([lay.replica_ranks(d) for d in range(lay.dp)])
    return g, topo, c, ranks, lambda: replicate(g, lay)


def both(*args, **kwargs):
    g, topo, c, ranks, full = pieces(*args, **kwargs)
    prefix = "dp0/" if len(ranks) > 1 else ""
    sym = simulate_replicas(g, topo, c, ranks, full=full, prefix=prefix)
    ref = simulate(full(), topo, replace(c, symmetry="off"))
    return sym, ref, len(ranks)


def assert_same(sym, ref, replicas: int) -> None:
    span = ref.makespan
    assert sym.makespan == pytest.approx(span, rel=1e-9, abs=0)
    tol = 1e-9 * span
    at = {t.id: i for i, t in enumerate(ref.graph)}
    n = len(sym.graph)
    for d in range(replicas):  # every replica of the full run does what the first did
        prefix = f"dp{d}/" if replicas > 1 else ""
        idx = np.array([at[prefix + t.id.removeprefix("dp0/")] for t in sym.graph])
        np.testing.assert_allclose(ref.start[idx], sym.start, rtol=0, atol=tol)
        np.testing.assert_allclose(ref.end[idx], sym.end, rtol=0, atol=tol)
        np.testing.assert_allclose(ref.sync_wait[idx], sym.sync_wait, rtol=0, atol=tol)
    assert len(ref.graph) == n * replicas
    np.testing.assert_allclose(
        sym.link_bytes, ref.link_bytes, rtol=1e-9, atol=1e-9 * ref.link_bytes.max()
    )
    np.testing.assert_allclose(sym.mem_peak, ref.mem_peak, rtol=1e-12)


STRATEGIES = [
    {"name": "sequential"},
    {"name": "pipelined", "degree": 4, "order": "tutel"},
    {"name": "pipelined", "degree": 2, "order": "alternating", "algo": "2dh"},
    {"name": "pipelined", "degree": 2, "order": "two_streams", "algo": "rail_relay"},
    {"name": "pipemoe"},
    {"name": "tutel"},
    {"name": "ted", "tp": 2},
    {"name": "mpipemoe", "degree": 2, "reuse": "S1"},
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: "-".join(map(str, s.values())))
def test_replicas_sharing_rail_uplinks_equal_the_full_run(strategy):
    costs = {}
    if strategy["name"] == "pipemoe":  # its selector reads alpha-beta GEMM costs
        costs = {
            "compute": "alpha_beta",
            "alpha_beta": {"gemm": {"alpha": 2e-5, "beta": 1e-14}},
            "collectives": {"all_to_all": {"alpha": 2e-5, "beta": 3e-10}},
        }
    sym, ref, dp = both("dgx-h100-superpod", 8, strategy, {"dp": 4}, RAIL, costs=costs)
    info = sym.stats["symmetry"]
    assert info["used"] and info["replicas"] == 4 and info["replica_placement"] == "within"
    assert info["ranks_simulated"] == 8  # one node stands for the replica's two
    assert_same(sym, ref, dp)


@pytest.mark.parametrize(
    "preset, nodes, fabric, parallel, placement",
    [
        ("dgx-h100-superpod", 8, {"nodes_per_unit": 2, "oversubscription": 2}, 32, "whole"),
        (
            "dgx-a100",
            8,
            {"type": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 2},
            32,
            "whole",
        ),
        (
            "dgx-a100",
            8,
            {"type": "fat_tree", "nodes_per_leaf": 4, "oversubscription": 2},
            16,
            "within",
        ),
        ("flat-switch", 32, None, 8, "none"),
    ],
)
def test_placements_equal_the_full_run(preset, nodes, fabric, parallel, placement):
    strategy = {"name": "pipelined", "degree": 2}
    sym, ref, dp = both(preset, nodes, strategy, {"ep": parallel}, fabric)
    assert sym.stats["symmetry"]["replica_placement"] == placement
    assert_same(sym, ref, dp)


def test_shadow_flows_matter():
    """Two replicas per unit share its oversubscribed uplinks: alone, a replica is faster."""
    strategy = {"name": "pipelined", "degree": 2}
    sym, ref, dp = both("dgx-h100-superpod", 8, strategy, {"ep": 16, "dp": 4}, RAIL)
    alone, _, _ = both("dgx-h100-superpod", 2, strategy, {"ep": 16, "dp": 1}, RAIL)
    assert sym.makespan > 1.2 * alone.makespan
    assert_same(sym, ref, dp)


def test_interference_and_dispatch_follow_the_representatives():
    costs = {
        "interference": {"compute": {"comm": 0.8}, "comm": {"compute": 0.7}},
        "dispatch": {"stream": 2e-6, "cross": 5e-6},
    }
    strategy = {"name": "pipelined", "degree": 2, "order": "two_streams"}
    sym, ref, dp = both("dgx-h100-superpod", 8, strategy, {"ep": 16, "dp": 4}, RAIL, costs=costs)
    assert sym.stats["symmetry"]["used"]
    assert_same(sym, ref, dp)


@pytest.mark.parametrize(
    "strategy, model, why",
    [
        ({"name": "pipelined", "degree": 2}, ZIPF, "all_to_allv"),
        ({"name": "fastermoe"}, None, "all_gather (ring)"),
    ],
)
def test_node_classes_refused_replicas_still_folded(strategy, model, why):
    """Skewed routing (or a ring across nodes) makes a replica's nodes differ: every rank of
    the first replica is simulated, the other replicas still folded, and the run says why."""
    sym, ref, dp = both("dgx-h100-superpod", 8, strategy, {"ep": 16, "dp": 4}, RAIL, model)
    info = sym.stats["symmetry"]
    assert info["used"] and info["ranks_simulated"] == 16
    assert info["node_classes"].startswith("off") and why in info["node_classes"]
    assert_same(sym, ref, dp)


def test_replicas_straddling_leaf_groups_fall_back_to_the_full_run():
    fabric = {"type": "fat_tree", "nodes_per_leaf": 4, "oversubscription": 2}
    g, topo, c, ranks, full = pieces(
        "dgx-a100", 6, {"name": "sequential"}, {"ep": 24, "dp": 2}, fabric
    )
    res = simulate_replicas(g, topo, c, ranks, full=full)
    assert res.stats["symmetry"] == {
        "used": False,
        "reason": "replica 0 covers part of a leaf group of 4 nodes",
    }
    assert len(res.graph) == 2 * len(g)
    assert res.makespan == simulate(full(), topo, c).makespan
    with pytest.raises(ValueError, match="no full graph"):
        simulate_replicas(g, topo, c, ranks)


def test_jitter_and_off_are_full_runs():
    g, topo, c, ranks, full = pieces(
        "dgx-h100-superpod", 8, {"name": "sequential"}, {"ep": 16, "dp": 4}, RAIL
    )
    assert plan(g, topo, replace(c, symmetry="off"), ranks) == "off (costs.symmetry)"
    res = simulate_replicas(g, topo, replace(c, symmetry="off"), ranks, full=full)
    assert "symmetry" not in res.stats and len(res.graph) == 4 * len(g)
    jit = CostModel.build(topo, {"jitter": {"quantiles": {"gemm": [0.9, 1.0, 1.1]}}})
    assert "jitter" in plan(g, topo, jit, ranks)


def test_auto_leaves_small_runs_alone():
    """Below SYMMETRY_MIN_RANKS `auto` runs the plain engine and adds nothing to its stats."""
    g, topo, c, ranks, _ = pieces("dgx-h100-superpod", 2, {"name": "sequential"}, {"ep": 16}, RAIL)
    auto = replace(c, symmetry="auto")
    assert plan(g, topo, auto, ranks).startswith("auto")
    res = simulate_replicas(g, topo, auto, ranks)
    assert "symmetry" not in res.stats
    on = simulate_replicas(g, topo, c, ranks)
    assert on.stats["symmetry"]["ranks_simulated"] == 8
    assert_same(on, res, 1)


def test_summary_and_trace_say_what_was_simulated():
    g, topo, c, ranks, full = pieces(
        "dgx-h100-superpod", 8, {"name": "sequential"}, {"ep": 16, "dp": 4}, RAIL
    )
    res = simulate_replicas(g, topo, c, ranks, full=full, prefix="dp0/")
    df = to_frame(res)
    assert sorted(df["rank"].unique()) == list(range(16))  # the first replica's ranks
    assert df["id"].str.startswith("dp0/").all()
    s = summarize(res, df)
    assert s["world_size"] == 64 and s["symmetry"]["ranks_simulated"] == 8
    assert "64 ranks as 8 simulated" in format_summary(s)


# -- the checks themselves ------------------------------------------------------------------
def two_nodes() -> Topology:
    return Topology.load("dgx-a100", nodes=2)


def test_node_classes_reasons():
    G = 8
    g = TaskGraph(16)
    for r in range(16):
        g.add(Task(f"a{r}", r, "compute", "elementwise", bytes=1.0))
    assert node_classes(g, G) is None
    g.add(Task("x", 9, "compute", "elementwise", deps=["a1"]))
    assert "depends on 'a1' on another node" in node_classes(g, G)
    h = TaskGraph(16)
    for r in range(16):
        h.add(Task(f"a{r}", r, "compute", "elementwise", bytes=1.0 + (r == 12)))
    assert (
        node_classes(h, G)
        == "rank 12 does not do what rank 4 does (task 0 on 'compute' differs in bytes)"
    )
    ring = TaskGraph(16)
    grp = list(range(16))
    for r in range(16):
        ring.add(Task(f"ag{r}", r, "comm", "all_gather", bytes=8.0, group=grp, coll="ag"))
    assert "all_gather (ring) 'ag' spans nodes" in node_classes(ring, G)


def test_place_reasons():
    topo = Topology.load("dgx-a100", nodes=4, fabric={"type": "fat_tree", "nodes_per_leaf": 2})
    assert place(topo, np.arange(32).reshape(2, 16)).units == "within"
    assert "not whole nodes" in place(topo, np.arange(32).reshape(8, 4))
    assert place(topo, np.arange(32).reshape(1, 32)).units == "whole"
    assert "different orders" in place(topo, np.array([np.arange(16), np.r_[24:32, 16:24]]))
    assert "share nodes" in place(topo, np.array([np.arange(16), np.arange(16)]))


# -- the golden cases, forced to use symmetry -------------------------------------------------
GOLDEN = outputs.configs()
GOLDEN_WANT = json.loads(outputs.DIGESTS.read_text())


def _golden_params():
    for i, (name, cfg) in enumerate(GOLDEN):
        marks = () if i % 8 == 0 else (pytest.mark.slow,)
        yield pytest.param(name, cfg, id=name, marks=marks)


@pytest.mark.parametrize("name,cfg", list(_golden_params()))
def test_golden_cases_unmoved_with_symmetry_on(name, cfg, monkeypatch):
    """`costs.symmetry: on` (representatives wherever exact, at any size) leaves every golden
    case's makespan, graph and trace digests as recorded (the summary's simulation-effort
    counters differ by design)."""
    import sim.engine.symmetric as symmetric

    plans = []

    def recorded(*args, **kwargs):
        plans.append(plan(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(symmetric, "plan", recorded)
    forced = {**cfg, "costs": {**cfg.get("costs", {}), "symmetry": "on"}}
    got, want = outputs.digest(forced), GOLDEN_WANT[name]
    for key in ("makespan_s", "tasks", "graph", "trace", "error"):
        assert got.get(key) == want.get(key), key
    assert plans or "error" in want  # the run went through the symmetric path


def test_golden_cases_use_symmetry_where_they_can():
    """The check above is not vacuous: node classes apply to most uniform golden cases."""
    pipelined = dict(GOLDEN)["dgx-a100/pipelined[degree=4-order=tutel]/base"]
    cfg = RunConfig.from_dict({**pipelined, "costs": {"symmetry": "on"}})
    topo = cfg.load_topology()
    wl = cfg.workload(topo)
    c = CostModel.build(topo, cfg.costs)
    g = build(cfg.strategy, wl.layer, wl.params, cfg.passes, Cluster(topo, c))
    assert plan(g, topo, c).symmetry.info["ranks_simulated"] == 8


@pytest.mark.parametrize(
    "strategy, resources",
    [
        (
            {
                "name": "megatron_ep",
                "dispatcher": "flex",
                "micro": 2,
                "layers": 1,
                "shared": 1,
                "heads": 8,
            },
            {"max_connections": 1, "comm_sm_bw": 2e9},
        ),
        ({"name": "deepep", "sms": 8}, {"comm_sm_bw": 1e9}),
    ],
    ids=["megatron-one-queue-sm-bound", "deepep-sm-bound"],
)
def test_gpu_resources_follow_the_representatives(strategy, resources):
    """One hardware queue held by many-wave kernels and kernels bound to their SMs' send
    rate give the full run's times on the replicas' representatives."""
    assert_same(*both("dgx-h100", 4, strategy, {"ep": 8}, costs={"resources": resources}))
