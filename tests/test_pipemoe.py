"""PipeMoE's selector (Theorem 1 / Alg. 1) on its own hardware preset and formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.pipemoe import Costs, f2, paper_cost, q1, select, sizes
from sim.workload.moe import MoELayer


@settings(max_examples=300, deadline=None)
@given(
    alpha_e=st.floats(1e-6, 1e-3),
    beta_e=st.floats(1e-15, 1e-12),
    alpha_a=st.floats(1e-6, 1e-3),
    beta_a=st.floats(1e-11, 1e-8),
    n_d=st.floats(1e4, 1e9),
    n_e=st.floats(1e6, 1e13),
    r_max=st.integers(1, 64),
    powers=st.booleans(),
)
def test_selector_minimizes_the_papers_own_cost(
    alpha_e, beta_e, alpha_a, beta_a, n_d, n_e, r_max, powers
):
    c = Costs(alpha_e, beta_e, alpha_a, beta_a)
    cand = (
        [r for r in (1, 2, 4, 8, 16, 32, 64) if r <= r_max] if powers else list(range(1, r_max + 1))
    )
    r, t, _case = select(c, n_d, n_e, cand)
    best = min(paper_cost(c, n_d, n_e, x) for x in cand)
    assert r in cand and math.isclose(t, best, rel_tol=1e-12)
    assert math.isclose(paper_cost(c, n_d, n_e, r), best, rel_tol=1e-12)


def test_q1_region_matches_eq_28():
    """Where chunks are comm-bound and alpha_a > alpha_e, t2* sits at Eq. 28's degree."""
    c = Costs(alpha_e=1e-5, beta_e=1e-14, alpha_a=1e-4, beta_a=1e-9)
    n_d, n_e = 1e6, 1e11
    eq28 = max(2, math.ceil((c.beta_e * n_e - c.beta_a * n_d) / (c.alpha_a - c.alpha_e)))
    q1_degrees = [r for r in range(2, 65) if q1(c, n_d, n_e, r)]
    assert q1_degrees[0] == eq28
    assert min(q1_degrees, key=lambda r: f2(c, n_d, n_e, r)) == eq28


def _cluster(nodes: int) -> Cluster:
    topo = Topology.load("pipemoe-2080ti", nodes=nodes)
    return Cluster(topo, CostModel.build(topo, {"compute": "alpha_beta", "network": "collective"}))


@pytest.mark.parametrize(
    "nodes,alpha_a,beta_a",
    [(4, 1.72e-5, 2.96e-10), (8, 2.09e-4, 3.54e-10), (16, 7.83e-4, 3.84e-10)],
)
def test_costs_come_from_pipemoe_fig_6(nodes, alpha_a, beta_a):
    c = Costs.from_cluster(_cluster(nodes), 4 * nodes)
    assert c.alpha_e == pytest.approx(2 * 6.19e-5) and c.beta_e == pytest.approx(2 * 4.1e-14)
    assert (c.alpha_a, c.beta_a) == pytest.approx((alpha_a, beta_a))


def test_pipemoe_builds_at_the_chosen_degree_and_it_is_the_simulated_best():
    cl = _cluster(4)
    layer = MoELayer(
        batch=4, seq_len=1024, model_dim=2048, hidden_dim=2048, experts=16, world=16, dtype="fp32"
    )
    g = build("pipemoe", layer, {"candidates": [1, 2, 4, 8]}, ("fwd",), cl)
    chosen = g.meta["degree"]
    assert g.meta["selector"]["selector"] == "theorem1"
    times = {
        r: simulate(
            build("pipelined", layer, {"degree": r}, ("fwd",)), cl.topology, cl.costs
        ).makespan
        for r in (1, 2, 4, 8)
    }
    assert times[chosen] == min(times.values())
    n_d, n_e = sizes(layer)
    assert n_d == 16 * layer.capacity * 2048 * 4


def test_auto_degree_needs_the_cluster():
    layer = MoELayer(batch=1, seq_len=256, model_dim=256, hidden_dim=512, experts=8, world=8)
    with pytest.raises(ConfigError, match="cluster"):
        build("pipemoe", layer, {}, ("fwd",))
    topo = Topology.load("dgx-a100", nodes=1)
    # a cluster without measured fits: Theorem 1 on fits to its own models (derived.py)
    roofline = Cluster(topo, CostModel.build(topo, {}))
    g = build("pipemoe", layer, {}, ("fwd",), roofline)
    assert g.meta["selector"]["selector"] == "theorem1"
    g = build("pipemoe", layer, {"degree": 2}, ("fwd",))  # a fixed degree needs nothing
    assert g.meta["degree"] == 2


def test_oracle_selector_agrees_with_the_simulated_times():
    from sim.search.simulated import oracle

    cl = _cluster(4)
    layer = MoELayer(
        batch=4, seq_len=1024, model_dim=2048, hidden_dim=2048, experts=16, world=16, dtype="fp32"
    )
    cands = [{"degree": r} for r in (1, 2, 4, 8)]
    best, times = oracle("pipelined", layer, cands, cl)
    assert times[repr(best)] == min(times.values()) and len(times) == 4
    chosen = build("pipemoe", layer, {"candidates": [1, 2, 4, 8]}, ("fwd",), cl).meta["degree"]
    assert chosen == best["degree"]  # Theorem 1 and the oracle agree on this layer
