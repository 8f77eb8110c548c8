"""Load profiles and their imbalance: max/mean and Gini of a set of loads, a log-normal
profile solved for a target imbalance, and the integer split of a GPU's choices over experts.

Imbalance measures (the ones the sources publish):
- max/mean: the hottest load over the mean (UltraEP, arXiv 2606.04101, reports 1.30-4.01
  tokens per rank across 106B-671B models);
- Gini: half the mean absolute difference over the mean, 0 for equal loads, (n-1)/n for one
  load holding everything (DODOCO, arXiv 2605.20982: 0.105-0.38 per expert on real text).

A log-normal profile of n loads is deterministic: the i-th load is exp(sigma * z_i), z_i the
standard normal quantile at (i + 1/2) / n, so it has the log-normal shape DeepSeek-V3's
per-rank loads fit (deepseek-ai/DeepEP PR #393) and hits its target exactly at any n, with
no sampling noise; which expert (GPU, node) gets which load is a seeded permutation.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from sim.core.errors import ConfigError

MEASURES = ("max_mean", "gini", "sigma")
MAX_SIGMA = 20.0  # exp(20 z) already puts every load on the top one at any n we accept
_SOLVE_STEPS = 200  # bisection halvings: sigma to ~1e-15 relative


def max_mean(loads: np.ndarray) -> float:
    loads = np.asarray(loads, dtype=float)
    mean = float(loads.mean()) if loads.size else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0


def gini(loads: np.ndarray) -> float:
    """Mean absolute difference over twice the mean (0: equal loads)."""
    x = np.sort(np.asarray(loads, dtype=float).ravel())
    n, total = x.size, float(x.sum())
    if n == 0 or total <= 0:
        return 0.0
    # sum_i sum_j |x_i - x_j| = 2 sum_i (2i - n + 1) x_(i) over the sorted loads
    return float(((2 * np.arange(n) - n + 1) * x).sum() / (n * total))


def profile(n: int, sigma: float) -> np.ndarray:
    """n log-normal loads of mean 1, ascending (module doc)."""
    if n == 1 or sigma == 0:
        return np.ones(n)
    nd = NormalDist()
    z = np.array([nd.inv_cdf((i + 0.5) / n) for i in range(n)])
    v = np.exp(sigma * (z - z.max()))  # scaled by the top load: no overflow at large sigma
    return v / v.mean()


def solve_sigma(n: int, measure: str, target: float, where: str) -> float:
    """The sigma whose profile of n loads has `measure` equal to `target`; a ConfigError
    naming `where` when no profile of n loads reaches it."""
    if measure == "sigma":
        if not 0 <= target <= MAX_SIGMA:
            raise ConfigError(f"{where}: expected a sigma in [0, {MAX_SIGMA:g}], got {target!r}")
        return float(target)
    f = max_mean if measure == "max_mean" else gini
    lo_val = 1.0 if measure == "max_mean" else 0.0
    hi_val = f(profile(n, MAX_SIGMA))
    if target == lo_val:
        return 0.0
    # one load holding everything is the bound: max/mean n, Gini (n-1)/n, never reached
    if not lo_val < target < hi_val:
        bound = f"{lo_val:g} (equal loads) and {hi_val:.4g}" + (
            " (all on one)" if n > 1 else " (one load only)"
        )
        raise ConfigError(
            f"{where}: {target!r} is not reachable over {n} load(s): expected a value between "
            f"{bound}"
        )
    lo, hi = 0.0, MAX_SIGMA
    for _ in range(_SOLVE_STEPS):
        mid = 0.5 * (lo + hi)
        if f(profile(n, mid)) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def split(total: int, weights: np.ndarray, cap: int) -> np.ndarray:
    """`total` choices over experts in proportion to `weights`, each at most `cap` (a token
    picks an expert once, so one GPU sends an expert at most its T tokens): the capped
    shares are filled first and the rest shared by the others (water-filling), then the
    integer parts are completed by largest remainder, so the counts add up to `total`."""
    w = np.asarray(weights, dtype=float)
    n = w.size
    if total > cap * n:
        raise ValueError(f"{total} choices do not fit {n} experts of {cap} each")
    share = np.zeros(n)
    free = np.ones(n, dtype=bool)
    left = float(total)
    while left > 0 and free.any():  # at most n rounds: each caps one expert or ends
        wf = np.where(free, w, 0.0)
        if wf.sum() <= 0:  # only zero weights left: spread evenly over the free ones
            wf = free.astype(float)
        want = left * wf / wf.sum()
        over = free & (share + want > cap)
        if not over.any():
            share += want
            break
        left -= float((cap - share[over]).sum())
        share[over] = cap
        free &= ~over
    counts = np.floor(share + 1e-9).astype(np.int64)
    counts = np.minimum(counts, cap)
    short = total - int(counts.sum())
    if short > 0:
        room = counts < cap
        rem = np.where(room, share - counts, -np.inf)
        order = np.argsort(-rem, kind="stable")
        for e in order:
            if short == 0:
                break
            if counts[e] < cap:
                counts[e] += 1
                short -= 1
    return counts
