"""Tutel (paper 002): adaptive pipelining, a degree x all-to-all algorithm per iteration.

The graph is the pipelined layer in Tutel's queue order (all dispatch rounds on the one
communication stream before any combine) with a chosen degree d in {1, 2, 4, 8} and
algorithm in {linear, 2dh}. The choice adapts to the capacity factor f, which changes from
iteration to iteration (Tutel Fig. 1), through the online search of Algorithm 2
(`OnlineSearch`): capacity factors are grouped into buckets of width `bucket_len`; within a
bucket the strategies are tried one per iteration until each has run once, and from then on
the best is used (measured times normalised to the bucket's lowest f, since an MoE step's
time grows about linearly with f). A capacity factor that has itself tried every strategy
uses its own best. `sim.search.tutel_online` drives it with simulated times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.errors import ConfigError
from sim.graph import TaskGraph
from sim.strategies.moe import build_layer
from sim.workload import MoELayer

NAME = "tutel"
DEFAULTS: dict[str, Any] = {"degree": 1, "algo": "linear"}
CANDIDATES: tuple[tuple[int, str], ...] = tuple(
    (d, a) for d in (1, 2, 4, 8) for a in ("linear", "2dh")
)

Strategy = tuple[int, str]


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    if params["algo"] not in ("linear", "2dh"):
        raise ConfigError(f"strategy.algo: Tutel uses 'linear' or '2dh', got {params['algo']!r}")
    return build_layer(
        layer,
        degree=params["degree"],
        order="tutel",
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
    )


@dataclass
class _Bucket:
    lo: float
    fs: list[float] = field(default_factory=list)
    tried: dict[Strategy, float] = field(default_factory=dict)  # normalised mean time


class OnlineSearch:
    """Tutel Algorithm 2: GetStrategy(f) and OptimizeStrategy(f, s, t)."""

    def __init__(self, candidates: tuple[Strategy, ...] = CANDIDATES, bucket_len: float = 0.5):
        if not candidates:
            raise ConfigError("tutel search: no candidate strategies")
        if not bucket_len > 0:
            raise ConfigError(f"tutel search: bucket length must be > 0, got {bucket_len}")
        self.candidates = tuple(candidates)
        self.bucket_len = bucket_len
        self.by_f: dict[float, dict[Strategy, float]] = {}
        self.buckets: list[_Bucket] = []

    def get(self, f: float) -> Strategy:
        if f not in self.by_f:
            self.by_f[f] = {}
            self._recompute()
        own = self.by_f[f]
        if len(own) == len(self.candidates):
            return min(self.candidates, key=lambda s: own[s])
        b = self.bucket(f)
        if len(b.tried) == len(self.candidates):
            return min(self.candidates, key=lambda s: b.tried[s])
        return next(s for s in self.candidates if s not in b.tried)

    def optimize(self, f: float, s: Strategy, t: float) -> None:
        self.by_f.setdefault(f, {})[s] = t
        self._recompute()

    def bucket(self, f: float) -> _Bucket:
        return next(b for b in self.buckets if f in b.fs)

    def _recompute(self) -> None:
        """Greedy buckets over the sorted known fs: a bucket spans at most bucket_len."""
        self.buckets = []
        for f in sorted(self.by_f):
            if not self.buckets or f - self.buckets[-1].lo > self.bucket_len:
                self.buckets.append(_Bucket(lo=f))
            self.buckets[-1].fs.append(f)
        for b in self.buckets:
            sums: dict[Strategy, list[float]] = {}
            for f in b.fs:
                for s, t in self.by_f[f].items():
                    sums.setdefault(s, []).append(t * b.lo / f)
            b.tried = {s: sum(v) / len(v) for s, v in sums.items()}
