"""Max-min fair rates from a guess of every bundle's bottleneck: solve, verify, repair.

Progressive filling (`maxmin`) is a chain: a link's fill level depends on the levels of the
links that froze some of its bundles first, so even by local minima it takes as many numpy
rounds as that chain is deep, each round ~20 array passes. Between two solves of a
simulation, though, most bundles keep their bottleneck. Given an *assignment* (each bundle to
one of its links, its bottleneck), the levels solve a linear system: on every link that some
bundle is assigned to (a saturated link),

    level[l] * own[l] + sum over bundles b on l assigned elsewhere of m_b * level[a(b)] = spare[l]

(`own[l]`: flows assigned to l crossing it). When the assignment is a max-min one the system
is triangular in the order the links saturate, so Jacobi iteration reaches its exact solution
after as many sweeps as that order is deep, each sweep ~5 array passes, and fewer when it
starts from the previous levels (only links downstream of the change move).

The result is then *checked*, not trusted: it is the max-min fair allocation exactly when
every bundle's rate is at most the level of every saturated link it crosses (so its assigned
link is a bottleneck: saturated, and no bundle on it gets more) and no unsaturated link is
over its spare capacity (`maxmin` module docstring: that characterises the unique max-min
allocation). Where the check fails, bundles move to the link that holds them lowest, links
found overloaded take the bundles above their equal share, and the system is solved again; a
guess that does not settle in a few repairs returns None, and the caller fills from scratch.
"""

from __future__ import annotations

import numpy as np

# Rounds of "solve, check, reassign" before giving up (the caller then fills from scratch).
MAX_REPAIRS = 6
# Jacobi sweeps before giving up: a max-min assignment settles after as many sweeps as the
# chain of bottlenecks is deep (tens); one with a cycle (a wrong guess) may never settle.
MAX_SWEEPS = 200
# A rate above a link's level by more than this (relative) means the link holds it lower;
# far above the rounding of the sweeps (~1e-15 per term), far below any real difference.
CHECK_RTOL = 1e-12


def solve_assigned(
    n: int,
    inc_b: np.ndarray,
    inc_l: np.ndarray,
    inc_m: np.ndarray,
    spare: np.ndarray,
    guess: np.ndarray,
    warm: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(per-flow rate of each bundle, the link it is assigned to) of the max-min allocation,
    or None when the guess does not settle. Incidences as in `maxmin.filling_by_local_minima`
    (`inc_l` indexes `spare`); `guess`: a link of each bundle, -1 where none is known;
    `warm`: a starting level per link (the previous solve's), or None."""
    nl = len(spare)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    if np.bincount(inc_b, minlength=n).min() == 0:
        return None  # a bundle that crosses no link: leave it to the filling
    a = _valid(n, inc_b, inc_l, inc_m, spare, guess, warm)
    lam: np.ndarray | None
    lam = np.zeros(nl) if warm is None else np.where(np.isfinite(warm), warm, 0.0)
    for _ in range(MAX_REPAIRS):
        lam = _levels(inc_b, inc_l, inc_m, spare, a, lam)
        if lam is None:
            return None
        rate = lam[a]
        sat = np.zeros(nl, dtype=bool)
        sat[a] = True
        lam_inc = np.where(sat[inc_l], lam[inc_l], np.inf)
        high = rate[inc_b] > lam_inc * (1 + CHECK_RTOL)
        load = np.bincount(inc_l, weights=inc_m * rate[inc_b], minlength=nl)
        over = ~sat & (load > spare * (1 + CHECK_RTOL) + 1e-300)
        if not high.any() and not over.any() and rate.min() >= 0:
            # every bundle records the highest of its links at its level: with one rule for
            # ties, a bundle on tied links A and B and another on B and A cannot record one
            # each, a cycle the next solve's sweeps would never settle
            tie = lam_inc <= rate[inc_b] * (1 + CHECK_RTOL)
            np.maximum.at(a, inc_b[tie], inc_l[tie])
            return rate, a
        if over.any():
            # an overloaded free link holds back at least the bundles above its equal share
            share = np.full(nl, np.inf)
            w = np.bincount(inc_l, weights=inc_m, minlength=nl)
            np.divide(spare, w, out=share, where=over)
            take = over[inc_l] & (rate[inc_b] > share[inc_l])
            a[inc_b[take]] = inc_l[take]
            lam[over] = share[over]
        if high.any():
            # each bundle held lower elsewhere moves to its lowest such link
            hb, hl = inc_b[high], inc_l[high]
            order = np.lexsort((hl, -lam_inc[high]))
            a[hb[order]] = hl[order]  # the last write per bundle: its lowest level, highest id
    return None


def _valid(
    n: int,
    inc_b: np.ndarray,
    inc_l: np.ndarray,
    inc_m: np.ndarray,
    spare: np.ndarray,
    guess: np.ndarray,
    warm: np.ndarray | None,
) -> np.ndarray:
    """The guess where it names one of the bundle's links; elsewhere the bundle's link of
    lowest estimated level (the warm level where known, else the equal share)."""
    a = np.asarray(guess, dtype=np.int64).copy()
    mine = np.zeros(n, dtype=bool)
    mine[inc_b[inc_l == a[inc_b]]] = True
    if mine.all():
        return a
    w = np.bincount(inc_l, weights=inc_m, minlength=len(spare))
    est = np.full(len(spare), np.inf)
    np.divide(spare, w, out=est, where=w > 0)
    if warm is not None:
        est = np.where(np.isfinite(warm) & (warm > 0), warm, est)
    sel = ~mine[inc_b]
    sb, sl = inc_b[sel], inc_l[sel]
    order = np.lexsort((sl, -est[sl]))
    a[sb[order]] = sl[order]  # the last write per bundle: its lowest level, highest id
    return a


def _levels(
    inc_b: np.ndarray,
    inc_l: np.ndarray,
    inc_m: np.ndarray,
    spare: np.ndarray,
    a: np.ndarray,
    lam: np.ndarray,
) -> np.ndarray | None:
    """The levels the assignment `a` implies, by Jacobi sweeps from `lam`; None if they do
    not settle. Free links (no bundle assigned) keep a level of 0: nothing reads it."""
    nl = len(spare)
    own_inc = inc_l == a[inc_b]
    own = np.bincount(inc_l[own_inc], weights=inc_m[own_inc], minlength=nl)
    sat = own > 0
    other = ~own_inc
    ol, om, oa = inc_l[other], inc_m[other], a[inc_b[other]]
    lam = np.where(sat, lam, 0.0)
    new = np.zeros(nl)
    buf = np.empty(len(oa))
    for _ in range(MAX_SWEEPS):
        # in place where numpy allows: a sweep is a handful of passes, run tens of times
        lam.take(oa, out=buf)
        np.multiply(buf, om, out=buf)
        left = spare - np.bincount(ol, weights=buf, minlength=nl)  # (int zeros when empty)
        np.divide(left, own, out=new, where=sat)
        if (new == lam).all():
            return lam
        lam, new = new, lam
    return None
