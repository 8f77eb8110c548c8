"""The incremental max-min solver gives the rates of a solve from scratch, flow for flow, by
either of its ways (above the floor of the changed rates, or in rounds around the change).

Random instances: links of random capacities (some in series: pairs that always carry the
same flows, as a GPU's PCIe and NIC links do), bundles on random routes with multiplicities,
arriving in batches between finishes. After every change the network's rates are compared
with progressive filling over everything active, on the full routes (so the merging of links
in series is checked too).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.network.bundles import BundleBatch
from sim.hardware.network.flows import FlowNetwork
from sim.hardware.network.incremental import MaxMinState
from sim.hardware.network.maxmin import (
    filling_by_local_minima,
    max_min_rates,
    progressive_filling,
    ranges,
)
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.workload.moe import MoELayer


def _batch(rng: np.random.Generator, n: int, nl: int, ranks: int) -> BundleBatch:
    """`n` bundles on random routes; links 0..nl/2-1 are in series with link + nl/2 (both or
    neither, with the second's capacity drawn separately)."""
    inc_b, inc_l, inc_m = [], [], []
    half = nl // 2
    for b in range(n):
        links = rng.choice(nl, size=int(rng.integers(1, 5)), replace=False)
        links = np.unique(np.concatenate([links, links[links < half] + half]))
        mult = rng.integers(1, 4, size=len(links)).astype(float)
        mult[links >= half] = [  # a link in series carries what its partner carries
            mult[links == p][0] if (links == p).any() else m
            for p, m in zip(links[links >= half] - half, mult[links >= half])
        ]
        inc_b += [b] * len(links)
        inc_l += links.tolist()
        inc_m += mult.tolist()
    src = rng.integers(0, ranks, size=n)
    return BundleBatch(
        rng.integers(1, 4, size=n).astype(float),
        rng.uniform(1.0, 50.0, size=n),
        np.zeros(n),
        np.array(inc_b),
        np.array(inc_l),
        np.array(inc_m),
        np.repeat(np.arange(n), 2),
        np.stack([src, (src + 1) % ranks], axis=1).ravel(),
    )


def _scratch_rates(net: FlowNetwork) -> tuple[np.ndarray, np.ndarray]:
    """(live slots, their max-min rates) by progressive filling over every link they cross."""
    t = net.table
    live = np.flatnonzero(t.alive)
    pos, seg = ranges(t.all_ptr, live)
    lk, il = np.unique(t.all_l[pos], return_inverse=True)
    return live, max_min_rates(len(live), seg, il, t.all_m[pos], net.cap[lk])


def _rounds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every local solve take the rounds (`solve_local`), as when the floor is too low."""
    monkeypatch.setattr(MaxMinState, "solve_above", lambda self, *a: None)


@pytest.mark.parametrize("way", ["above", "rounds"])
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    nl=st.sampled_from([4, 8, 16]),
    batches=st.integers(1, 6),
    size=st.integers(1, 40),
)
def test_incremental_rates_equal_a_solve_from_scratch(way, seed, nl, batches, size):
    with pytest.MonkeyPatch.context() as mp:
        if way == "rounds":
            _rounds_only(mp)
        _random_run_matches_scratch(seed, nl, batches, size)


def _random_run_matches_scratch(seed: int, nl: int, batches: int, size: int) -> None:
    rng = np.random.default_rng(seed)
    cap = rng.uniform(1.0, 10.0, size=nl)
    cap[nl // 2 :] = np.where(rng.random(nl - nl // 2) < 0.5, cap[: nl // 2], cap[nl // 2 :])
    clock = [0.0]
    topo = SimpleNamespace(link_cap=cap, num_links=nl)
    net = FlowNetwork(topo, lambda: clock[0], local_min=0, local_max_share=np.inf)
    arrivals = sorted(rng.uniform(0.0, 20.0, size=batches))
    owner = 0
    while arrivals or net.active:
        t_next = net.next_finish()
        if arrivals and arrivals[0] <= t_next:
            clock[0] = arrivals.pop(0)
            net.add(_batch(rng, size, nl, 4), owner)
            owner += 1
        else:
            clock[0] = t_next
            assert net.pop_finished()  # the finish it announced happens
        net.recompute()
        live, want = _scratch_rates(net)
        np.testing.assert_allclose(net.table.base[live], want, rtol=1e-9)
    assert net.local_solves > 0 or owner == 0


@pytest.mark.parametrize("nodes", [2, 4])
def test_skewed_all_to_allv_same_times_incremental_or_from_scratch(monkeypatch, nodes):
    """A Zipf-routed layer on dgx-a100: the engine's times do not depend on how rates are
    solved (the default switches to local solves from 512 active bundles)."""
    layer = MoELayer(
        batch=2,
        seq_len=256,
        model_dim=512,
        hidden_dim=1024,
        experts=8 * nodes,
        world=8 * nodes,
        top_k=2,
        capacity_factor=1.2,
        routing={"kind": "zipf", "s": 1.2, "seed": 0},
    )
    graph = build("sequential", layer, {}, ("fwd", "bwd"))
    topo = Topology.load("dgx-a100", nodes=nodes)
    costs = CostModel.build(topo, {"fidelity": "flow"})
    runs = {}
    for mode, local_min in (("above", 0), ("rounds", 0), ("scratch", 10**9)):
        with monkeypatch.context() as mp:
            init = FlowNetwork.__init__

            def patched(self, *a, _init=init, _lm=local_min, **k):
                _init(self, *a, **k)
                self.local_min = _lm

            mp.setattr(FlowNetwork, "__init__", patched)
            if mode == "rounds":
                _rounds_only(mp)
            runs[mode] = simulate(graph, topo, costs)
    for mode in ("above", "rounds"):
        np.testing.assert_allclose(runs[mode].start, runs["scratch"].start, rtol=1e-9)
        np.testing.assert_allclose(runs[mode].end, runs["scratch"].end, rtol=1e-9)
        np.testing.assert_allclose(
            runs[mode].link_bytes, runs["scratch"].link_bytes, rtol=1e-9, atol=1e-3
        )


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60), nl=st.integers(1, 12))
def test_filling_by_local_minima_equals_progressive_filling(seed, n, nl):
    rng = np.random.default_rng(seed)
    k = rng.integers(1, min(nl, 4) + 1, size=n)
    inc_b = np.repeat(np.arange(n), k)
    inc_l = np.concatenate([rng.choice(nl, size=int(x), replace=False) for x in k])
    inc_m = rng.integers(1, 4, size=len(inc_b)).astype(float)
    cap = rng.choice([1.0, 2.0, 3.0, 7.5], size=nl)  # few values: ties happen
    want, _ = progressive_filling(n, inc_b, inc_l, inc_m, cap)
    got, froze = filling_by_local_minima(n, inc_b, inc_l, inc_m, cap)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    # the link that froze a bundle is on its route
    assert all(froze[b] in inc_l[inc_b == b] for b in range(n))


def test_links_in_series_are_represented_by_the_narrowest():
    """Links 0 and 1 carry the same flows (1 is narrower), link 2 also carries another flow."""
    topo = SimpleNamespace(link_cap=np.array([5.0, 3.0, 4.0, 9.0]), num_links=4)
    net = FlowNetwork(topo, lambda: 0.0)
    batch = BundleBatch(
        np.ones(2),
        np.ones(2),
        np.zeros(2),
        np.array([0, 0, 0, 1, 1]),
        np.array([0, 1, 2, 2, 3]),
        np.ones(5),
        np.array([0, 1]),
        np.array([0, 1]),
    )
    net.add(batch, 0)
    net.recompute()
    assert net.rep.tolist() == [1, 1, 2, 3]
    np.testing.assert_allclose(net.table.base, [2.0, 2.0])  # link 2 shared by both
    np.testing.assert_allclose(net.usage, [2.0, 2.0, 4.0, 2.0])


@pytest.mark.parametrize("gone, want", [(0, {1: 1.0, 2: 9.0}), (2, {0: 0.5, 1: 0.5})])
def test_rates_below_the_floor_stay_and_the_rest_is_refilled(monkeypatch, gone, want):
    """Link 0 (capacity 1) carries bundles a and b, link 1 (capacity 10) carries b and c:
    a = b = 0.5 and c = 9.5. When a finishes (floor 0.5), b and c are re-filled on what is
    left (b = 1 on link 0, c = 9); when c finishes instead (floor 9.5), nothing below it
    moves: a and b keep 0.5."""
    clock = [0.0]
    topo = SimpleNamespace(link_cap=np.array([1.0, 10.0]), num_links=2)
    net = FlowNetwork(topo, lambda: clock[0], local_min=0, local_max_share=np.inf)
    sizes = np.array([10.0, 10.0, 10.0])
    sizes[gone] = 0.25  # finishes first
    inc_b, inc_l = np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1])
    batch = BundleBatch(
        np.ones(3), sizes, np.zeros(3), inc_b, inc_l, np.ones(4), np.arange(3), np.arange(3)
    )
    net.add(batch, 0)
    net.recompute()
    np.testing.assert_allclose(net.table.base, [0.5, 0.5, 9.5])
    clock[0] = net.next_finish()
    assert net.pop_finished()[0][1] == 1
    floors = []
    above = MaxMinState.solve_above

    def spy(self, t, floor, *a):
        floors.append(floor)
        return above(self, t, floor, *a)

    monkeypatch.setattr(MaxMinState, "solve_above", spy)
    net.recompute()
    assert floors == [[0.5, 0.5, 9.5][gone]]
    live = np.flatnonzero(net.table.alive)
    got = dict(zip(live.tolist(), net.table.base[live].tolist()))
    assert got == pytest.approx(want, rel=1e-12)
