"""FlowNetwork: the active bundles, their rates (recomputed at every flow start and end), and
the bytes every link has carried."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.hardware.network.bundles import BundleBatch
from sim.hardware.network.maxmin import max_min_rates
from sim.hardware.topology import Topology

# Bundles finishing within this relative window (of the current time) of the earliest finish
# complete together: symmetric flows then end in one event instead of thousands separated by
# rounding. `costs.finish_rtol` widens it to trade accuracy for speed where flow sizes differ
# (skewed all-to-allv): a flow may then end up to finish_rtol * now early.
FINISH_RTOL = 1e-9


def _concat(batches: list[BundleBatch]) -> BundleBatch:
    offs = np.cumsum([0] + [len(b) for b in batches[:-1]])
    return BundleBatch(
        np.concatenate([b.count for b in batches]),
        np.concatenate([b.nbytes for b in batches]),
        np.concatenate([b.latency for b in batches]),
        np.concatenate([b.inc_b + o for b, o in zip(batches, offs)]),
        np.concatenate([b.inc_l for b in batches]),
        np.concatenate([b.inc_m for b in batches]),
        np.concatenate([b.rank_b + o for b, o in zip(batches, offs)]),
        np.concatenate([b.rank_r for b in batches]),
    )


class FlowNetwork:
    """Active bundles, their rates, and the bytes every link has carried."""

    def __init__(
        self,
        topo: Topology,
        now: Callable[[], float],
        rate_scale: Callable[[BundleBatch, np.ndarray], np.ndarray] | None = None,
        finish_rtol: float = FINISH_RTOL,
    ):
        self.finish_rtol = finish_rtol
        self.topo = topo
        self.now = now
        self.cap = topo.link_cap
        self.carried = np.zeros(topo.num_links)
        self.rate_scale = rate_scale
        self.batches: list[BundleBatch] = []
        self.owners: list[np.ndarray] = []  # owner id per bundle, per batch
        self._merged: BundleBatch | None = None
        self._owner = np.zeros(0, dtype=np.int64)
        self.remaining = np.zeros(0)
        self.rate = np.zeros(0)
        self._inc_lc = np.zeros(0, dtype=np.int64)
        self._links = np.zeros(0, dtype=np.int64)
        self._last = 0.0
        self.recomputes = 0
        self.bundles_started = 0
        self.flows_started = 0

    @property
    def active(self) -> int:
        return len(self.remaining)

    def settle(self) -> None:
        t = self.now()
        dt = t - self._last
        if dt > 0 and self.active:
            m = self._merged
            assert m is not None
            self.remaining -= self.rate * dt
            usage = np.bincount(
                self._inc_lc, weights=m.inc_m * self.rate[m.inc_b], minlength=len(self._links)
            )
            self.carried[self._links] += usage * dt
        self._last = t

    def add(self, batch: BundleBatch, owner: int) -> None:
        """Start `batch` now (caller has already waited out its latency)."""
        self.settle()
        parts = [self._merged] if self._merged is not None and self.active else []
        self._merged = _concat(parts + [batch])
        self._owner = np.concatenate([self._owner, np.full(len(batch), owner)])
        self.remaining = np.concatenate([self.remaining, batch.nbytes.astype(float)])
        self.rate = np.concatenate([self.rate, np.zeros(len(batch))])
        self.bundles_started += len(batch)
        self.flows_started += int(batch.count.sum())
        self._relink()

    def _relink(self) -> None:
        m = self._merged
        if m is None or not self.active:
            self._links = np.zeros(0, dtype=np.int64)
            self._inc_lc = np.zeros(0, dtype=np.int64)
            return
        self._links, self._inc_lc = np.unique(m.inc_l, return_inverse=True)

    def recompute(self) -> None:
        self.settle()
        if not self.active:
            return
        m = self._merged
        assert m is not None
        self.recomputes += 1
        rate = max_min_rates(self.active, m.inc_b, self._inc_lc, m.inc_m, self.cap[self._links])
        if self.rate_scale is not None:
            rate = rate * self.rate_scale(m, self._owner)
        self.rate = rate

    def next_finish(self) -> float:
        if not self.active:
            return np.inf
        with np.errstate(divide="ignore"):
            dt = np.where(self.rate > 0, self.remaining / self.rate, np.inf)
        return self.now() + max(float(dt.min()), 0.0)

    def pop_finished(self) -> list[tuple[int, int, np.ndarray]]:
        """Remove bundles done by now; return (owner, bundles finished, their ranks) triples."""
        self.settle()
        if not self.active:
            return []
        with np.errstate(divide="ignore"):
            dt = np.where(self.rate > 0, self.remaining / self.rate, np.inf)
        tmin = float(dt.min())
        window = self.finish_rtol * max(self.now(), 1e-12) + 1e-15
        done = dt <= tmin + window
        if tmin > window:
            return []
        m = self._merged
        assert m is not None
        out = []
        owners = self._owner[done]
        rank_done = done[m.rank_b]
        for o in np.unique(owners):
            sel = rank_done & (self._owner[m.rank_b] == o)
            out.append((int(o), int((owners == o).sum()), m.rank_r[sel]))
        keep = ~done
        self._merged = m.select(keep)
        self._owner = self._owner[keep]
        self.remaining = self.remaining[keep]
        self.rate = self.rate[keep]
        self._relink()
        return out
