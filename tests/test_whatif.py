"""What-if: changes move the makespan by what the closed form gives; bad keys are one-line
ConfigErrors that list the known keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.analysis.whatif import format_whatif, whatif, whatif_command
from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies import resolve_params

EXEC = Path(__file__).resolve().parents[1] / "traces" / "exec-gloo-2r"
PORT_BW = 300e9  # flat-switch: one 300 GB/s port per GPU, no latency, alpha 0, efficiency 1
PEAK_BF16 = 312e12  # flat-switch's GPU, roofline with launch 0 and efficiency 1


def _all_to_all(P: int, nbytes: float) -> TaskGraph:
    g = TaskGraph(P)
    group = list(range(P))
    for r in range(P):
        g.add(Task(f"r{r}/a2a", r, "comm", "all_to_all", bytes=nbytes, group=group, coll="a2a"))
    return g


def _gemms(flops: list[float]) -> TaskGraph:
    g = TaskGraph(1)
    for i, f in enumerate(flops):
        g.add(Task(f"g{i}", 0, "compute", "gemm", flops=f, bytes=1e6, tags={"dtype": "bf16"}))
    return g


@pytest.mark.parametrize("change", ["link.*.bw=*2", "link.port.bw=6e11"])
def test_doubling_link_bandwidth_halves_a_communication_bound_step(change):
    """A pure all-to-all on a flat switch (flow network, no latency): each rank's port
    carries (P-1)/P of its bytes, so T = (P-1)/P * B / bw, and half that at 2 bw."""
    P, B = 8, 64e6
    w = whatif(_all_to_all(P, B), [change], topology="flat-switch")
    closed = (P - 1) / P * B / PORT_BW
    assert w.before["makespan_s"] == pytest.approx(closed, rel=1e-9)
    assert w.after["makespan_s"] == pytest.approx(closed / 2, rel=1e-9)
    assert w.after["busy_s"]["comm"] == pytest.approx(closed / 2, rel=1e-9)


def test_doubling_link_bandwidth_on_a_run_config():
    """The same on a layer whose GEMMs are negligible (H = 8): the communication time
    halves, compute does not move, and as `sequential` overlaps nothing, the makespan drops
    by half the communication time: T' = T - T_comm / 2."""
    cfg = {
        "topology": "flat-switch",
        "nodes": 4,
        "model": {
            "batch": 1,
            "seq_len": 512,
            "model_dim": 1024,
            "hidden_dim": 8,
            "experts_per_gpu": 1,
            "top_k": 1,
            "dtype": "bf16",
        },
        "strategy": "sequential",
        "costs": {"network": "flow"},
    }
    w = whatif(cfg, ["link.*.bw=*2"])
    b, a = w.before, w.after
    assert a["busy_s"]["comm"] == pytest.approx(b["busy_s"]["comm"] / 2, rel=1e-9)
    assert a["busy_s"]["compute"] == pytest.approx(b["busy_s"]["compute"], rel=1e-12)
    assert b["busy_s"]["comm"] > b["busy_s"]["compute"]  # communication-bound
    saved = b["makespan_s"] - a["makespan_s"]
    assert saved == pytest.approx(b["busy_s"]["comm"] / 2, rel=1e-9)  # sequential: no overlap


def test_halving_compute_speed_doubles_a_compute_bound_step():
    """One rank, GEMMs only (roofline, no launch cost): T = sum(flops) / peak, doubled at
    half the speed."""
    flops = [1e12, 2e12, 3e12]
    w = whatif(_gemms(flops), ["compute.speed=*0.5"], topology="flat-switch")
    closed = sum(flops) / PEAK_BF16
    assert w.before["makespan_s"] == pytest.approx(closed, rel=1e-12)
    assert w.after["makespan_s"] == pytest.approx(2 * closed, rel=1e-12)
    same = whatif(_gemms(flops), ["compute.speed=0.5"], topology="flat-switch")
    assert same.after["makespan_s"] == pytest.approx(2 * closed, rel=1e-12)


def test_no_change_is_the_base():
    w = whatif(_gemms([1e12]), [], topology="flat-switch")
    assert w.after["makespan_s"] == w.before["makespan_s"]
    assert w.after_trace.equals(w.before_trace)


def test_config_changes_strategy_layer_and_cluster():
    cfg = {
        "topology": "flat-switch",
        "nodes": 4,
        "model": {
            "batch": 1,
            "seq_len": 256,
            "model_dim": 256,
            "hidden_dim": 512,
            "experts_per_gpu": 1,
            "top_k": 2,
            "capacity_factor": 1.0,
        },
        "strategy": "sequential",
    }
    w = whatif(
        cfg,
        [
            "strategy.degree=*2",
            "strategy=pipelined",
            "nodes=*2",
            "model.capacity_factor=2.0",
            "model.routing.s=1.5",
        ],
    )
    b, a = w.before, w.after
    assert (b["strategy"], a["strategy"]) == ("sequential", "pipelined")
    # the strategy is set first, so *2 doubles the new strategy's default degree
    assert a["params"]["degree"] == 2 * resolve_params("pipelined", {})["degree"]
    assert (b["world_size"], a["world_size"]) == (4, 8)
    assert any("zipf" in n for n in a["whatif"]["notes"])
    assert a["whatif"]["changes"][0] == "strategy.degree=*2"


def test_gpu_resources_are_what_if_keys():
    """costs.resources.<field>: one hardware queue slows Megatron's merged schedule, and
    DeepEP's kernels on slower SMs (comm_sm_bw) stretch its exchanges."""
    cfg = {
        "topology": "dgx-h100",
        "nodes": 1,
        "model": {
            "batch": 1,
            "seq_len": 1024,
            "model_dim": 1024,
            "hidden_dim": 512,
            "experts": 32,
            "top_k": 8,
        },
        "strategy": {
            "name": "megatron_ep",
            "dispatcher": "flex",
            "micro": 2,
            "layers": 1,
            "heads": 8,
        },
        "passes": ["fwd", "bwd"],
    }
    one = whatif(cfg, ["costs.resources.max_connections=1"])
    assert one.after["makespan_s"] > one.before["makespan_s"]
    slow = whatif(cfg, ["costs.resources.comm_sm_bw=1e9"])
    assert slow.after["exposed_comm_s"] > slow.before["exposed_comm_s"]
    with pytest.raises(ConfigError, match=r"costs\.resources\.queues: unknown key"):
        whatif(cfg, ["costs.resources.queues=1"])
    # on a task graph base too (the cluster's costs)
    from sim.strategies import build
    from sim.workload.moe import MoELayer

    layer = MoELayer(**{**cfg["model"], "world": 8})
    g = build(
        "megatron_ep",
        layer,
        {k: v for k, v in cfg["strategy"].items() if k != "name"},
        ("fwd", "bwd"),
    )
    w = whatif(g, ["costs.resources.max_connections=1"], topology="dgx-h100")
    assert w.after["makespan_s"] > w.before["makespan_s"]


def test_measured_trace_what_ifs():
    """On a replayed executor trace, compute.speed scales the measured compute times (not
    their launch gaps) and a link's bandwidth the measured transfers."""
    w = whatif(EXEC, ["compute.speed=*2"])
    b, a = w.before, w.after
    assert a["busy_s"]["compute"] == pytest.approx(b["busy_s"]["compute"] / 2, rel=1e-9)
    assert b["makespan_s"] / 2 < a["makespan_s"] < b["makespan_s"]
    w = whatif(EXEC, ["link.loopback.bw=*2"])
    assert w.after["busy_s"]["compute"] == pytest.approx(w.before["busy_s"]["compute"], rel=1e-9)
    assert w.after["busy_s"]["comm"] < w.before["busy_s"]["comm"]
    # topology: communication re-modelled (flows), compute still measured
    w = whatif(EXEC, ["topology=flat-switch"])
    assert w.after["network"] == "flow" and w.after["topology"] == "flat-switch"
    assert w.after["busy_s"]["compute"] == pytest.approx(w.before["busy_s"]["compute"], rel=1e-9)


def test_whatif_command_writes_both_sides(tmp_path):
    res = whatif_command(str(EXEC / "trace.csv"), ["compute.speed=*0.5"], out=str(tmp_path))
    for side in ("before", "after"):
        for f in ("trace.csv", "trace.chrome.json", "summary.json"):
            assert (tmp_path / side / f).is_file()
    saved = json.loads((tmp_path / "whatif.json").read_text())
    assert saved["changes"] == ["compute.speed=*0.5"]
    assert saved["after"]["makespan_s"] > saved["before"]["makespan_s"]
    text = format_whatif(res)
    assert "makespan" in text and "compute.speed=*0.5" in text


@pytest.mark.parametrize(
    "base, sets, kw, match",
    [
        ("graph", ["warp.speed=9"], {}, r"--set warp.speed: unknown key \(known: topology, "),
        ("graph", ["compute.speed"], {}, "expected KEY=VALUE"),
        ("graph", ["link.nvlink9.bw=*2"], {}, "has no link class 'nvlink9' .it has: port"),
        ("graph", ["compute.speed=*x"], {}, r"expected \*<number>"),
        ("graph", ["model.capacity_factor=2"], {}, "needs a run config base"),
        ("graph", ["compute.speed=*2"], {"topology": None}, "needs its cluster"),
        ("trace", ["link.loopback.latency=1e-6"], {}, "no latency part"),
        ("trace", ["strategy=pipelined"], {}, "needs a run config base"),
        ("config", ["model.routing.s=*2"], {}, "relative, but the base has no number"),
    ],
)
def test_bad_changes(base, sets, kw, match):
    if base == "graph":
        b = _gemms([1e9])
        kw = {"topology": "flat-switch", **kw}
    elif base == "trace":
        b = EXEC
    else:
        b = {
            "topology": "flat-switch",
            "nodes": 2,
            "strategy": "sequential",
            "model": {
                "batch": 1,
                "seq_len": 64,
                "model_dim": 64,
                "hidden_dim": 64,
                "experts_per_gpu": 1,
            },
        }
    with pytest.raises(ConfigError, match=match) as e:
        whatif(b, sets, **kw)
    assert "\n" not in str(e.value)


def test_a_graph_object_with_measured_times_is_a_replay():
    """An in-memory graph whose tasks carry measured times is replayed (its times kept), as
    the same graph read from a file is; one without them is a plain graph."""
    from sim.analysis.whatif import load_base

    g = _gemms([1e12])
    assert load_base(g) == ("graph", g)
    g.tasks["g0"].tags["measured_s"] = 0.25
    assert load_base(g) == ("replay", g)
