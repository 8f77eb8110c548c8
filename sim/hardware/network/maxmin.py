"""Max-min fair rates by progressive filling, and the test that a rate is max-min fair.

Progressive filling: all unfrozen flows rise together; the link that saturates first freezes
every bundle crossing it at that level; repeat. The allocation it reaches is the unique
max-min fair one, characterised flow by flow: every flow has a *bottleneck*, a saturated link
on its route where no other flow gets more. `sim.hardware.network.incremental` leans on that
characterisation to re-solve only around a change.
"""

from __future__ import annotations

import numpy as np

# Links saturating within this relative distance of the lowest level freeze together (at it).
TIE_RTOL = 1e-12
# A link is saturated, and a flow the largest on it, within this relative slack. Far above
# the rounding of sums of a few thousand rates (~1e-13) and far below any real difference
# between rates in a simulation (one flow of millions sharing a link is 1e-6 of it).
BOTTLENECK_RTOL = 1e-10


def progressive_filling(
    n: int, inc_b: np.ndarray, inc_l: np.ndarray, inc_m: np.ndarray, cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(per-flow rate of each bundle, the compact link that froze it or -1).

    `inc_l` indexes `cap` (compact link ids); `inc_m` is how many of the bundle's flows cross
    the link.
    """
    rate = np.zeros(n)
    froze_at = np.full(n, -1, dtype=np.int64)
    frozen = np.zeros(n, dtype=bool)
    used = np.zeros(len(cap))
    nl = len(cap)
    # incidences of unfrozen bundles only, shrinking as bundles freeze
    ib, il, im = inc_b, inc_l, inc_m
    while not frozen.all():
        load = np.bincount(il, weights=im, minlength=nl)
        busy = load > 0
        if not busy.any():  # bundles that cross no link (cannot happen for real flows)
            rate[~frozen] = np.inf
            break
        level = np.full(nl, np.inf)
        level[busy] = (cap[busy] - used[busy]) / load[busy]
        lev = max(float(level.min()), 0.0)
        sat = busy & (level <= lev * (1 + TIE_RTOL) + 1e-300)
        # masks, not np.unique / np.isin: those sort, and this loop runs once per
        # saturation level at every solve
        hit = sat[il]
        newly = np.zeros(n, dtype=bool)
        newly[ib[hit]] = True
        # of links saturating together, a bundle records the highest: the same rule in every
        # solver keeps recorded bottlenecks free of cycles (`assigned` relies on it)
        np.maximum.at(froze_at, ib[hit], il[hit])
        rate[newly] = lev
        frozen |= newly
        sel = newly[ib]
        used += np.bincount(il[sel], weights=im[sel] * lev, minlength=nl)
        keep = ~sel
        ib, il, im = ib[keep], il[keep], im[keep]
    return rate, froze_at


def filling_by_local_minima(
    n: int, inc_b: np.ndarray, inc_l: np.ndarray, inc_m: np.ndarray, cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """progressive_filling in fewer rounds; `inc_b` must be grouped by bundle.

    A link whose fill level is the lowest on the route of every unfrozen bundle crossing it
    (a local minimum) saturates at that level whatever else freezes first, so all such links
    freeze together: the rounds are the depth of the chain of bottlenecks (2-4 in an
    all-to-allv), not the number of distinct rates (dozens). Same allocation up to rounding.
    """
    rate = np.zeros(n)
    froze_at = np.full(n, -1, dtype=np.int64)
    lens = np.bincount(inc_b, minlength=n)
    rate[lens == 0] = np.inf  # crosses no link
    nl = len(cap)
    spare = cap.astype(float)
    level = np.empty(nl)
    live = np.flatnonzero(lens)  # unfrozen bundles, in the order of their incidences
    lens = lens[live]
    ib, il, im = inc_b, inc_l, inc_m
    while len(live):
        load = np.bincount(il, weights=im, minlength=nl)
        level.fill(np.inf)
        np.divide(np.maximum(spare, 0.0), load, out=level, where=load > 0)
        lv = level[il]
        starts = np.cumsum(lens) - lens
        lowest = np.minimum.reduceat(lv, starts)
        higher = np.zeros(nl, dtype=bool)
        higher[il[lv > np.repeat(lowest * (1 + TIE_RTOL), lens)]] = True
        hit = ~higher[il]
        done = np.logical_or.reduceat(hit, starts)
        froze = live[done]
        rate[froze] = lowest[done]
        # one link that froze each bundle: the highest hit (as in progressive_filling)
        sel = np.repeat(done, lens)
        np.maximum.at(froze_at, ib[hit], il[hit])
        spare -= np.bincount(
            il[sel], weights=im[sel] * np.repeat(lowest[done], lens[done]), minlength=nl
        )
        keep = ~sel
        ib, il, im = ib[keep], il[keep], im[keep]
        live, lens = live[~done], lens[~done]
    return rate, froze_at


def max_min_rates(
    n: int, inc_b: np.ndarray, inc_l: np.ndarray, inc_m: np.ndarray, cap: np.ndarray
) -> np.ndarray:
    """Per-flow rate of each bundle under max-min fairness (progressive filling)."""
    return progressive_filling(n, inc_b, inc_l, inc_m, cap)[0]


def bottleneck_ok(
    rate: np.ndarray, used: np.ndarray, cap: np.ndarray, top: np.ndarray
) -> np.ndarray:
    """Per (flow rate, link) pair: is the link a bottleneck of that flow? `used` is the link's
    load, `top` the largest rate of a flow crossing it (arrays aligned with `rate`)."""
    return (used >= cap * (1 - BOTTLENECK_RTOL)) & (rate >= top * (1 - BOTTLENECK_RTOL))


def ranges(ptr: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ptr[i]..ptr[i+1] for every i in `ids`, concatenated, and which of `ids`
    each position belongs to (CSR rows gathered without a Python loop)."""
    starts = ptr[ids]
    lens = ptr[ids + 1] - starts
    seg = np.repeat(np.arange(len(ids)), lens)
    ends = np.cumsum(lens)
    pos = np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(starts - (ends - lens), lens)
    return pos, seg


def distinct(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values: np.unique without its hash-table path, which costs ~10x a sort
    on the few-hundred-element arrays of a local solve."""
    if len(x) < 2:
        return x.copy()
    s = np.sort(x)
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def relabel(x: np.ndarray, bound: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values of x, the index of each element of x among them). With `bound` (all
    values below it) not much more than len(x), by marking instead of sorting: O(len(x) +
    bound), and marking a few thousand links costs less than sorting a thousand values."""
    if bound and 8 * len(x) > bound:
        mark = np.zeros(bound, dtype=bool)
        mark[x] = True
        return np.flatnonzero(mark), (np.cumsum(mark) - 1)[x]
    u = distinct(x)
    return u, np.searchsorted(u, x)
