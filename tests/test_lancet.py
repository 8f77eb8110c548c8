"""Lancet's weight-gradient schedule pass (Sec. 4, Alg. 1) on model graphs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.strategies.lancet.dw_schedule import schedule_dw
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer

TOPO = Topology.load("pipemoe-2080ti", nodes=1)  # 4 GPUs; links unused in collective mode
KINDS = ("gemm", "layernorm", "softmax", "elementwise", "attention", "gate", "encode", "decode")


def alpha_beta_costs(
    beta_g: float,
    beta_m: float,
    a2a: tuple[float, float],
    alpha: float = 2e-6,
    a2a_kinds: tuple[str, ...] = ("all_to_all",),
) -> CostModel:
    """Collective-mode alpha-beta costs on TOPO: `alpha` for every compute kind, `beta_g` per
    byte for GEMMs and `beta_m` for the rest; `a2a` (alpha, beta) for each of `a2a_kinds`."""
    fits = {k: (alpha, beta_g if k == "gemm" else beta_m) for k in KINDS}
    return CostModel.build(
        TOPO,
        {
            "compute": "alpha_beta",
            "network": "collective",
            "alpha_beta": {k: {"alpha": a, "beta": b} for k, (a, b) in fits.items()},
            "collectives": {k: {"alpha": a2a[0], "beta": a2a[1]} for k in a2a_kinds}
            | {"all_reduce": {"alpha": 1e-5, "beta": 1e-10}},
        },
    )


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(2, 4),
    degree=st.sampled_from([1, 2]),
    flash=st.booleans(),
    beta_g=st.floats(1e-13, 1e-11),
    beta_m=st.floats(1e-12, 1e-10),
    beta_a=st.floats(1e-11, 1e-8),
)
def test_dw_pass_never_lengthens_and_keeps_dependencies(n, degree, flash, beta_g, beta_m, beta_a):
    costs = alpha_beta_costs(beta_g, beta_m, (2e-5, beta_a))
    layer = MoELayer(batch=2, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=4)
    blocks = BlockModel(n=n, heads=4, moe_every=2, flash=flash)
    plain = build("pipelined", layer, {"degree": degree}, ("fwd", "bwd"), blocks=blocks)
    moved = build("pipelined", layer, {"degree": degree}, ("fwd", "bwd"), blocks=blocks)
    dur = {
        t.id: costs.comm_duration(t, t.kind, 4) if t.is_comm else costs.compute.duration(t)
        for t in moved
    }
    asg = schedule_dw(moved, lambda t: dur[t.id])
    moved.validate()  # acyclic with the new stream order, collectives matched
    assert sorted(moved.tasks) == sorted(plain.tasks)
    for tid in asg:  # only weight gradients whose consumers are reductions move
        assert moved.tasks[tid].tags["role"] == "dW"
    a, b = simulate(plain, TOPO, costs), simulate(moved, TOPO, costs)
    assert b.makespan <= a.makespan * (1 + 1e-9)
    idx = {t.id: i for i, t in enumerate(b.graph)}
    start, end = np.asarray(b.start), np.asarray(b.end)
    for t in b.graph:  # every task starts after its dependencies end
        for d in t.deps:
            assert start[idx[t.id]] >= end[idx[d]] - 1e-12


def test_dw_fills_backward_all_to_all_windows():
    """Slow all-to-alls, fast GEMMs: weight gradients move into the windows and the step
    gets shorter by the moved work."""
    costs = alpha_beta_costs(1e-13, 1e-12, (1e-4, 1e-8), alpha=1e-6)
    layer = MoELayer(batch=2, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=4)
    blocks = BlockModel(n=4, heads=4, moe_every=2)
    plain = build("sequential", layer, {}, ("fwd", "bwd"), blocks=blocks)
    moved = build("sequential", layer, {}, ("fwd", "bwd"), blocks=blocks)
    asg = schedule_dw(
        moved,
        lambda t: costs.comm_duration(t, t.kind, 4) if t.is_comm else costs.compute.duration(t),
    )
    assert asg and all(moved.tasks[a].kind == "all_to_all" for a in asg.values())
    a, b = simulate(plain, TOPO, costs), simulate(moved, TOPO, costs)
    saved = sum(costs.compute.duration(moved.tasks[w]) for w in asg if w.startswith("r0/"))
    assert b.makespan < a.makespan
    assert abs((a.makespan - b.makespan) - saved) < 1e-9 * a.makespan
