"""Estimators a busy host cannot inflate, for calibration (sim.hardware.costs.calibration).

On a shared host a repetition is slowed, never sped up, by what else runs: a CPU hog, a
descheduled thread, a neighbour's burst. The slow repetitions say how busy the host was, not
what the operation costs. So every estimate starts from the fastest repetitions:

- quiet: a repetition within QUIET (2x) of the fastest of its group (one size of one op) is
  quiet; the others were disturbed. The group's time is the median of its quiet repetitions
  (a hog's 3-20x inflations fall outside, the ordinary run-to-run spread stays in);
- a size all of whose repetitions were disturbed (its fastest is itself inflated) stands out
  against the other sizes: a point more than LEFT_OUT (4x) above the alpha-beta fit through
  the others is left out of the fit (`fit_without_inflated`), never one below it;
- interference speeds: the rows beside other streams within SPEED_WINDOW (4x) of their
  slowdowns' lower quartile (those vary by nature, 0.8-3.8x on a quiet host, so not QUIET
  of the fastest);
- jitter (run-to-run noise) is fitted only from quiet repetitions, as their time over their
  group's quiet median: what noise a quiet host adds, not how busy this one was;
- a fit whose quiet share is below MIN_QUIET (half its repetitions) is flagged by name.

These are the issue-29 estimators; `tests/test_calibrate_busy.py` checks that a calibration
from samples of which 30% are inflated 3-20x gives the clean samples' parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError

QUIET = 2.0  # a repetition within this factor of its group's fastest is quiet
MIN_QUIET = 0.5  # a fit whose quiet share of repetitions is below this is flagged
MIN_JITTER_SAMPLES = 6  # quiet ratios needed for a jitter distribution
GAP_FLOOR_S = 50e-6  # dispatch gaps: absolute slack over QUIET x the median (gaps near 0)


def quiet_mask(t: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """True for the repetitions within QUIET of the fastest of their group."""
    t = np.asarray(t, dtype=float)
    groups = np.asarray(groups)
    out = np.zeros(len(t), dtype=bool)
    for g in np.unique(groups):
        sel = groups == g
        out[sel] = t[sel] <= QUIET * t[sel].min()
    return out


def quiet_points(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """One point per size x: the median of its quiet repetitions; and the quiet share."""
    x, t = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    q = quiet_mask(t, x)
    xs = np.unique(x)
    ts = np.array([np.median(t[(x == v) & q]) for v in xs])
    return xs, ts, float(q.mean()) if len(q) else 1.0


LEFT_OUT = 4.0  # a size whose point lies this far above the fit through the others
SPEED_WINDOW = 4.0  # interference rows within this of their slowdowns' lower quartile


Fitter = Callable[[np.ndarray, np.ndarray], tuple[float, float, float]]


def fit_without_inflated(
    x: np.ndarray, t: np.ndarray, fit: Fitter
) -> tuple[float, float, float, int]:
    """`fit` (alpha, beta, r2) over the points, refitted without those more than LEFT_OUT
    above it (a size disturbed in every repetition; a merely nonlinear size, such as a
    first message's warm-up, stays within that) while at least two sizes remain; the
    count left out is the fourth value."""
    keep = np.ones(len(x), dtype=bool)
    a, b, r2 = fit(x, t)
    for _ in range(3):
        over = keep & (t > LEFT_OUT * (a + b * x))
        if not over.any() or (keep & ~over).sum() < 2 or len(np.unique(x[keep & ~over])) < 2:
            break
        keep &= ~over
        a, b, r2 = fit(x[keep], t[keep])
    return a, b, r2, int((~keep).sum())


def quiet_ratios(t: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Time over its group's quiet median, for the quiet repetitions of groups with at least
    two of them (one repetition says nothing about the spread)."""
    t = np.asarray(t, dtype=float)
    groups = np.asarray(groups)
    q = quiet_mask(t, groups)
    out = []
    for g in np.unique(groups):
        sel = (groups == g) & q
        if sel.sum() >= 2:
            out.append(t[sel] / np.median(t[sel]))
    return np.concatenate(out) if out else np.array([])


def quiet_gaps(gaps: np.ndarray) -> np.ndarray:
    """Dispatch gaps without the disturbed ones: at most QUIET x their median plus
    GAP_FLOOR_S (gaps sit near zero, where a factor alone would keep nothing)."""
    gaps = np.asarray(gaps, dtype=float)
    if len(gaps) == 0:
        return gaps
    return gaps[gaps <= QUIET * float(np.median(gaps)) + GAP_FLOOR_S]


def quiet_speed(ratio: np.ndarray) -> tuple[float, float]:
    """An interference speed (predicted alone time / measured time beside the others) from
    its rows, the disturbed ones left out; and the quiet share. Slowdowns beside other
    streams vary by nature (how much of the victim the others overlapped, and when), so the
    window is SPEED_WINDOW x their lower quartile rather than QUIET x their fastest (on the
    project's quiet recording it keeps every row: the plain median's speeds)."""
    slow = 1.0 / np.asarray(ratio, dtype=float)
    q = slow <= SPEED_WINDOW * float(np.quantile(slow, 0.25))
    return float(1.0 / np.median(slow[q])), float(q.mean())


def fit_quiet(g: pd.DataFrame, fit: Fitter) -> dict[str, Any]:
    """The fit (`fit`: alpha, beta, r2 of points) of one op's repetitions (columns x, t): a
    point per size from its quiet repetitions, sizes disturbed
    in every repetition left out; `quiet` is the share of quiet repetitions, `left_out` the
    sizes left out (popped by the caller for its warning)."""
    x, t, share = quiet_points(g["x"].to_numpy(dtype=float), g["t"].to_numpy(dtype=float))
    a, b, r2, out = fit_without_inflated(x, t, fit)
    keep = t <= LEFT_OUT * (a + b * x) if out else np.ones(len(x), dtype=bool)
    err = float(np.mean(np.abs((a + b * x[keep]) / t[keep] - 1.0)))
    f: dict[str, Any] = {"alpha": a, "beta": b, "r2": r2, "mean_error": err}
    return f | {"sizes": int(keep.sum()), "quiet": round(share, 4), "left_out": out}


def describe_load(load: dict[str, Any]) -> str:
    """'load average 1.3-2.1 on 2 cores, CPUs 87% busy, steal 0.1%' (what is known) of a
    calibration's meta.load (exec.measure.environment.LoadProbe)."""
    parts = []
    if "loadavg_max" in load:
        parts.append(
            f"load average {load['loadavg_min']:.1f}-{load['loadavg_max']:.1f} on "
            f"{load.get('cores', '?')} cores"
        )
    if "busy_pct" in load:
        parts.append(f"CPUs {load['busy_pct']:.0f}% busy")
    if "steal_pct" in load:
        parts.append(f"steal {load['steal_pct']:.1f}%")
    return ", ".join(parts) + (": BUSY" if load.get("busy") else "") if parts else "unknown"


def busy_warning(load: Any) -> str | None:
    """The warning a calibration taken on a busy host carries first, or None."""
    if not isinstance(load, dict) or not load.get("busy"):
        return None
    return (
        f"the host was busy while calibrating ({describe_load(load)}): the fits rest on the "
        f"quiet repetitions only (see each fit's `quiet` share)"
    )


def fit_alpha_beta(x: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """Least-squares t = alpha + beta * x with alpha, beta >= 0; returns (alpha, beta, r2).

    The residuals are relative ((fit - t) / t): sizes span decades and timing noise scales
    with the time, so plain least squares would let the largest size set alpha and miss the
    small operations (a pipeline's chunks) by tens of percent.
    """
    x, t = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    if len(x) == 0:
        raise ConfigError("calibration: no measurements to fit")
    w = 1.0 / t if (t > 0).all() else np.ones_like(t)
    w2 = w * w
    if len(np.unique(x)) < 2:  # one size says nothing about the slope: a constant cost
        return max(float((w2 * t).sum() / w2.sum()), 0.0), 0.0, 1.0
    candidates = []
    A = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    if a >= 0 and b >= 0:
        candidates.append((float(a), float(b)))
    # boundary solutions of the constrained problem: through the origin, or constant
    xx = float((w2 * x * x).sum())
    if xx > 0:
        candidates.append((0.0, max(float((w2 * x * t).sum()) / xx, 0.0)))
    candidates.append((max(float((w2 * t).sum() / w2.sum()), 0.0), 0.0))

    def sse(p: tuple[float, float], weights: np.ndarray = w2) -> float:
        return float((weights * (p[0] + p[1] * x - t) ** 2).sum())

    a, b = min(candidates, key=sse)
    total = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - sse((a, b), np.ones_like(t)) / total if total > 0 else 1.0
    return float(a), float(b), float(r2)
