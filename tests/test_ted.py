"""DeepSpeed TED in the simulator: layout checks, graph shape, closed form, and its claim."""

from __future__ import annotations

import math

import pytest

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.collectives import payload
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.ted import duplicate_layout
from sim.workload.moe import MoELayer


def _cluster(nodes: int, costs: dict | None = None) -> Cluster:
    topo = Topology.load("dgx-a100", nodes=nodes)
    return Cluster(topo, CostModel.build(topo, costs or {}))


def _layer(**kw) -> MoELayer:
    sizes = dict(batch=1, seq_len=256, model_dim=256, hidden_dim=512, experts=16, world=16, top_k=2)
    return MoELayer(**(sizes | kw))


@pytest.mark.parametrize(
    "tp,kw,needle",
    [
        (3, {}, "TP groups of 3"),
        (0, {}, "positive integer"),
        (True, {}, "positive integer"),
        (4, {"experts": 2}, "multiple of 4"),  # EP groups of 16/4 = 4 GPUs hold 2 experts
        (16, {}, "inside a node of 8"),
    ],
)
def test_bad_layouts_name_the_field(tp, kw, needle):
    with pytest.raises(ConfigError, match="strategy.tp") as e:
        build("ted", _layer(**kw), {"tp": tp}, ("fwd",), _cluster(2))
    assert needle in str(e.value)


def test_tp_1_is_the_sequential_layer():
    layer = _layer()
    a, b = (
        build("ted", layer, {"tp": 1}, ("fwd", "bwd")),
        build("sequential", layer, {}, ("fwd", "bwd")),
    )
    assert a.to_dict()["tasks"] == b.to_dict()["tasks"]


def test_graph_drops_tokens_before_the_ep_exchange_and_gathers_after():
    # C = ceil(2 * 1.1 * 256 / 16) = 36 -> aligned to 36 for tp 2 and 4, 40 for tp = 8
    layer = _layer(capacity_factor=1.1)
    assert layer.capacity == 36
    for tp in (2, 4, 8):
        g = build("ted", layer, {"tp": tp}, ("fwd", "bwd"), _cluster(2))
        c = math.ceil(36 / tp)
        shard = 16 * c * 256 * 2  # [E, C/tp, M] in bf16
        ep = 16 // tp
        by = {(t.rank, t.tags["phase"], t.tags["step"]): t for t in g}
        for rank in range(16):
            for phase, first, second, gather in [
                ("fwd", "dispatch", "combine", "gather_tokens"),
                ("bwd", "combine_grad", "dispatch_grad", "drop_tokens_grad"),
            ]:
                a2a = by[(rank, phase, first)]
                assert a2a.group == [j * tp + rank % tp for j in range(ep)]  # EP group
                assert a2a.bytes == shard
                ag = by[(rank, phase, gather)]
                assert ag.kind == "all_gather" and ag.bytes == shard
                tp_group = list(range(rank - rank % tp, rank - rank % tp + tp))
                assert ag.group == tp_group and len({r // 8 for r in tp_group}) == 1
                assert ag.deps == [by[(rank, phase, second)].id]
            fc1 = by[(rank, "fwd", "fc1")]
            assert fc1.shape == {"batch": 16 // ep, "m": ep * c, "n": 512, "k": 256}
            assert by[(rank, "fwd", "dispatch")].deps == [by[(rank, "fwd", "drop_tokens")].id]
            assert by[(rank, "fwd", "decode")].deps == [by[(rank, "fwd", "gather_tokens")].id]
            cut = by[(rank, "bwd", "gather_tokens_grad")]
            assert by[(rank, "bwd", "combine_grad")].deps == [cut.id]
            assert by[(rank, "bwd", "encode_grad")].deps == [
                by[(rank, "bwd", "drop_tokens_grad")].id
            ]


def test_forward_is_the_sum_of_its_chain_with_alpha_beta_collectives():
    """Closed form: with collective-level alpha-beta costs nothing overlaps in TED's forward,
    so the makespan is the sum of one rank's task durations (gate ... decode)."""
    fits = {k: {"alpha": 2e-5, "beta": 1e-10} for k in ("all_to_all", "all_gather")}
    cl = _cluster(2, {"network": "collective", "collectives": fits})
    g = build("ted", _layer(), {"tp": 4}, ("fwd",), cl)
    res = simulate(g, cl.topology, cl.costs)
    chain = [t for t in g if t.rank == 5]
    expect = 0.0
    for t in chain:
        if t.is_comm:
            expect += 2e-5 + 1e-10 * payload(t)
        else:
            expect += cl.costs.compute.duration(t)
    assert [t.tags["step"] for t in chain if not t.is_comm][:3] == ["gate", "encode", "drop_tokens"]
    assert res.makespan == pytest.approx(expect, rel=1e-12)


def test_token_dropping_cuts_the_exchange_by_tp_and_wins_on_dgx_a100():
    """TED's claim (DeepSpeed-TED, duplicate token dropping): dropping the tp-fold duplicates
    before the expert-parallel all-to-all divides its volume by tp, and the step beats the
    layout that dispatches (and computes) the duplicates, with TP groups on NVSwitch and the
    EP all-to-all across InfiniBand (2 DGX A100 nodes)."""
    cl = _cluster(2)
    layer = MoELayer(
        batch=4,
        seq_len=1024,
        model_dim=2048,
        hidden_dim=8192,
        experts=16,
        world=16,
        top_k=2,
        capacity_factor=1.25,
    )  # fmt: skip  (C = 640, divisible by every tp)
    passes = ("fwd", "bwd")
    gains = []
    for tp in (2, 4, 8):
        ted = build("ted", layer, {"tp": tp}, passes, cl)
        dup = duplicate_layout(layer, tp, passes)

        def a2a(g):
            return sum(t.bytes for t in g if t.kind == "all_to_all" and t.rank == 0)

        assert a2a(ted) * tp == pytest.approx(a2a(dup))
        t_ted = simulate(ted, cl.topology, cl.costs).makespan
        t_dup = simulate(dup, cl.topology, cl.costs).makespan
        gains.append(t_dup / t_ted)
    assert 1 < gains[0] < gains[1] < gains[2]  # the wider the TP group, the more it saves
