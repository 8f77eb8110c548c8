"""Lancet's operator partition pass (Sec. 5): capacity passed between batch partitions, the
range DP against brute force, the stage pipeline in closed form, and both passes never
lengthening the step under alpha-beta costs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.strategies import Cluster, build
from sim.strategies.lancet.capacity import partition_tokens, pass_capacity, split_demand
from sim.strategies.lancet.plan import choose
from sim.strategies.lancet.profile import duration_fn
from sim.strategies.lancet.ranges import best_segments, pipeline_time
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer
from tests.test_lancet import TOPO, alpha_beta_costs


def _costs(
    beta_g: float, beta_m: float, a2a: tuple[float, float], alpha: float = 2e-6
) -> CostModel:
    # skewed layers exchange with all-to-allv: the same fit as all-to-all
    return alpha_beta_costs(beta_g, beta_m, a2a, alpha, ("all_to_all", "all_to_allv"))


# -- capacity passed between partitions -------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_partitions_keep_exactly_the_unpartitioned_tokens(k):
    layer = MoELayer(
        batch=8,
        seq_len=32,
        model_dim=64,
        hidden_dim=64,
        experts=8,
        world=4,
        routing={"kind": "zipf", "s": 1.5, "seed": 3},
    )
    parts = partition_tokens(layer, k)
    assert parts.shape == (k, 4, 8)
    np.testing.assert_array_equal(parts.sum(axis=0), layer.tokens_matrix)
    assert (parts >= 0).all() and (parts.cumsum(axis=0) <= layer.capacity).all()


def test_plain_micro_batching_drops_what_capacity_passing_keeps():
    # the paper's example: 3/4 C in the first half-batch, 1/4 C in the second
    demand = np.array([[[6]], [[2]]])
    passed = pass_capacity(demand, 8)
    assert passed.sum() == 8
    plain = np.minimum(demand, 8 // 2)  # each micro-batch capped at C/2
    assert plain.sum() == 6
    assert split_demand(np.array([[7]]), 4, 3).sum() == 7  # shares add up


# -- the range DP against brute force ---------------------------------------------------------


def _brute(n: int, seg) -> float:
    best = math.inf
    for cuts in itertools.product([0, 1], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        best = min(best, sum(seg(a, b) for a, b in zip(bounds, bounds[1:])))
    return best


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), seed=st.integers(0, 10_000), max_len=st.sampled_from([None, 2, 4]))
def test_range_dp_equals_brute_force(n, seed, max_len):
    rng = np.random.default_rng(seed)
    table = rng.uniform(0.1, 5.0, size=(n + 1, n + 1))
    table[rng.random((n + 1, n + 1)) < 0.3] = math.inf  # invalid ranges
    for i in range(n):
        table[i, i + 1] = rng.uniform(0.1, 5.0)  # a single instruction can always stay whole

    def seg(i: int, m: int) -> float:
        if max_len is not None and m - i > max_len:
            return math.inf
        return float(table[i, m])

    total, segs = best_segments(n, seg, max_len)
    assert total == pytest.approx(_brute(n, seg))
    assert segs[0][0] == 0 and segs[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    assert sum(seg(a, b) for a, b in segs) == pytest.approx(total)


def test_pipeline_closed_forms():
    assert pipeline_time([False, False], [[1.0], [2.0]]) == 3.0  # k = 1: the sum
    # compute c then all-to-all a, k equal parts: c + (k-1) max(c, a) + a (flow shop)
    for c, a, k in [(1.0, 3.0, 4), (3.0, 1.0, 4), (2.0, 2.0, 3)]:
        t = pipeline_time([False, True], [[c] * k, [a] * k])
        assert t == pytest.approx(c + (k - 1) * max(c, a) + a)
    # compute, exchange, compute: the stage after waits on both the exchange and the stream
    t = pipeline_time([False, True, False], [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]])
    assert t == pytest.approx(1 + 2 + 2 + 1)


# -- the plan ---------------------------------------------------------------------------------

LAYER = MoELayer(batch=4, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=4)


def test_gate_limits_the_ranges():
    costs = _costs(1e-13, 1e-12, (1e-5, 1e-9))  # slow all-to-alls: worth pipelining
    dur = duration_fn(Cluster(TOPO, costs))
    blocks = BlockModel(n=4, heads=4, moe_every=2)
    sw = choose(blocks, LAYER, dur, [2, 4], "switch")
    bp = choose(blocks, LAYER, dur, [2, 4], "batch_prioritized")
    assert sw.k in (2, 4) and any(pre for pre, _ in sw.ranges.values())
    assert len(sw.ranges[1][0]) > 1  # the switch gate's pipeline extends before the gate
    for pre, _post in bp.ranges.values():  # the gate and what precedes it stay whole
        assert all(step == "encode" for _, step in pre)
    assert min(sw.estimate.values()) <= min(bp.estimate.values()) + 1e-15


def test_bad_parameters_name_the_field():
    blocks = BlockModel(n=2, heads=4)
    for bad, field in [
        ({"partition": 9}, "partition"),
        ({"dw": "maybe"}, "dw"),
        ({"gate": "top2"}, "gate"),
    ]:
        with pytest.raises(ConfigError, match=f"strategy.{field}"):
            build("lancet", LAYER, bad, ("fwd",), blocks=blocks)


# -- both passes never lengthen the step ------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(2, 3),
    degree=st.sampled_from([1, 2]),
    batch=st.sampled_from([2, 3, 4]),
    gate=st.sampled_from(["switch", "batch_prioritized"]),
    beta_g=st.floats(1e-13, 1e-11),
    beta_m=st.floats(1e-12, 1e-10),
    beta_a=st.floats(1e-10, 1e-8),
    alphas=st.sampled_from([(1e-7, 1e-6), (1e-6, 5e-6)]),
)
def test_both_passes_never_lengthen_the_step(
    n, degree, batch, gate, beta_g, beta_m, beta_a, alphas
):
    costs = _costs(beta_g, beta_m, (alphas[1], beta_a), alphas[0])
    cluster = Cluster(TOPO, costs)
    layer = MoELayer(batch=batch, seq_len=32, model_dim=64, hidden_dim=128, experts=8, world=4)
    blocks = BlockModel(n=n, heads=4, moe_every=2)
    plain = build("tutel", layer, {"degree": degree}, ("fwd", "bwd"), cluster, blocks=blocks)
    lan = build(
        "lancet", layer, {"degree": degree, "gate": gate}, ("fwd", "bwd"), cluster, blocks=blocks
    )
    a, b = simulate(plain, TOPO, costs), simulate(lan, TOPO, costs)
    assert b.makespan <= a.makespan * (1 + 1e-9)
    idx = {t.id: i for i, t in enumerate(b.graph)}
    start, end = np.asarray(b.start), np.asarray(b.end)
    for t in b.graph:  # every task starts after its dependencies end
        for d in t.deps:
            assert start[idx[t.id]] >= end[idx[d]] - 1e-12
    # the partitions do the unpartitioned forward's work: flops and exchanged bytes add up
    for kind in ("gemm", "all_to_all"):
        fl = [
            sum(
                t.flops + (t.bytes if t.is_comm else 0)
                for t in g
                if t.kind == kind and t.tags.get("phase") == "fwd"
            )
            for g in (plain, lan)
        ]
        assert fl[1] == pytest.approx(fl[0], rel=1e-9)


def _non_overlapped_a2a(df) -> float:
    from sim.analysis.summary import exposed

    out = []
    for _, d in df.groupby("rank"):
        a2a = d[d["kind"].isin(["all_to_all", "all_to_allv"])][["start", "end"]].to_numpy()
        comp = d[d["stream"].str.startswith("compute")][["start", "end"]].to_numpy()
        out.append(exposed(a2a, comp))
    return float(np.mean(out))


def test_lancet_claim_on_a_small_model():
    """Issue 13's claim, qualitatively: on a paper cluster (one p3dn node, flow network) at
    the paper's V100 setting for GPT2-S-MoE (batch 16 per GPU, sequence 512; issue 26), both
    passes leave less all-to-all time exposed than Tutel's overlap and never lengthen the
    step. Only the depth is cut (4 blocks, 2 MoE layers, for time); the numbers on 32 GPUs
    are benchmarks/lancet.py's."""
    from sim import commands

    model = {"preset": "gpt2-s-moe", "batch": 16, "blocks": {"n": 4}}
    runs = {
        name: commands.simulate_config(
            {
                "topology": "p3dn-v100",
                "nodes": 1,
                "model": model,
                "strategy": {"name": name, "degree": 2},
                "passes": ["fwd", "bwd"],
            }
        )
        for name in ("tutel", "lancet")
    }
    tutel, lancet = runs["tutel"], runs["lancet"]
    assert lancet.graph.meta["lancet"]["dw_moved"] > 0
    assert lancet.graph.meta["lancet"].get("partitions", 1) > 1  # the partition pass acted
    assert _non_overlapped_a2a(lancet.trace) < _non_overlapped_a2a(tutel.trace)
    assert lancet.summary["makespan_s"] <= tutel.summary["makespan_s"] * (1 + 1e-9)


def test_skewed_routing_partitions_send_what_the_layer_keeps():
    """Zipf routing: the partitions' all-to-allv move, together, exactly the rows the
    unpartitioned layer moves (capacity passed on, no extra drops), and the graph runs."""
    costs = _costs(1e-13, 1e-12, (1e-5, 1e-9))
    cluster = Cluster(TOPO, costs)
    zipf = {"kind": "zipf", "s": 1.5, "seed": 1}
    layer = MoELayer(
        batch=4,
        seq_len=64,
        model_dim=64,
        hidden_dim=128,
        experts=8,
        world=4,
        capacity_factor=1.5,
        routing=zipf,
    )
    blocks = BlockModel(n=2, heads=4, moe_every=2)
    plain = build("sequential", layer, {}, ("fwd", "bwd"), cluster, blocks=blocks)
    lan = build("lancet", layer, {"partition": 3}, ("fwd", "bwd"), cluster, blocks=blocks)
    assert lan.meta["lancet"]["partitions"] == 3
    for step in ("dispatch", "combine"):
        sent = [
            sum(t.bytes for t in g if t.tags.get("phase") == "fwd" and t.tags["step"] == step)
            for g in (plain, lan)
        ]
        assert sent[1] == sent[0]
    assert simulate(lan, TOPO, costs).makespan > 0
