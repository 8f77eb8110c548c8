"""The active bundles as columns over *slots*, with their link incidences indexed both ways.

A bundle keeps its slot from start to finish (finished ones are marked dead and compacted
away in bulk), so one event costs what it touches, not what is active: the incidences of a
slot are a CSR row (bundle -> links), and the incidences of a link another (link -> bundles,
built lazily, only when a local re-solve needs it).

Two sets of incidences are kept: every link a bundle crosses (`all_*`), and the *binding*
ones the solver sees (`inc_*`), without links that carry exactly the same flows as another
of no larger capacity (`sim.hardware.network.redundant`): a GPU's PCIe and NIC links in
series carry the same flows, and only the narrowest can limit them.
"""

from __future__ import annotations

import numpy as np

from sim.hardware.network.bundles import BundleBatch
from sim.hardware.network.maxmin import distinct, ranges

# per-slot columns, with the value a new slot gets (NaN: set from the batch)
_COLUMNS = {
    "count": np.nan,  # flows in the bundle
    "owner": -1,  # who to tell when it finishes
    "alive": True,
    "base": 0.0,  # max-min rate per flow
    "froze": -1,  # a bottleneck link of the bundle (global id; -1 before the first solve)
    "rate": 0.0,  # base x rate scale (interference): the speed bytes move at
    "rem": np.nan,  # bytes per flow still to send at time t0
    "t0": np.nan,
    "fin": np.inf,  # t0 + rem / rate: when it finishes at its current rate
    "key": 0,  # pseudo-random 64-bit tag: links' flow sets are compared by sums of these
}
_DTYPES = {"owner": np.int64, "froze": np.int64, "alive": bool, "key": np.uint64}


def _tags(first: int, k: int) -> np.ndarray:
    """The tags of bundles `first` .. `first + k - 1` in the order a table takes them:
    SplitMix64 of the serial number, a bijection whose outputs are as well mixed as random
    draws (numpy.random would serve too, but importing it is ~8 ms of a small run's CPU)."""
    z = (np.arange(first, first + k, dtype=np.uint64) + np.uint64(1)) * np.uint64(
        0x9E3779B97F4A7C15
    )
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _grouping(owner: np.ndarray) -> slice | np.ndarray:
    """Order that groups entries by owner, keeping their order within an owner: the identity
    (no copy) when they already come grouped, as most layouts build them."""
    if len(owner) < 2 or bool((owner[1:] >= owner[:-1]).all()):
        return slice(None)
    return np.argsort(owner, kind="stable")


def _append(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([a, b]) if len(a) else b


class FlowTable:
    """Columns per slot; incidences (slot, link, multiplicity) grouped by slot; ranks per slot."""

    # the _COLUMNS, one entry per slot
    count: np.ndarray
    owner: np.ndarray
    alive: np.ndarray
    base: np.ndarray
    froze: np.ndarray
    rate: np.ndarray
    rem: np.ndarray
    t0: np.ndarray
    fin: np.ndarray
    key: np.ndarray
    # the solver's incidences (links where `binding` is set) and their CSR row pointers: the
    # all_* arrays themselves while every link binds (set by `rebind`)
    binding: np.ndarray
    inc_s: np.ndarray
    inc_l: np.ndarray
    inc_m: np.ndarray
    b_ptr: np.ndarray

    def __init__(self, num_links: int) -> None:
        self.num_links = num_links
        self.n = 0
        self.n_alive = 0
        for name in _COLUMNS:
            setattr(self, name, np.zeros(0, dtype=_DTYPES.get(name, float)))
        self.all_s = np.zeros(0, dtype=np.int64)
        self.all_l = np.zeros(0, dtype=np.int64)
        self.all_m = np.zeros(0)
        self.all_ptr = np.zeros(1, dtype=np.int64)
        self.rebind(np.ones(num_links, dtype=bool))
        self._tagged = 0  # bundles tagged so far (`_tags`)
        self.rank_r = np.zeros(0, dtype=np.int64)
        self.r_ptr = np.zeros(1, dtype=np.int64)
        self._l_ptr: np.ndarray | None = None  # link -> incidence positions (CSR)
        self._l_pos = np.zeros(0, dtype=np.int64)

    # -- growth and shrinkage ------------------------------------------------------------------
    def append(self, batch: BundleBatch, owner: int, now: float) -> np.ndarray:
        """New slots for `batch`; returns their indices."""
        k = len(batch)
        slots = np.arange(self.n, self.n + k)
        key = _tags(self._tagged, k)
        self._tagged += k
        given = {"count": batch.count, "owner": owner, "rem": batch.nbytes, "t0": now, "key": key}
        for name, default in _COLUMNS.items():
            col = np.full(k, given.get(name, default), dtype=_DTYPES.get(name, float))
            setattr(self, name, np.concatenate([getattr(self, name), col]))
        # stable sorts keep each bundle's own order of links and ranks
        o = _grouping(batch.inc_b)
        b, lk, m = batch.inc_b[o] + self.n, batch.inc_l[o], batch.inc_m[o].astype(float)
        per_slot = np.cumsum(np.bincount(batch.inc_b, minlength=k))
        shared = self.inc_s is self.all_s  # every incidence binds: one set of arrays serves
        self.all_s = _append(self.all_s, b)
        self.all_l = _append(self.all_l, lk)
        self.all_m = _append(self.all_m, m)
        self.all_ptr = _append(self.all_ptr, self.all_ptr[-1] + per_slot)
        bind = self.binding[lk]
        if shared and bind.all():
            self.inc_s, self.inc_l, self.inc_m = self.all_s, self.all_l, self.all_m
            self.b_ptr = self.all_ptr
        else:
            self.inc_s = _append(self.inc_s, b[bind])
            self.inc_l = _append(self.inc_l, lk[bind])
            self.inc_m = _append(self.inc_m, m[bind])
            per_slot = np.cumsum(np.bincount(b[bind] - self.n, minlength=k))
            self.b_ptr = _append(self.b_ptr, self.b_ptr[-1] + per_slot)
        o = _grouping(batch.rank_b)
        self.rank_r = np.concatenate([self.rank_r, batch.rank_r[o]])
        self.r_ptr = np.concatenate(
            [self.r_ptr, self.r_ptr[-1] + np.cumsum(np.bincount(batch.rank_b, minlength=k))]
        )
        self.n += k
        self.n_alive += k
        self._l_ptr = None
        return slots

    def rebind(self, binding: np.ndarray) -> None:
        """Keep, as the solver's incidences, those on links where `binding` is set."""
        self.binding = binding
        self._l_ptr = None
        keep = binding[self.all_l]
        if keep.all():
            self.inc_s, self.inc_l, self.inc_m = self.all_s, self.all_l, self.all_m
            self.b_ptr = self.all_ptr
            return
        self.inc_s, self.inc_l, self.inc_m = self.all_s[keep], self.all_l[keep], self.all_m[keep]
        per_slot = np.bincount(self.inc_s, minlength=len(self.all_ptr) - 1)
        self.b_ptr = np.concatenate([[0], np.cumsum(per_slot)])

    def kill(self, slots: np.ndarray) -> None:
        self.alive[slots] = False
        self.base[slots] = 0.0
        self.rate[slots] = 0.0
        self.fin[slots] = np.inf
        self.n_alive -= len(slots)

    def compact(self) -> None:
        """Drop dead slots (renumbering the rest, in order)."""
        keep = self.alive
        new_id = np.cumsum(keep) - 1
        ki = keep[self.all_s]
        kr = np.repeat(keep, np.diff(self.r_ptr))
        for name in _COLUMNS:
            setattr(self, name, getattr(self, name)[keep])
        self.all_s = new_id[self.all_s[ki]]
        self.all_l, self.all_m = self.all_l[ki], self.all_m[ki]
        self.all_ptr = np.concatenate([[0], np.cumsum(np.diff(self.all_ptr)[keep])])
        self.rank_r = self.rank_r[kr]
        self.r_ptr = np.concatenate([[0], np.cumsum(np.diff(self.r_ptr)[keep])])
        self.n = self.n_alive
        self.rebind(self.binding)

    # -- lookups -------------------------------------------------------------------------------
    def incidences(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(incidence positions of `slots`, which of `slots` each belongs to)."""
        return ranges(self.b_ptr, slots)

    def links_of(self, slots: np.ndarray) -> np.ndarray:
        return distinct(self.inc_l[self.incidences(slots)[0]])

    def on_links(self, links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(incidence positions on `links` that belong to live slots, which of `links` each
        is on), in slot order within a link."""
        if self._l_ptr is None:
            self._l_pos = np.argsort(self.inc_l, kind="stable")
            counts = np.bincount(self.inc_l, minlength=self.num_links)
            self._l_ptr = np.concatenate([[0], np.cumsum(counts)])
        at, seg = ranges(self._l_ptr, links)
        pos = self._l_pos[at]
        live = self.alive[self.inc_s[pos]]
        return pos[live], seg[live]

    def ranks_of(self, slots: np.ndarray) -> np.ndarray:
        ranks: np.ndarray = self.rank_r[ranges(self.r_ptr, slots)[0]]
        return ranks

    def view(self, slots: np.ndarray) -> BundleBatch:
        """`slots` as a BundleBatch (bundle i is slots[i]); what a rate scale reads."""
        pos, seg = ranges(self.all_ptr, slots)
        rpos, rseg = ranges(self.r_ptr, slots)
        return BundleBatch(
            self.count[slots],
            self.rem[slots],
            np.zeros(len(slots)),
            seg,
            self.all_l[pos],
            self.all_m[pos],
            rseg,
            self.rank_r[rpos],
        )
