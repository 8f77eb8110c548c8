"""The parallel layout `parallel: {ep, dp, tp, esp, pp}`: sizes, placement, rank groups,
replicas of one replica's graph, replicas that share a fabric contending for it, and a
pipeline strategy's devices."""

from __future__ import annotations

import pytest

from sim import commands
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.hardware.topology import Topology
from sim.workload.parallel import ParallelLayout, from_spec

MODEL = {
    "batch": 1,
    "seq_len": 256,
    "model_dim": 512,
    "hidden_dim": 1024,
    "experts_per_gpu": 1,
    "top_k": 2,
    "dtype": "bf16",
}


def _cfg(**over):
    raw = {
        "topology": "dgx-a100",
        "nodes": 4,
        "model": dict(MODEL),
        "strategy": {"name": "pipelined", "degree": 2},
        "passes": ["fwd", "bwd"],
    }
    raw.update(over)
    return RunConfig.from_dict(raw)


def test_missing_sizes_are_derived_from_the_world():
    assert from_spec({"ep": 64}, 16384, 8).as_dict() == {"ep": 64, "dp": 256, "tp": 1, "esp": 1}
    assert from_spec({"dp": 4, "tp": 2}, 64, 8).as_dict() == {"ep": 8, "dp": 4, "tp": 2, "esp": 1}
    assert from_spec(None, 32, 8).as_dict() == {"ep": 32, "dp": 1, "tp": 1, "esp": 1}


@pytest.mark.parametrize(
    "spec,where",
    [
        ({"ep": 8, "dp": 3}, "parallel: ep 8 x dp 3 x tp 1 x esp 1 = 24"),
        ({"ep": 7}, "parallel: ep 7 x tp 1 x esp 1 does not divide the 32 GPUs"),
        ({"ep": 2, "tp": 16}, "parallel.tp: TP groups of 16 GPUs"),
        ({"ep": 2, "esp": 16}, "parallel.esp: expert slices over 16 GPUs"),
        ({"ep": True}, "parallel.ep: expected a positive integer, got True"),
        ({"ep": 2.0}, "parallel.ep: expected a positive integer, got 2.0"),
        ({"ep": 0}, "parallel.ep: expected a positive integer, got 0"),
        ({"epp": 8}, "parallel: unknown field(s) ['epp']"),
    ],
)
def test_bad_layouts_name_the_field(spec, where):
    with pytest.raises(ConfigError, match=None) as e:
        from_spec(spec, 32, 8)
    assert where in str(e.value)


def test_groups_partition_the_world_with_tp_innermost():
    lay = ParallelLayout(ep=4, dp=2, tp=2, esp=2, gpus_per_node=8)
    assert lay.world == 32 and lay.mp == 16
    for kind, size in (("ep", 4), ("dp", 2), ("tp", 2), ("esp", 2)):
        groups = lay.groups(kind)
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(32)), kind
    assert lay.tp_group(5) == [4, 5]  # consecutive ranks
    assert lay.esp_group(5) == [5, 7]  # inside the node, after TP
    assert lay.ep_group(5) == [1, 5, 9, 13]  # same (esp, tp) in each EP slot of replica 0
    assert lay.dp_group(5) == [5, 21]
    for r in range(32):  # TP and ESP groups never leave a node
        assert len({x // 8 for x in lay.tp_group(r) + lay.esp_group(r)}) == 1
        assert lay.rank(**lay.coords(r)) == r


def test_a_config_without_parallel_keeps_one_ep_group_of_the_world():
    cfg = _cfg()
    wl = cfg.workload(cfg.load_topology())
    assert wl.layout.as_dict() == {"ep": 32, "dp": 1, "tp": 1, "esp": 1}
    assert wl.layer.world == 32 and wl.layer.experts == 32
    ted = _cfg(strategy={"name": "ted", "tp": 4})
    assert ted.workload(ted.load_topology()).layout.as_dict() == {
        "ep": 8,
        "dp": 1,
        "tp": 4,
        "esp": 1,
    }


def test_replicas_build_one_replica_and_lay_it_over_the_world():
    r = commands.simulate_config(_cfg(parallel={"ep": 8}))
    g = r.graph
    assert g.world_size == 32 and g.meta["layout"] == {"ep": 8, "dp": 4, "tp": 1, "esp": 1}
    one = commands.simulate_config(_cfg(nodes=1)).graph  # the replica alone: ranks 0..7
    assert len(g) == 4 * len(one)
    for t in g:
        d = t.rank // 8
        assert t.id.startswith(f"dp{d}/")
        if t.group is not None:  # every collective stays inside its replica
            assert {m // 8 for m in t.group} == {d}
    # replicas on separate nodes of a non-blocking fabric do not slow each other
    assert r.summary["makespan_s"] == pytest.approx(
        commands.simulate_config(_cfg(nodes=1)).summary["makespan_s"]
    )


def test_replicas_sharing_leaf_uplinks_slow_each_other_down():
    """Two replicas of 2 nodes on leaves of 3 nodes: leaf 1 carries replica 0's node 2 and
    replica 1's node 3; with oversubscribed uplinks their all-to-alls contend there."""
    fabric = {"type": "fat_tree", "nodes_per_leaf": 3, "oversubscription": 4.0}
    alone = commands.simulate_config(_cfg(nodes=2, fabric=fabric, passes=["fwd"])).summary[
        "makespan_s"
    ]
    both = commands.simulate_config(
        _cfg(fabric=fabric, parallel={"ep": 16}, passes=["fwd"])
    ).summary
    assert both["makespan_s"] > alone * 1.01
    flat = {"type": "switch"}
    alone_flat = commands.simulate_config(_cfg(nodes=2, fabric=flat, passes=["fwd"])).summary[
        "makespan_s"
    ]
    both_flat = commands.simulate_config(
        _cfg(fabric=flat, parallel={"ep": 16}, passes=["fwd"])
    ).summary
    assert both_flat["makespan_s"] == pytest.approx(alone_flat, rel=1e-9)


def test_ted_takes_its_tp_from_the_layout():
    r = commands.simulate_config(_cfg(strategy={"name": "ted"}, parallel={"tp": 4, "dp": 2}))
    assert r.graph.meta["tp"] == 4 and r.graph.meta["ep"] == 4
    assert r.graph.meta["layout"] == {"ep": 4, "dp": 2, "tp": 4, "esp": 1}
    same = commands.simulate_config(_cfg(strategy={"name": "ted", "tp": 4}, parallel={"dp": 2}))
    assert same.summary["makespan_s"] == r.summary["makespan_s"]


@pytest.mark.parametrize(
    "over,where",
    [
        (
            {"strategy": {"name": "ted", "tp": 2}, "parallel": {"tp": 4}},
            "parallel.tp: 4 disagrees with strategy.tp 2",
        ),
        ({"parallel": {"tp": 2}}, "parallel.tp: strategy 'pipelined' does not shard"),
        ({"parallel": {"esp": 2}}, "parallel.esp: 2 GPUs per expert needs 16 experts"),
        (
            {"model": {**MODEL, "experts_per_gpu": None, "experts": 8}, "parallel": {"dp": 2}},
            "parallel.esp: 8 experts over 16 GPUs slice each expert over 2 GPUs: give esp: 2",
        ),
        ({"parallel": [8]}, "parallel: expected a mapping"),
    ],
)
def test_config_layout_errors_name_the_field(over, where):
    if over.get("model", {}).get("experts_per_gpu", 1) is None:
        over["model"].pop("experts_per_gpu")
    with pytest.raises(ConfigError) as e:
        cfg = _cfg(**over)
        cfg.workload(cfg.load_topology())
    assert where in str(e.value)


def test_sliced_experts_take_esp_from_the_layout():
    model = {**MODEL, "experts": 8}
    model.pop("experts_per_gpu")
    cfg = _cfg(
        strategy={"name": "tutel", "parallel": "p1"},
        model=model,
        parallel={"ep": 8, "esp": 2, "dp": 2},
    )
    r = commands.simulate_config(cfg)
    assert r.graph.meta["expert_shards"] == 2
    gathers = [t for t in r.graph if t.kind == "all_gather"]
    assert gathers and all(len(t.group) == 2 and t.group[1] == t.group[0] + 1 for t in gathers)


def test_topology_world_checks_against_the_layout():
    topo = Topology.load("dgx-a100", nodes=2)
    with pytest.raises(ConfigError, match="the product must be the world"):
        from_spec({"ep": 8, "dp": 4}, topo.world_size, topo.gpus_per_node)


def test_pipeline_devices_are_a_factor_of_the_world():
    lay = from_spec({"ep": 8, "pp": 2}, 64, 8)
    assert lay.as_dict() == {"ep": 8, "dp": 4, "tp": 1, "esp": 1, "pp": 2}
    assert (lay.mp, lay.replica, lay.world) == (8, 16, 64)
    assert list(lay.replica_ranks(1)) == list(range(16, 32))
    assert from_spec({"dp": 2, "pp": 4}, 64, 8).ep == 8
    with pytest.raises(ConfigError, match="ep 8 x dp 3 x tp 1 x esp 1 x pp 2 = 48"):
        from_spec({"ep": 8, "dp": 3, "pp": 2}, 64, 8)


def _dualpipe(**strategy):
    return _cfg(
        topology="dgx-h100",
        nodes=4,
        parallel={"ep": 8, "pp": 2, "dp": 2},
        strategy={"name": "dualpipe", "layers": 1, **strategy},
        model={**MODEL, "experts_per_gpu": 2},
    )


@pytest.mark.parametrize("variant,stages", [("dualpipe", 2), ("dualpipev", 4)])
def test_dualpipe_takes_its_devices_from_parallel_pp(variant, stages):
    """2 replicas of 2 pipeline devices of EP 8 on 32 GPUs: the replica's graph is the
    pipeline (DualPipe: a stage per device; DualPipeV: the V's two per device), laid over
    both replicas, every collective inside one device's EP group."""
    r = commands.simulate_config(_dualpipe(variant=variant))
    g = r.graph
    assert g.world_size == 32 and g.meta["layout"]["pp"] == 2 and g.meta["pp"] == stages
    for t in g:
        if t.group is not None and t.kind != "all_reduce":
            assert len({m // 8 for m in t.group}) == 1, t.id  # one device's EP group
    assert {t.rank // 16 for t in g} == {0, 1} and r.summary["makespan_s"] > 0


@pytest.mark.parametrize(
    "cfg,where",
    [
        (lambda: _cfg(parallel={"ep": 8, "pp": 4}), "parallel.pp: strategy 'pipelined' has no"),
        (lambda: _dualpipe(pp=4), "parallel.pp: 2 pipeline devices run 2 dualpipe stages, but"),
        (
            lambda: _cfg(parallel={"dp": 4}, strategy={"name": "dualpipe"}),
            "parallel.pp: dualpipe needs at least 2 pipeline devices",
        ),
        (
            lambda: _cfg(nodes=3, parallel={"ep": 8, "pp": 3}, strategy={"name": "dualpipe"}),
            "parallel.pp: dualpipe's two directions need an even number of pipeline devices",
        ),
    ],
)
def test_pipeline_layout_errors_name_the_field(cfg, where):
    with pytest.raises(ConfigError) as e:
        c = cfg()
        c.workload(c.load_topology())
    assert where in str(e.value)
