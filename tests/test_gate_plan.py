"""Top-k choices that reproduce a routing model's token counts (sim.workload.gate_plan)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.workload.gate_plan import assign, plan, realisable
from sim.workload.moe import MoELayer


def _kept_by_gshard(choices: np.ndarray, experts: int, capacity: int) -> np.ndarray:
    """The layer's capacity rule, written out: first choices in token order, then second
    choices, ...; a choice finding its expert full is dropped."""
    used = np.zeros(experts, dtype=np.int64)
    for c in range(choices.shape[1]):
        for t in range(choices.shape[0]):
            e = choices[t, c]
            if used[e] < capacity:
                used[e] += 1
    return used


@settings(max_examples=200, deadline=None)
@given(
    T=st.integers(1, 40),
    E=st.integers(1, 9),
    k=st.integers(1, 4),
    cf=st.sampled_from([0.25, 0.75, 1.0, 1.5, 4.0]),
    data=st.data(),
)
def test_choices_are_top_k_and_keep_what_the_plan_says(T, E, k, cf, data):
    k = min(k, E)
    row = data.draw(st.lists(st.integers(0, 3 * T), min_size=E, max_size=E))
    routing = {"kind": "matrix", "tokens": [row]}
    layer = MoELayer(
        batch=1,
        seq_len=T,
        model_dim=4,
        hidden_dim=4,
        experts=E,
        world=1,
        top_k=k,
        capacity_factor=cf,
        routing=routing,
    )
    g = plan(layer)
    assert (g.demand.sum(axis=1) == k * T).all() and (g.demand <= T).all()
    choices = g.choices(0, seed=3)
    assert choices.shape == (T, k)
    assert all(len(set(row)) == k for row in choices.tolist())  # distinct experts per token
    assert (np.bincount(choices.ravel(), minlength=E) == g.demand[0]).all()
    kept = _kept_by_gshard(choices, E, layer.capacity)
    assert (kept == g.kept[0]).all()
    if g.exact:
        assert (kept == layer.tokens_matrix[0]).all()
    else:
        assert g.differences() and all("GPU 0" in d for d in g.differences())


def test_a_realisable_zipf_routing_is_reproduced_with_drops():
    routing = {"kind": "zipf", "s": 0.8, "seed": 1}
    layer = MoELayer(
        batch=1,
        seq_len=32,
        model_dim=16,
        hidden_dim=24,
        experts=4,
        world=2,
        top_k=2,
        capacity_factor=0.75,
        routing=routing,
    )
    g = plan(layer)
    assert g.exact and (g.kept == layer.tokens_matrix).all()
    assert (layer.routed_matrix > layer.capacity).any()  # choices are dropped
    for p in range(2):
        kept = _kept_by_gshard(g.choices(p), 4, layer.capacity)
        assert (kept == layer.tokens_matrix[p]).all()


def test_demand_keeps_counts_below_capacity_and_adjusts_only_full_experts():
    routed, kept = np.array([9, 3, 2, 1]), np.array([4, 3, 2, 1])  # C = 4: expert 0 is full
    # T = 6, k = 2: 12 choices; expert 0 takes 6 (one per token), 2 of them dropped
    assert realisable(routed, kept, T=6, k=2, C=4).tolist() == [6, 3, 2, 1]
    # T = 5: 10 choices; the surplus comes off the full expert, down to its capacity
    assert realisable(routed, kept, T=5, k=2, C=4).tolist() == [4, 3, 2, 1]
    # T = 10: 20 choices, but expert 0 takes at most 10: the next most demanded takes the
    # rest, and its kept count (4) is no longer the model's (3)
    assert realisable(routed, kept, T=10, k=2, C=4).tolist() == [10, 7, 2, 1]


def test_assign_refuses_demands_no_gate_makes():
    with pytest.raises(ValueError, match="k\\*T"):
        assign(np.array([3, 0]), T=2, k=1)  # an expert twice for one token
    with pytest.raises(ValueError, match="k\\*T"):
        assign(np.array([1, 0]), T=2, k=1)  # a token without a choice
