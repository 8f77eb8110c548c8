"""Max-min rates kept up to date as bundles come and go, re-solving only around the change.

A max-min fair allocation is the one where every flow has a *bottleneck*: a saturated link on
its route where no flow gets more (`maxmin.bottleneck_ok`). Each bundle remembers one such
link (`FlowTable.froze`). When bundles start or finish, only bundles whose remembered
bottleneck was touched can have lost it; those that did (and the new ones) become the
*variable* set V, and progressive filling runs on V alone, every other bundle holding its rate
(its load is subtracted from the links' capacities). Then the allocation is checked where it
changed: a bundle of V without a bottleneck is held back by a fixed bundle with a larger rate
on its saturated link, which joins V; a fixed bundle whose bottleneck link got worse (less
loaded, or a larger rate on it) and has no other joins V; repeat until every check passes.
Every bundle then has a bottleneck, so the rates are *the* max-min allocation (it is unique),
equal to a solve from scratch; V grows every round, and past a quarter of the active bundles
a solve from scratch is cheaper and is what runs.

Connected components come for free: a change never reaches bundles that share no saturated
link with it. This goes further where components do not help, as in one all-to-allv (every
flow shares a NIC with every other): in benchmarks/skewed_scale.py a finishing flow moves a
median of 19 / 71 / 307 rates at 64 / 128 / 256 GPUs, of 3k / 12k / 50k active; but the
changes cascade (a rate that rises on one NIC takes from the others on the far NIC, ...), so
the rounds are a few and the mean is larger (60 / 360 / 1,600).

Most changes take a shorter way, `solve_above`, with no rounds and no checks. Progressive
filling raises every unfrozen rate together; up to the level of a bundle's rate, a process
without that bundle freezes the same links at the same levels (the bundle only adds load to
its own links, and none of them saturates before it freezes). So when bundles finish, every
rate below the lowest of theirs (the *floor*) stays, and when bundles start, every rate below
the lowest of the new ones does, which is at least the equal share of the narrowest of their
links (no link saturates below capacity / flows crossing it). Progressive filling over the
bundles at or above the floor alone, on the capacity the others leave, is then the solve from
scratch. Finishing bundles are mostly fast ones (they finish first), so the floor is high: in
benchmarks/skewed_scale.py the bundles above it are ~5% of the active ones at 64-128 GPUs.
That filling starts from the bottleneck each bundle had (`sim.hardware.network.assigned`:
a linear system, checked to be max-min fair), and fills by local minima only when that guess
does not settle.
"""

from __future__ import annotations

import numpy as np

from sim.hardware.network.assigned import solve_assigned
from sim.hardware.network.maxmin import (
    BOTTLENECK_RTOL,
    bottleneck_ok,
    distinct,
    filling_by_local_minima,
    progressive_filling,
    relabel,
)
from sim.hardware.network.table import FlowTable

# Rounds of "solve V, check, grow V" before giving up on locality (never reached in practice:
# V grows every round and a large V switches to the solve from scratch).
MAX_ROUNDS = 64
# Bundles this close below the floor join the solve too: rates the same up to rounding (all
# the bundles a link froze, set by different solves) must move together.
FLOOR_RTOL = 1e-9
# A re-solved rate this close to the old one is the old one: keeps rounding noise from
# spreading a change that did not happen.
SAME_RTOL = 1e-13


class MaxMinState:
    """Per-link load and largest rate of the current allocation, and the solvers."""

    def __init__(self, cap: np.ndarray) -> None:
        self.cap = cap
        # sum of multiplicity x base rate over live bundles
        self.used: np.ndarray = np.zeros(len(cap))
        self.top = np.zeros(len(cap))  # largest base rate of a live bundle on the link
        self.assigned = 0  # solves above the floor settled from the previous bottlenecks
        self.filled = 0  # ... and those that fell back to filling

    def reset(self) -> None:
        self.used[:] = 0.0
        self.top[:] = 0.0

    def refresh_all(self, t: FlowTable) -> None:
        base = t.base[t.inc_s]  # dead slots have base 0: they add nothing
        self.used = np.bincount(t.inc_l, weights=t.inc_m * base, minlength=len(self.cap))
        self.top = np.zeros(len(self.cap))
        np.maximum.at(self.top, t.inc_l, base)

    def refresh(self, t: FlowTable, links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Recompute load and top rate of `links`; returns their live (slots, link index)."""
        pos, seg = t.on_links(links)
        slots = t.inc_s[pos]
        base = t.base[slots]
        self.used[links] = np.bincount(seg, weights=t.inc_m[pos] * base, minlength=len(links))
        top = np.zeros(len(links))
        np.maximum.at(top, seg, base)
        self.top[links] = top
        return slots, seg

    # -- from scratch --------------------------------------------------------------------------
    def solve_all(self, t: FlowTable) -> np.ndarray:
        """Progressive filling over every live bundle; returns the slots whose rate moved."""
        live = np.flatnonzero(t.alive)
        keep = t.alive[t.inc_s]
        links, il = relabel(t.inc_l[keep], len(self.cap))
        local = np.full(t.n, -1, dtype=np.int64)
        local[live] = np.arange(len(live))
        rate, froze = progressive_filling(
            len(live), local[t.inc_s[keep]], il, t.inc_m[keep], self.cap[links]
        )
        moved: np.ndarray = live[rate != t.base[live]]
        t.base[live] = rate
        t.froze[live] = np.where(froze >= 0, links[froze], -1)
        self.refresh_all(t)
        return moved

    # -- above the lowest changed rate ---------------------------------------------------------
    def solve_above(
        self, t: FlowTable, floor: float, added: np.ndarray, touched: np.ndarray, limit: float
    ) -> np.ndarray | None:
        """Rates after `added` slots started and bundles on `touched` links finished, when no
        finished or added bundle's rate is below `floor` (the module docstring says why the
        rates below it then stay): progressive filling over the live bundles at or above it,
        the others' load held. Returns the slots whose rate moved, or None (nothing done)
        when more than `limit` bundles would take part."""
        # dead slots have base 0 and added ones have not been solved (base 0): one pass over
        # the slots, the added ones joined after
        thr = floor * (1 - FLOOR_RTOL)
        var = np.flatnonzero(t.base >= thr if thr > 0 else t.alive)
        if len(added):
            var = distinct(np.concatenate([var, added]))
        if len(var) > limit:
            return None
        self.refresh(t, touched)
        pos, owner = t.incidences(var)
        links, il = relabel(t.inc_l[pos], len(self.cap))
        m = t.inc_m[pos]
        old = t.base[var]
        mine = np.bincount(il, weights=m * old[owner], minlength=len(links))
        spare = np.maximum(self.cap[links] - (self.used[links] - mine), 0.0)
        rate, froze = self._fill(t, var, owner, il, m, spare, links, old)
        t.froze[var] = np.where(froze >= 0, links[froze], -1)
        ch = np.abs(rate - old) > SAME_RTOL * np.maximum(rate, old)
        rate = np.where(ch, rate, old)
        t.base[var] = rate
        self.used[links] += np.bincount(il, weights=m * rate[owner], minlength=len(links)) - mine
        # the largest rate on these links is one of var's: the others are below the floor
        top = np.zeros(len(links))
        np.maximum.at(top, il, rate[owner])
        self.top[links] = top
        out: np.ndarray = var[ch]
        return out

    def _fill(
        self,
        t: FlowTable,
        var: np.ndarray,
        owner: np.ndarray,
        il: np.ndarray,
        m: np.ndarray,
        spare: np.ndarray,
        links: np.ndarray,
        old: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Max-min over `var` on `spare`: from the bottlenecks the bundles had (most keep
        theirs), checked, or else by filling (`sim.hardware.network.assigned` says why)."""
        local = np.full(len(self.cap) + 1, -1, dtype=np.int64)  # [-1]: no bottleneck yet
        local[links] = np.arange(len(links))
        guess = local[t.froze[var]]
        known = guess >= 0
        warm = np.full(len(links), np.inf)
        warm[guess[known]] = old[known]
        got = solve_assigned(len(var), owner, il, m, spare, guess, warm)
        if got is not None:
            self.assigned += 1
            return got
        self.filled += 1
        return filling_by_local_minima(len(var), owner, il, m, spare)

    # -- around a change -----------------------------------------------------------------------
    def solve_local(self, t: FlowTable, added: np.ndarray, touched: np.ndarray) -> np.ndarray:
        """Rates after `added` slots started and bundles on `touched` links finished (they are
        already dead); `touched` includes the links of `added`. Returns the slots whose rate
        moved."""
        slots, seg = self.refresh(t, touched)
        var = distinct(np.concatenate([added, self._lost(t, touched, slots, seg)]))
        if not len(var):  # every bundle kept a bottleneck: nothing moves
            return var
        in_var = np.zeros(t.n, dtype=bool)
        in_var[var] = True
        moved: list[np.ndarray] = []
        for _ in range(MAX_ROUNDS):
            if 4 * len(var) > t.n_alive:
                break
            pos, owner, old = self._solve_var(t, var)
            ch = t.base[var] != old
            moved.append(var[ch])
            worse = self._account(t, pos[ch[owner]], old[owner[ch[owner]]])
            wpos, wseg = t.on_links(worse)
            fixed = self._lost(t, worse, t.inc_s[wpos], wseg, in_var)
            stuck = self._check(t, var, pos, owner)
            grow = distinct(np.concatenate([fixed, self._blockers(t, stuck, in_var)]))
            if not len(grow):
                if len(stuck):
                    break  # held back by nothing we can find: rounding; solve from scratch
                return distinct(np.concatenate(moved))
            var = np.concatenate([var, grow])
            in_var[grow] = True
        return distinct(np.concatenate(moved + [self.solve_all(t)]))

    def _account(self, t: FlowTable, pos: np.ndarray, old: np.ndarray) -> np.ndarray:
        """Link loads and top rates after the bundles of incidences `pos` moved from rates
        `old` (per incidence); returns the links that got worse for the bundles relying on
        them: less loaded, or a larger rate on them."""
        lk, m, new = t.inc_l[pos], t.inc_m[pos], t.base[t.inc_s[pos]]
        links, il = relabel(lk, len(self.cap))
        delta = np.bincount(il, weights=m * (new - old), minlength=len(links))
        self.used[links] += delta
        top = self.top[links]
        rise = np.zeros(len(links))
        np.maximum.at(rise, il, new)
        # a rate that was the top and fell: the top may have fallen (look again)
        fell = np.zeros(len(links), dtype=bool)
        fell[il[(new < old) & (old >= top[il] * (1 - BOTTLENECK_RTOL))]] = True
        self.top[links] = np.maximum(top, rise)
        if fell.any():
            lf = links[fell]
            fpos, fseg = t.on_links(lf)
            again = np.zeros(len(lf))
            np.maximum.at(again, fseg, t.base[t.inc_s[fpos]])
            self.top[lf] = again
        out: np.ndarray = links[
            (delta < -self.cap[links] * BOTTLENECK_RTOL) | (rise > top * (1 + BOTTLENECK_RTOL))
        ]
        return out

    def _solve_var(self, t: FlowTable, var: np.ndarray) -> tuple[np.ndarray, ...]:
        """Progressive filling over `var`, every other bundle's load held. Returns the
        incidence positions of `var`, which of `var` each belongs to, and their rates before
        (a rate within SAME_RTOL of the old one keeps the old one)."""
        pos, owner = t.incidences(var)
        links, il = relabel(t.inc_l[pos], len(self.cap))
        m = t.inc_m[pos]
        old = t.base[var]
        mine = np.bincount(il, weights=m * old[owner], minlength=len(links))
        spare = np.maximum(self.cap[links] - (self.used[links] - mine), 0.0)
        rate, froze = filling_by_local_minima(len(var), owner, il, m, spare)
        t.froze[var] = np.where(froze >= 0, links[froze], -1)
        ch = np.abs(rate - old) > SAME_RTOL * np.maximum(rate, old)
        t.base[var[ch]] = rate[ch]
        return pos, owner, old

    def _check(
        self,
        t: FlowTable,
        slots: np.ndarray,
        pos: np.ndarray | None = None,
        owner: np.ndarray | None = None,
    ) -> np.ndarray:
        """Slots among `slots` without a bottleneck; the others get theirs recorded.
        `pos`, `owner`: their incidences, when the caller has them."""
        if pos is None or owner is None:
            pos, owner = t.incidences(slots)
        lk = t.inc_l[pos]
        ok = bottleneck_ok(t.base[slots][owner], self.used[lk], self.cap[lk], self.top[lk])
        has = np.zeros(len(slots), dtype=bool)
        has[owner[ok]] = True
        order = np.argsort(lk[ok], kind="stable")  # the highest bottleneck of each is recorded
        t.froze[slots[owner[ok]][order]] = lk[ok][order]
        return slots[~has]

    def _lost(
        self,
        t: FlowTable,
        links: np.ndarray,
        slots: np.ndarray,
        seg: np.ndarray,
        skip: np.ndarray | None = None,
    ) -> np.ndarray:
        """Of the live `slots` on `links` (`seg`: which link), those whose recorded bottleneck
        is that link (except `skip`) and that have no bottleneck any more."""
        cand = slots[t.froze[slots] == links[seg]]
        if skip is not None:
            cand = cand[~skip[cand]]
        return self._check(t, distinct(cand))

    def _blockers(self, t: FlowTable, stuck: np.ndarray, in_var: np.ndarray) -> np.ndarray:
        """Fixed slots with a larger rate than a stuck slot on one of its saturated links."""
        if not len(stuck):
            return stuck
        pos, owner = t.incidences(stuck)
        lk = t.inc_l[pos]
        sat = self.used[lk] >= self.cap[lk] * (1 - BOTTLENECK_RTOL)
        lk, rate = lk[sat], t.base[stuck][owner[sat]]
        floor = np.full(len(self.cap), np.inf)
        np.minimum.at(floor, lk, rate)
        links = distinct(lk)
        pos, seg = t.on_links(links)
        s = t.inc_s[pos]
        hit = (t.base[s] > floor[links][seg] * (1 + BOTTLENECK_RTOL)) & ~in_var[s]
        return distinct(s[hit])
