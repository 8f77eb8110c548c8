"""The network state the engine drives: active bundles, their rates, when the next one ends,
and the bytes every link has carried.

Rates are max-min fair (`sim.hardware.network.incremental`: re-solved above the lowest rate a
change involves, or else around the change, or from scratch when the change is a large share
of what is active), times the optional rate
scale (interference). Bytes are advanced lazily: a bundle's remaining bytes are brought up to
date only when its rate changes, and its finish time `t0 + rem / rate` is kept, so an event
costs what changed, not what is active.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.hardware.network.bundles import BundleBatch
from sim.hardware.network.incremental import MaxMinState
from sim.hardware.network.maxmin import distinct
from sim.hardware.network.redundant import representatives
from sim.hardware.network.table import FlowTable
from sim.hardware.network.timeline import ClassTimeline
from sim.hardware.topology import Topology

# Bundles finishing within this relative window (of the current time) of the earliest finish
# complete together: symmetric flows then end in one event instead of thousands separated by
# rounding. `costs.finish_rtol` widens it to trade accuracy for speed where flow sizes differ
# (skewed all-to-allv): a flow may then end up to finish_rtol * now early.
FINISH_RTOL = 1e-9
# Below this many active bundles a solve from scratch is cheaper than the bookkeeping of a
# local one (a few dozen numpy calls either way).
LOCAL_MIN_BUNDLES = 512
# Changes (bundles started or finished) above this share of the active bundles are solved
# from scratch: a local solve would touch most of them anyway.
LOCAL_MAX_SHARE = 0.25
# The solve above the floor (from the previous bottlenecks, checked) stays cheaper than the
# rounds or a filling from scratch up to about half the active bundles (benchmarks/
# skewed_scale.py at 128-256 GPUs: 0.25 -> 0.5 cut its CPU time by ~15-25%).
ABOVE_MAX_SHARE = 0.5


class FlowNetwork:
    """Active bundles, their rates, and the bytes every link has carried."""

    def __init__(
        self,
        topo: Topology,
        now: Callable[[], float],
        rate_scale: Callable[[BundleBatch, np.ndarray], np.ndarray] | None = None,
        finish_rtol: float = FINISH_RTOL,
        local_min: int = LOCAL_MIN_BUNDLES,
        local_max_share: float = LOCAL_MAX_SHARE,
    ):
        self.finish_rtol = finish_rtol
        self.topo = topo
        self.now = now
        self.cap = topo.link_cap
        self.carried = np.zeros(topo.num_links)
        # bytes/s per link under a rate scale
        self._scaled_usage: np.ndarray = np.zeros(topo.num_links)
        self.rate_scale = rate_scale
        self.local_min = local_min  # below: always from scratch (tests set 0 to force local)
        self.local_max_share = local_max_share
        self.table = FlowTable(topo.num_links)
        self.rep = np.arange(topo.num_links)  # the link whose load each link's load is
        self.solver = MaxMinState(self.cap)
        self._added: list[np.ndarray] = []  # slots started since the last solve
        self._touched: list[np.ndarray] = []  # links of bundles finished since then
        self._finished = 0
        self._floor = np.inf  # lowest rate of a bundle finished since the last solve
        self._last = 0.0
        self._fmin: float | None = None  # earliest finish, from next_finish until it changes
        self.recomputes = 0
        self.local_solves = 0
        self.bundles_started = 0
        self.flows_started = 0
        self.timeline: ClassTimeline | None = None  # utilisation per link class, on request

    def record(self, weight: np.ndarray | None = None) -> ClassTimeline:
        """Sample the utilisation of every link class after each solve from now on (for a
        trace's counter tracks); `weight`: links of the cluster each link stands for."""
        self.timeline = ClassTimeline(self.topo.link_class_names, self.cap, weight)
        return self.timeline

    @property
    def active(self) -> int:
        return self.table.n_alive

    @property
    def usage(self) -> np.ndarray:
        """Bytes/s on each link at the current rates."""
        per_rep = self.solver.used if self.rate_scale is None else self._scaled_usage
        return per_rep[self.rep]

    def settle(self) -> None:
        """Account the bytes links carried since the last call."""
        t = self.now()
        dt = t - self._last
        if dt > 0 and self.active:
            self.carried += self.usage * dt
        self._last = t

    def add(self, batch: BundleBatch, owner: int) -> None:
        """Start `batch` now (caller has already waited out its latency)."""
        self.settle()
        self._added.append(self.table.append(batch, owner, self.now()))
        self.bundles_started += len(batch)
        self.flows_started += int(batch.count.sum())

    def recompute(self) -> None:
        """Bring rates up to date with the bundles started and finished since the last call
        (and with the rate scale, which may have changed without them)."""
        self.settle()
        t = self.table
        added = np.concatenate(self._added) if self._added else np.zeros(0, dtype=np.int64)
        none = np.zeros(0, dtype=np.int64)
        touched = np.concatenate(self._touched) if self._touched else none
        finished, floor = self._finished, self._floor
        self._added, self._touched, self._finished, self._floor = [], [], 0, np.inf
        if not self.active:
            self._scaled_usage[:] = 0.0
            self.solver.reset()
            self._maybe_compact()
            if self.timeline is not None:
                self.timeline.sample(self.now(), self.usage)
            return
        self.recomputes += 1
        moved = none
        if len(added):
            self._regroup()
        if len(added) or finished:
            big = len(added) + finished > self.local_max_share * self.active
            if self.active < self.local_min or big:
                moved = self.solver.solve_all(t)
            else:
                self.local_solves += 1
                # links of finished bundles may have joined a series group since
                touched = distinct(np.concatenate([self.rep[touched], t.links_of(added)]))
                if len(added):
                    floor = min(floor, self._share_bound(added))
                got = self.solver.solve_above(
                    t, floor, added, touched, ABOVE_MAX_SHARE * self.active
                )
                moved = got if got is not None else self.solver.solve_local(t, added, touched)
        if self.rate_scale is not None:
            live = np.flatnonzero(t.alive)
            rate = t.base[live] * self.rate_scale(t.view(live), t.owner[live])
            diff = rate != t.rate[live]
            self._set_rate(live[diff], rate[diff])
            w = t.inc_m * t.rate[t.inc_s]
            self._scaled_usage = np.bincount(t.inc_l, weights=w, minlength=len(self.cap))
        else:  # rate == base: the link loads are the solver's
            self._set_rate(moved, t.base[moved])
        self._maybe_compact()
        if self.timeline is not None:
            self.timeline.sample(self.now(), self.usage)

    def next_finish(self) -> float:
        if not self.active:
            return np.inf
        now = self.now()
        self._fmin = float(self.table.fin.min())  # pop_finished reuses it: one pass fewer
        return now + max(self._fmin - now, 0.0)

    def pop_finished(self) -> list[tuple[int, int, np.ndarray]]:
        """Remove bundles done by now; return (owner, bundles finished, their ranks) triples."""
        self.settle()
        if not self.active:
            return []
        t = self.table
        now = self.now()
        fmin = float(t.fin.min()) if self._fmin is None else self._fmin
        self._fmin = None
        # min(fin - now) is fmin - now: rounding is monotone
        tmin = fmin - now
        window = self.finish_rtol * max(now, 1e-12) + 1e-15
        if tmin > window:
            return []
        # a cheap superset of `fin - now <= tmin + window` (rounding of the subtraction
        # allowed for), the exact test on it alone
        slack = 4 * np.finfo(float).eps * (abs(now) + abs(fmin)) + 2 * window
        done = np.flatnonzero(t.fin <= fmin + slack)
        done = done[t.fin[done] - now <= tmin + window]
        owners = t.owner[done]
        out = []
        for o in distinct(owners):
            mine = done[owners == o]
            out.append((int(o), len(mine), t.ranks_of(mine)))
        self._touched.append(t.inc_l[t.incidences(done)[0]])
        self._finished += len(done)
        self._floor = min(self._floor, float(t.base[done].min()))
        t.kill(done)
        return out

    # -- internals -----------------------------------------------------------------------------
    def _regroup(self) -> None:
        """Links in series, formed again now that new flows may have split them."""
        t = self.table
        rep = representatives(t, self.cap)
        binding = rep == np.arange(len(rep))
        self.rep = rep
        if np.array_equal(binding, t.binding):
            return
        t.rebind(binding)
        solved = t.froze >= 0
        t.froze[solved] = rep[t.froze[solved]]
        self.solver.refresh_all(t)

    def _share_bound(self, added: np.ndarray) -> float:
        """A rate no added bundle falls below: on every link, the equal share of its capacity
        among the flows crossing it is the lowest level it can saturate at."""
        t = self.table
        links = t.links_of(added)
        pos, seg = t.on_links(links)
        flows = np.bincount(seg, weights=t.inc_m[pos], minlength=len(links))
        return float((self.cap[links] / flows).min())

    def _set_rate(self, slots: np.ndarray, rate: np.ndarray) -> None:
        """New rates from now on: bytes sent so far at the old rate are accounted first."""
        if not len(slots):
            return
        self._fmin = None
        t = self.table
        now = self.now()
        t.rem[slots] -= t.rate[slots] * (now - t.t0[slots])
        t.t0[slots] = now
        t.rate[slots] = rate
        with np.errstate(divide="ignore"):
            t.fin[slots] = np.where(rate > 0, now + t.rem[slots] / rate, np.inf)

    def _maybe_compact(self) -> None:
        t = self.table
        if t.n - t.n_alive > max(t.n_alive, 1024):
            t.compact()
