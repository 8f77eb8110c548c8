"""Degenerate case of the whole simulator: ideal alpha-beta costs reproduce the recurrences.

Collective-level all-to-all cost alpha_a + beta_a * bytes, GEMM cost alpha_g + beta_g * m*n*k,
no contention and no interference. Then the simulated forward makespan of `pipelined` must
be gate + encode + (pipeline of D, E, C) + decode, where the pipeline follows:
- two_streams: PipeMoE Eq. 9-12 exactly as written (D's serial, C's serial, D and C overlap);
- tutel: one FIFO holding D1..Dr then C1..Cr;
- alternating: one FIFO holding D1, D2, C1, D3, C2, ..., Dr, C(r-1), Cr.
(The paper's case formulas, Eq. 25/33/40, assume all communication serialised and are not
what Eq. 9-12 give; they are not used here.)
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.workload.moe import MoELayer

TOPO = Topology.load("pipemoe-2080ti", nodes=1)  # 4 GPUs; links unused in collective mode


def recurrence(order: str, td: list[float], te: list[float], tc: list[float]) -> float:
    r = len(td)
    d_end, e_end, c_end = [0.0] * r, [0.0] * r, [0.0] * r
    if order == "two_streams":  # PipeMoE Eq. 9, 10, 11, 12
        tau_d, tau_e, tau_c = [0.0] * r, [0.0] * r, [0.0] * r
        for i in range(r):
            tau_d[i] = 0.0 if i == 0 else tau_d[i - 1] + td[i - 1]
            tau_e[i] = (
                (tau_d[0] + td[0]) if i == 0 else max(tau_e[i - 1] + te[i - 1], tau_d[i] + td[i])
            )
            tau_c[i] = (
                (tau_e[0] + te[0]) if i == 0 else max(tau_e[i] + te[i], tau_c[i - 1] + tc[i - 1])
            )
        return tau_c[r - 1] + tc[r - 1] - tau_d[0]
    if order == "tutel":
        fifo = [("D", i) for i in range(r)] + [("C", i) for i in range(r)]
    else:  # alternating
        fifo = [("D", 0)]
        for i in range(1, r):
            fifo += [("D", i), ("C", i - 1)]
        fifo += [("C", r - 1)]
    # Walk the FIFO; an expert chunk runs as soon as its dispatch and the previous expert end.
    comm_free = 0.0
    for what, i in fifo:
        if what == "D":
            d_end[i] = comm_free + td[i]
            comm_free = d_end[i]
            e_end[i] = max(e_end[i - 1] if i else 0.0, d_end[i]) + te[i]
        else:
            c_end[i] = max(comm_free, e_end[i]) + tc[i]
            comm_free = c_end[i]
    return c_end[r - 1]


@settings(max_examples=60, deadline=None)
@given(
    r=st.integers(1, 8),
    order=st.sampled_from(["two_streams", "tutel", "alternating"]),
    batch=st.integers(1, 8),
    seq_len=st.sampled_from([128, 256, 512, 1024]),
    model_dim=st.sampled_from([256, 512, 1024, 2048, 4096]),
    hidden_dim=st.sampled_from([512, 1024, 2048, 4096, 8192]),
    local_experts=st.integers(1, 2),
    top_k=st.integers(1, 2),
    cf=st.floats(0.5, 2.0),
    alpha_a=st.floats(1e-6, 1e-3),
    beta_a=st.floats(1e-11, 1e-9),
    alpha_g=st.floats(1e-6, 1e-4),
    beta_g=st.floats(1e-15, 1e-13),
)
def test_pipelined_forward_matches_recurrence(
    r,
    order,
    batch,
    seq_len,
    model_dim,
    hidden_dim,
    local_experts,
    top_k,
    cf,
    alpha_a,
    beta_a,
    alpha_g,
    beta_g,
):
    P = TOPO.world_size
    layer = MoELayer(
        batch=batch,
        seq_len=seq_len,
        model_dim=model_dim,
        hidden_dim=hidden_dim,
        experts=local_experts * P,
        world=P,
        top_k=top_k,
        capacity_factor=cf,
    )
    r = min(r, layer.capacity)
    small = {"alpha": 2e-6, "beta": 1e-12}  # gate / encode / decode: alpha + beta * bytes
    costs = CostModel.build(
        TOPO,
        {
            "compute": "alpha_beta",
            "network": "collective",
            "alpha_beta": {
                "gemm": {"alpha": alpha_g, "beta": beta_g},
                "gate": small,
                "encode": small,
                "decode": small,
            },
            "collectives": {"all_to_all": {"alpha": alpha_a, "beta": beta_a}},
        },
    )
    g = build("pipelined", layer, {"degree": r, "order": order}, ("fwd",))
    res = simulate(g, TOPO, costs)

    e, M, H, E = layer.elem, layer.model_dim, layer.hidden_dim, layer.experts
    caps = layer.chunk_capacity(r)
    td = [alpha_a + beta_a * E * c * M * e for c in caps]  # per-rank bytes of chunk j
    work = [layer.local_experts * P * c * M * H for c in caps]  # m*n*k of each expert GEMM
    te = [2 * (alpha_g + beta_g * w) for w in work]  # fc1 + fc2, PipeMoE Eq. 14
    T, C = layer.tokens, layer.capacity
    buf = e * E * C * M
    t_gate = small["alpha"] + small["beta"] * (e * (T * M + M * E) + 4 * T * E)
    t_enc = small["alpha"] + small["beta"] * (e * T * M + buf)
    t_dec = small["alpha"] + small["beta"] * (buf + e * T * M)
    expect = t_gate + t_enc + recurrence(order, td, te, td) + t_dec
    assert math.isclose(res.makespan, expect, rel_tol=1e-9), (res.makespan, expect)


def test_r1_is_sum_of_parts():
    """Eq. 12, r = 1: t_d + t_e + t_c for every issue order."""
    td, te = [3.0], [5.0]
    for order in ("two_streams", "tutel", "alternating"):
        assert recurrence(order, td, te, td) == 11.0


def test_orders_differ_where_they_should():
    """Comm-bound chunks: two streams overlap D and C; one FIFO cannot (sanity of the oracle)."""
    td, te = [4.0] * 4, [1.0] * 4
    two = recurrence("two_streams", td, te, td)
    tut = recurrence("tutel", td, te, td)
    assert two < tut == 32.0  # tutel: 8 serial exchanges, experts hidden
    assert recurrence("alternating", td, te, td) == 32.0
