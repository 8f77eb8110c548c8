"""Max-min rates from a guess of every bundle's bottleneck (sim.hardware.network.assigned):
whatever the guess, the answer is the allocation of progressive filling or None (never a
wrong allocation), and the bottlenecks of the allocation itself always settle."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.hardware.network.assigned import solve_assigned
from sim.hardware.network.maxmin import progressive_filling


def _instance(seed: int, n: int, nl: int, ties: bool):
    """`n` bundles on 1-4 random links of `nl`, multiplicities 1-2; integer capacities when
    `ties` (equal levels on different links, the case where bottlenecks are ambiguous)."""
    rng = np.random.default_rng(seed)
    ib, il, im = [], [], []
    for b in range(n):
        links = rng.choice(nl, size=int(rng.integers(1, min(nl, 4) + 1)), replace=False)
        ib += [b] * len(links)
        il += links.tolist()
        im += rng.integers(1, 3, size=len(links)).tolist()
    cap = rng.uniform(1.0, 10.0, size=nl)
    if ties:
        cap = np.round(cap)
    return rng, np.array(ib), np.array(il), np.array(im, dtype=float), cap


def test_one_link_closed_form():
    # k flows on one link of capacity c: c / k each, whatever the guess
    ib, il, im = np.arange(4), np.zeros(4, dtype=np.int64), np.ones(4)
    rate, a = solve_assigned(4, ib, il, im, np.array([8.0]), np.full(4, -1))
    np.testing.assert_array_equal(rate, 2.0)
    np.testing.assert_array_equal(a, 0)


def test_two_links_in_a_chain_closed_form():
    # a on link 0 (cap 1) and link 1 (cap 3), b on link 1 alone: a = 1, b = 2
    ib, il, im = np.array([0, 0, 1]), np.array([0, 1, 1]), np.ones(3)
    for guess in ([0, 1], [1, 1], [-1, -1]):
        rate, _ = solve_assigned(2, ib, il, im, np.array([1.0, 3.0]), np.array(guess))
        np.testing.assert_allclose(rate, [1.0, 2.0], rtol=1e-15)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 50),
    nl=st.integers(1, 10),
    ties=st.booleans(),
    warm=st.booleans(),
)
def test_the_allocation_own_bottlenecks_settle_to_it(seed, n, nl, ties, warm):
    rng, ib, il, im, cap = _instance(seed, n, nl, ties)
    want, froze = progressive_filling(n, ib, il, im, cap)
    start = None
    if warm:  # levels near the answer, as the previous solve leaves them
        start = np.full(nl, np.inf)
        start[froze] = want * rng.uniform(0.8, 1.2, size=n)
    got = solve_assigned(n, ib, il, im, cap, froze, start)
    assert got is not None
    np.testing.assert_allclose(got[0], want, rtol=1e-10)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 50),
    nl=st.integers(1, 10),
    ties=st.booleans(),
    wrong=st.floats(0.0, 1.0),
)
def test_any_guess_gives_the_allocation_or_none(seed, n, nl, ties, wrong):
    rng, ib, il, im, cap = _instance(seed, n, nl, ties)
    want, froze = progressive_filling(n, ib, il, im, cap)
    guess = froze.copy()
    bad = rng.random(n) < wrong  # some bundles guessed at any link (or none, -1)
    guess[bad] = rng.integers(-1, nl, size=int(bad.sum()))
    got = solve_assigned(n, ib, il, im, cap, guess)
    if got is not None:
        rate, a = got
        np.testing.assert_allclose(rate, want, rtol=1e-10)
        # the link each bundle is assigned to is one of its own
        assert set(zip(range(n), a)) <= set(zip(ib.tolist(), il.tolist()))
