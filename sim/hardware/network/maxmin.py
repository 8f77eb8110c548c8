"""Max-min fair rates by progressive filling."""

from __future__ import annotations

import numpy as np


def max_min_rates(
    n: int, inc_b: np.ndarray, inc_l: np.ndarray, inc_m: np.ndarray, cap: np.ndarray
) -> np.ndarray:
    """Per-flow rate of each bundle under max-min fairness (progressive filling).

    `inc_l` indexes `cap` (compact link ids). All unfrozen flows rise together; the link that
    saturates first freezes every bundle crossing it at that level; repeat.
    """
    rate = np.zeros(n)
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
        sat = busy & (level <= lev * (1 + 1e-12) + 1e-300)
        # masks, not np.unique / np.isin: those sort, and this loop runs once per
        # saturation level at every flow start and finish
        newly = np.zeros(n, dtype=bool)
        newly[ib[sat[il]]] = True
        rate[newly] = lev
        frozen |= newly
        sel = newly[ib]
        used += np.bincount(il[sel], weights=im[sel] * lev, minlength=nl)
        keep = ~sel
        ib, il, im = ib[keep], il[keep], im[keep]
    return rate
