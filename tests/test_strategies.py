"""MoE layer builders: structure of the graphs, routing, and what overlap buys."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.analysis.summary import summarize
from sim.analysis.trace import to_frame
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import STRATEGIES, Cluster, build
from sim.workload.moe import MoELayer

TOPO = Topology.load("dgx-a100", nodes=1)


def layer(**kw) -> MoELayer:
    base = dict(
        batch=2,
        seq_len=512,
        model_dim=1024,
        hidden_dim=4096,
        experts=16,
        world=8,
        top_k=2,
        capacity_factor=1.0,
    )
    return MoELayer(**{**base, **kw})


def comm_sequence(g, rank=0):
    return [
        (t.stream, t.tags["step"], t.tags["chunk"])
        for t in g
        if t.rank == rank and t.stream.startswith("comm") and t.tags["phase"] == "fwd"
    ]


def test_issue_orders():
    L = layer()
    tutel = comm_sequence(build("pipelined", L, {"degree": 3, "order": "tutel"}, ("fwd",)))
    assert [(s, c) for _, s, c in tutel] == [
        ("dispatch", 0),
        ("dispatch", 1),
        ("dispatch", 2),
        ("combine", 0),
        ("combine", 1),
        ("combine", 2),
    ]
    alt = comm_sequence(build("pipelined", L, {"degree": 3, "order": "alternating"}, ("fwd",)))
    assert [(s, c) for _, s, c in alt] == [
        ("dispatch", 0),
        ("dispatch", 1),
        ("combine", 0),
        ("dispatch", 2),
        ("combine", 1),
        ("combine", 2),
    ]
    two = comm_sequence(build("pipelined", L, {"degree": 3, "order": "two_streams"}, ("fwd",)))
    assert {st for st, s, _ in two if s == "dispatch"} == {"comm"}
    assert {st for st, s, _ in two if s == "combine"} == {"comm.1"}


def test_backward_mirrors_forward_with_twice_the_expert_work():
    g = build("pipelined", layer(), {"degree": 2}, ("fwd", "bwd"))
    flops = {"fwd": 0.0, "bwd": 0.0}
    for t in g:
        if t.kind == "gemm":
            flops[t.tags["phase"]] += t.flops
    assert math.isclose(flops["bwd"], 2 * flops["fwd"])
    bwd_chunks = [
        t.tags["chunk"]
        for t in g
        if t.rank == 0 and t.tags["phase"] == "bwd" and t.tags["step"] == "combine_grad"
    ]
    assert bwd_chunks == [1, 0]  # walked in reverse


def test_chunks_partition_the_capacity():
    L = layer(capacity_factor=1.3)
    for r in (1, 2, 3, 5, 8):
        assert sum(L.chunk_capacity(r)) == L.capacity
        g = build("pipelined", L, {"degree": r}, ("fwd",))
        sent = sum(t.bytes for t in g if t.rank == 0 and t.tags.get("step") == "dispatch")
        assert math.isclose(sent, L.experts * L.capacity * L.model_dim * L.elem)


def test_skewed_routing_uses_all_to_allv_and_conserves_tokens():
    L = layer(routing={"kind": "zipf", "s": 1.5, "seed": 3})
    tm = L.tokens_matrix
    assert tm.max() <= L.capacity and tm.sum() < L.top_k * L.tokens * L.world  # some dropped
    g = build("pipelined", L, {"degree": 2}, ("fwd",))
    kinds = {t.kind for t in g if t.stream.startswith("comm")}
    assert kinds == {"all_to_allv"}
    sent = sum(sum(t.split) for t in g if t.tags.get("step") == "dispatch")
    back = sum(sum(t.split) for t in g if t.tags.get("step") == "combine")
    assert math.isclose(sent, back)
    assert math.isclose(sent, tm.sum() * L.model_dim * L.elem)
    # same seed, same matrix; different seed, different matrix
    assert np.array_equal(tm, layer(routing={"kind": "zipf", "s": 1.5, "seed": 3}).tokens_matrix)
    assert not np.array_equal(
        tm, layer(routing={"kind": "zipf", "s": 1.5, "seed": 4}).tokens_matrix
    )


def test_skew_makes_the_layer_slower_than_uniform_at_equal_tokens():
    """The hot expert's GPU receives more than the average: all-to-allv waits for it."""
    c = CostModel.build(TOPO, {})
    P, E = 8, 8
    hot = np.full((P, E), 64)
    hot[:, 0] = 64 * 4  # everyone sends 4x to expert 0 ...
    hot[:, 1:4] = 0  # ... and nothing to 1..3: same total tokens as uniform
    L_hot = layer(
        experts=E, capacity_factor=4.0, routing={"kind": "matrix", "tokens": hot.tolist()}
    )
    L_uni = layer(
        experts=E,
        capacity_factor=4.0,
        routing={"kind": "matrix", "tokens": np.full((P, E), 64).tolist()},
    )
    t_hot = simulate(build("sequential", L_hot, {}, ("fwd",)), TOPO, c).makespan
    t_uni = simulate(build("sequential", L_uni, {}, ("fwd",)), TOPO, c).makespan
    assert t_hot > 1.5 * t_uni


def test_sequential_is_pipelined_with_one_chunk():
    c = CostModel.build(TOPO, {})
    L = layer()
    seq = simulate(build("sequential", L, {}, ("fwd", "bwd")), TOPO, c).makespan
    one = simulate(build("pipelined", L, {"degree": 1}, ("fwd", "bwd")), TOPO, c).makespan
    assert seq == one


def test_pipelining_hides_communication_on_the_demo():
    cfg = RunConfig.demo()
    topo = cfg.load_topology()
    c = CostModel.build(topo, cfg.costs)
    L = cfg.layer(topo.world_size)
    out = {}
    for name, params in (("sequential", {}), ("pipelined", {"degree": 4})):
        res = simulate(build(name, L, params, cfg.passes), topo, c)
        out[name] = summarize(res, to_frame(res))
    assert out["pipelined"]["makespan_s"] < out["sequential"]["makespan_s"]
    assert out["pipelined"]["exposed_comm_s"] < 0.5 * out["sequential"]["exposed_comm_s"]


def test_activation_memory_is_kept_for_backward_and_freed():
    c = CostModel.build(TOPO, {})
    L = layer()
    fwd = simulate(build("pipelined", L, {"degree": 2}, ("fwd",)), TOPO, c)
    both = simulate(build("pipelined", L, {"degree": 2}, ("fwd", "bwd")), TOPO, c)
    assert both.mem_peak[0] > fwd.mem_peak[0] > 0
    final = {}
    for _t, r, b in both.mem_timeline:
        final[r] = b
    assert all(v == 0.0 for v in final.values())


@pytest.mark.parametrize(
    "params,match",
    [
        ({"degree": 0}, "degree"),
        ({"degree": 10_000}, "capacity"),
        ({"order": "random"}, "order"),
    ],
)
def test_bad_strategy_params(params, match):
    with pytest.raises(ConfigError, match=match):
        build("pipelined", layer(), params, ("fwd",))


def test_bad_layers():
    with pytest.raises(ConfigError, match="model.experts"):
        layer(experts=12)
    with pytest.raises(ConfigError, match="routing.kind"):
        layer(routing={"kind": "magic"})
    with pytest.raises(ConfigError, match="routing.tokens"):
        layer(routing={"kind": "matrix", "tokens": [[1, 2]]})


@pytest.mark.parametrize("routing", [{"kind": "uniform"}, {"kind": "zipf", "s": 1.1, "seed": 1}])
def test_built_graphs_round_trip_through_json(tmp_path, routing):
    from sim.core.graph import TaskGraph

    g = build("pipelined", layer(routing=routing), {"degree": 2}, ("fwd", "bwd"))
    g.to_json(tmp_path / "g.json")
    back = TaskGraph.from_json(tmp_path / "g.json")
    assert back.to_dict() == g.to_dict()
    c = CostModel.build(TOPO, {})
    assert simulate(back, TOPO, c).makespan == simulate(g, TOPO, c).makespan


def test_all_to_all_algorithm_is_a_strategy_parameter():
    topo = Topology.load("dgx-a100", nodes=4)
    L = layer(world=32, experts=32, batch=1, seq_len=256)
    c = CostModel.build(topo, {})
    times = {}
    for algo in (None, "linear", "2dh", "rail_relay"):
        g = build("pipelined", L, {"degree": 2, "algo": algo}, ("fwd",))
        assert {t.algo for t in g if t.kind == "all_to_all"} == {algo}
        times[algo] = simulate(g, topo, c).makespan
    assert times[None] == times["linear"] and times["2dh"] != times["linear"]


def test_routing_matrix_from_a_file(tmp_path):
    m = np.arange(8 * 16).reshape(8, 16) % 7
    np.savetxt(tmp_path / "m.csv", m, delimiter=",")
    np.save(tmp_path / "m.npy", m)
    for name in ("m.csv", "m.npy"):
        L = layer(capacity_factor=4.0, routing={"kind": "matrix", "file": str(tmp_path / name)})
        assert np.array_equal(L.tokens_matrix, np.minimum(m, L.capacity))
    with pytest.raises(ConfigError, match="not found"):
        layer(routing={"kind": "matrix", "file": str(tmp_path / "absent.csv")})
    with pytest.raises(ConfigError, match="exactly one"):
        layer(routing={"kind": "matrix"})


@pytest.mark.parametrize("name", sorted(set(STRATEGIES) - {"dualpipe", "mpipemoe"}))
def test_a_backward_alone_finds_the_forwards_activations(name):
    """passes [bwd] is a valid run: the activations its forward would have kept are live from
    its start (they used to be freed without an owner, a GraphError), and all are freed."""
    L = layer(experts=8, world=8, hidden_dim=512)
    c = CostModel.build(TOPO, {})
    cl = Cluster(TOPO, c)
    both = simulate(build(name, L, {}, ("fwd", "bwd"), cl), TOPO, c)
    bwd = simulate(build(name, L, {}, ("bwd",), cl), TOPO, c)
    assert 0 < bwd.mem_peak.max() <= both.mem_peak.max()
    final = {r: b for _t, r, b in bwd.mem_timeline}
    assert all(v == pytest.approx(0.0, abs=1e-3) for v in final.values())


def test_deepep_activations_in_closed_form():
    # forward + backward (sim.strategies.activations): the forward's stash, the layer's T
    # tokens (T_I in the FP8 dispatch dtype, T_O), the received rows (one per (token, GPU), in
    # FP8), the experts' hidden and output rows (one per (token, expert)), is live through
    # the backward, which peaks with the gradients of the experts' outputs and hidden rows
    from sim.strategies.deepep.volumes import row_bytes, volumes

    L = layer(experts=8, world=8, top_k=2)
    v = volumes(L, 8)
    res = simulate(build("deepep", L, {}, ("fwd", "bwd")), TOPO, CostModel.build(TOPO, {}))
    rows, T, M, H, e, fp8 = v.expert_rows[0], L.tokens, 1024, 4096, 2, row_bytes(1024, "fp8")
    stash = (T + v.gpu_tokens[:, 0].sum()) * fp8 + rows * e * (H + M) + T * M * e
    assert res.mem_peak[0] == pytest.approx(stash + rows * e * (M + H))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_sliced_experts_are_built_or_refused_clearly(name):
    """E < W (each expert sliced over W/E GPUs) is a valid layer; a strategy that places
    whole experts must refuse it with a ConfigError naming the field, never crash."""
    layer = MoELayer(batch=2, seq_len=64, model_dim=32, hidden_dim=64, experts=2, world=8)
    params = {"shadow": "none"} if name == "fastermoe" else {}
    if name in ("pipemoe", "mpipemoe"):
        params = {"degree": 2} | ({"reuse": "S1"} if name == "mpipemoe" else {})
    try:
        g = build(name, layer, params, ("fwd", "bwd"))
    except ConfigError as e:
        assert str(e).startswith(("model.experts", "strategy.")), e  # names the field
    else:
        assert g.world_size == 8 and len(g) > 0
