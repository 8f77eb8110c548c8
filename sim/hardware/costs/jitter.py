"""Run-to-run noise: each operation's duration times a random factor drawn from a measured
distribution.

Measured runs are skewed to the right: a descheduled thread, a late wake-up or a congested
moment only ever add time, and synchronising operations (every collective waits for its
slowest member) turn the noise of one rank into everybody's delay, more so the more ranks
there are. The ideal engine predicts the undisturbed run; with a jitter model it predicts a
distribution of runs, one per seed; `sim.engine.engine.simulate` runs `replicas` of them and
reports the one with the median makespan.

The model is empirical: per op kind, quantiles of (time / median time) over repetitions of
one size, evenly spaced in probability from 0 to 1 (exec.measure.microbench measures them; the
calibration file carries them). A factor is drawn by inverse-CDF interpolation. Compute tasks
draw one factor each; a collective draws one for all its members (it is one operation);
flows (network: flow) are not jittered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sim.core.errors import ConfigError

CLASSES = ("compute", "comm", "copy")  # fallbacks for kinds without their own quantiles


@dataclass(frozen=True)
class Jitter:
    """Run-to-run noise: per op kind, quantiles of a duration's factor; seeded."""

    quantiles: dict[str, tuple[float, ...]]
    seed: int = 0
    replicas: int = 11  # runs per simulation; the median one is reported

    @classmethod
    def from_spec(cls, raw: Any, where: str = "costs.jitter") -> Jitter | None:
        if raw is None:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("quantiles"), dict):
            raise ConfigError(
                f"{where}: expected {{quantiles: {{KIND: [...]}}, seed: N, replicas: N}}"
            )
        unknown = set(raw) - {"quantiles", "seed", "replicas"}
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
        seed = raw.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"{where}.seed: expected a non-negative integer, got {seed!r}")
        replicas = raw.get("replicas", 11)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ConfigError(f"{where}.replicas: expected a positive integer, got {replicas!r}")
        qs = {}
        for kind, q in raw["quantiles"].items():
            try:
                arr = np.asarray(q, dtype=float)
            except (TypeError, ValueError):
                arr = np.array([])
            if arr.ndim != 1 or len(arr) < 2 or not (arr > 0).all() or (np.diff(arr) < 0).any():
                raise ConfigError(
                    f"{where}.quantiles.{kind}: expected at least 2 positive, non-decreasing "
                    f"factors, got {q!r}"
                )
            qs[str(kind)] = tuple(float(x) for x in arr)
        return cls(qs, seed, replicas)

    def with_seed(self, seed: int) -> Jitter:
        return replace(self, seed=seed)

    def sampler(self) -> JitterSampler:
        return JitterSampler(self)


class JitterSampler:
    """One run's draws (its own generator, so a run is reproducible from the seed)."""

    def __init__(self, jitter: Jitter):
        self.rng = np.random.default_rng(jitter.seed)
        self.tables = {k: np.asarray(v) for k, v in jitter.quantiles.items()}

    def factor(self, kind: str, cls: str) -> float:
        q = self.tables.get(kind)
        if q is None:
            q = self.tables.get(cls)
        if q is None:
            return 1.0
        u = self.rng.random() * (len(q) - 1)
        lo = int(u)
        hi = min(lo + 1, len(q) - 1)
        return float(q[lo] + (q[hi] - q[lo]) * (u - lo))


def ratio_quantiles(t: np.ndarray, groups: np.ndarray, points: int = 41) -> list[float] | None:
    """Quantiles of t / median(t of its group) over groups of at least 3 repetitions."""
    ratios = []
    for g in np.unique(groups):
        x = t[groups == g]
        if len(x) >= 3 and np.median(x) > 0:
            ratios.append(x / np.median(x))
    if not ratios:
        return None
    r = np.concatenate(ratios)
    return [float(v) for v in np.quantile(r, np.linspace(0.0, 1.0, points))]
