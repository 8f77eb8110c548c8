"""Flows on links: max-min fair bandwidth sharing, recomputed when a flow starts or ends.

The unit the solver moves is a *bundle*: `count` flows that are known to get the same rate,
each with `remaining` bytes to send, crossing link instances with multiplicities (how many of
the bundle's flows cross that link). Per-flow fidelity makes every flow its own bundle; the
bundled fidelity groups the flows of a collective that are equivalent under permutations of
nodes (same source-local GPU, destination-local GPU, same/other node), which is exact on a
single-switch fabric with identical nodes and turns the 4 M flows of a 2,048-GPU all-to-all
into ~128 bundles. The water-filling below is the same for both, so they agree wherever
bundling applies (tests check it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.hardware.topology import Topology

# Bundles finishing within this relative window (of the current time) of the earliest finish
# complete together: symmetric flows then end in one event instead of thousands separated by
# rounding. `costs.finish_rtol` widens it to trade accuracy for speed where flow sizes differ
# (skewed all-to-allv): a flow may then end up to finish_rtol * now early.
FINISH_RTOL = 1e-9


@dataclass
class BundleBatch:
    """Bundles to add at one instant; incidence and ranks are COO arrays over bundle index."""

    count: np.ndarray  # flows per bundle
    nbytes: np.ndarray  # bytes per flow
    latency: np.ndarray  # seconds before data moves (alpha + path latency)
    inc_b: np.ndarray  # incidence: bundle index
    inc_l: np.ndarray  # incidence: global link id
    inc_m: np.ndarray  # incidence: flows of the bundle crossing the link
    rank_b: np.ndarray  # ranks a bundle involves: bundle index
    rank_r: np.ndarray  # ranks a bundle involves: rank

    def __len__(self) -> int:
        return len(self.count)

    def select(self, mask: np.ndarray) -> BundleBatch:
        idx = np.flatnonzero(mask)
        remap = np.full(len(self.count), -1, dtype=np.int64)
        remap[idx] = np.arange(len(idx))
        ki = mask[self.inc_b]
        kr = mask[self.rank_b]
        return BundleBatch(
            self.count[idx],
            self.nbytes[idx],
            self.latency[idx],
            remap[self.inc_b[ki]],
            self.inc_l[ki],
            self.inc_m[ki],
            remap[self.rank_b[kr]],
            self.rank_r[kr],
        )


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


# -- building bundles from flows ------------------------------------------------------------
def _route_cost(topo: Topology, local: list[int], trunk: bool, alpha: float) -> tuple[float, float]:
    """(latency before data moves, per-message overhead in bytes) of a route.

    A message occupies its route for the largest per-message cost of the link classes it
    crosses (the NIC's message rate, usually); that time is charged as bytes at the route's
    bottleneck rate, so a thousand tiny messages through one NIC cost a thousand times it.
    """
    loc = np.asarray(local, dtype=np.int64) % topo.links_per_node
    lat = float(topo.local_lat[loc].sum())
    msg = float(topo.local_msg[loc].max()) if len(loc) else 0.0
    bw = float(topo.local_cap[loc].min()) if len(loc) else np.inf
    if trunk and topo.trunk_class is not None:
        tc = topo.trunk_class
        lat += 2 * tc.latency
        msg = max(msg, tc.msg_cost)
        bw = min(bw, tc.eff_bw)
    return alpha + lat, (msg * bw if np.isfinite(bw) else 0.0)


class _Acc:
    """Accumulates bundles: counts, bytes, latency and COO incidence / rank lists."""

    def __init__(self) -> None:
        self.count: list[np.ndarray] = []
        self.nbytes: list[np.ndarray] = []
        self.lat: list[np.ndarray] = []
        self.inc: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.ranks: list[tuple[np.ndarray, np.ndarray]] = []
        self.n = 0

    def add(
        self,
        count,
        nbytes,
        lat,
        links: list[tuple[np.ndarray, np.ndarray]],
        ranks: np.ndarray,
        rank_b: np.ndarray | None = None,
    ) -> None:
        """`links`: per bundle-local row, (link ids [k, p], mult [k, p]) blocks; k bundles."""
        count = np.atleast_1d(np.asarray(count, dtype=float))
        k = len(count)
        ids = np.arange(self.n, self.n + k)
        self.count.append(count)
        self.nbytes.append(np.broadcast_to(np.asarray(nbytes, dtype=float), (k,)).copy())
        self.lat.append(np.broadcast_to(np.asarray(lat, dtype=float), (k,)).copy())
        for lk, mult in links:
            lk = np.asarray(lk, dtype=np.int64).reshape(k, -1)
            mult = np.asarray(mult, dtype=float)
            mult = np.broadcast_to(mult if mult.ndim == 0 else mult.reshape(k, -1), lk.shape)
            self.inc.append((np.repeat(ids, lk.shape[1]), lk.ravel(), mult.ravel()))
        if rank_b is None:
            ranks = np.asarray(ranks, dtype=np.int64).reshape(k, -1)
            self.ranks.append((np.repeat(ids, ranks.shape[1]), ranks.ravel()))
        else:
            self.ranks.append((ids[rank_b], np.asarray(ranks, dtype=np.int64)))
        self.n += k

    def batch(self) -> BundleBatch:
        if self.n == 0:
            z, zi = np.zeros(0), np.zeros(0, dtype=np.int64)
            return BundleBatch(z, z, z, zi, zi, z, zi, zi)
        cat = np.concatenate
        return BundleBatch(
            cat(self.count),
            cat(self.nbytes),
            cat(self.lat),
            cat([i[0] for i in self.inc]),
            cat([i[1] for i in self.inc]),
            cat([i[2] for i in self.inc]),
            cat([r[0] for r in self.ranks]),
            cat([r[1] for r in self.ranks]),
        )


def per_flow(
    topo: Topology,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    alpha: float,
    relay: bool = False,
) -> BundleBatch:
    """Every flow its own bundle. Self-sends and empty messages move nothing and are dropped."""
    keep = (src != dst) & (nbytes > 0)
    src, dst = src[keep].astype(np.int64), dst[keep].astype(np.int64)
    nbytes = nbytes[keep].astype(float)
    G, L = topo.gpus_per_node, topo.links_per_node
    na, la = np.divmod(src, G)
    nb, lb = np.divmod(dst, G)
    same = na == nb
    key = same * (G * G) + la * G + lb
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    acc = _Acc()
    for grp in np.split(order, bounds) if len(order) else []:
        a, b = int(la[grp[0]]), int(lb[grp[0]])
        if same[grp[0]]:
            loc = np.asarray(topo.intra[a][b], dtype=np.int64)
            lat, over = _route_cost(topo, topo.intra[a][b], False, alpha)
            links = na[grp, None] * L + loc[None, :]
            acc.add(
                np.ones(len(grp)),
                nbytes[grp] + over,
                lat,
                [(links, 1.0)],
                np.stack([src[grp], dst[grp]], axis=1),
            )
            continue
        sp, ia = topo.src_part(a, b, relay)
        dp, ib = topo.dst_part(b)
        f = topo.fabric
        assert f is not None
        ls, ld = f.leaf(na[grp], ia), f.leaf(nb[grp], ib)
        cross = ls != ld
        spa, dpa = np.asarray(sp, dtype=np.int64), np.asarray(dp, dtype=np.int64)
        for trunk in (False, True):
            sel = cross == trunk
            if not sel.any():
                continue
            g = grp[sel]
            lat, over = _route_cost(topo, sp + dp, trunk, alpha)
            links = [
                np.concatenate(
                    [na[g, None] * L + spa[None, :], nb[g, None] * L + dpa[None, :]], axis=1
                )
            ]
            if trunk:
                links.append(np.stack([topo.trunk_up(ls[sel]), topo.trunk_down(ld[sel])], axis=1))
            acc.add(
                np.ones(len(g)),
                nbytes[g] + over,
                lat,
                [(lk, 1.0) for lk in links],
                np.stack([src[g], dst[g]], axis=1),
            )
    return acc.batch()


def product_layout(topo: Topology, members: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(nodes, local indices) if `members` is exactly nodes x locals, else None."""
    G = topo.gpus_per_node
    nodes = np.unique(members // G)
    locs = np.unique(members % G)
    if len(nodes) * len(locs) != len(members):
        return None
    expect = (nodes[:, None] * G + locs[None, :]).ravel()
    if not np.array_equal(np.sort(members), expect):
        return None
    return nodes, locs


def pair_mask(topo: Topology, src: np.ndarray, dst: np.ndarray, pairs: str) -> np.ndarray:
    """Which (src, dst) pairs a uniform exchange covers: all, same node, or same local index."""
    G = topo.gpus_per_node
    if pairs == "all":
        return src != dst
    if pairs == "intra":
        return (src // G == dst // G) & (src != dst)
    return (src % G == dst % G) & (src != dst)


def bundled_uniform(
    topo: Topology,
    nodes: np.ndarray,
    locs: np.ndarray,
    per_pair: float,
    alpha: float,
    pairs: str = "all",
    relay: bool = False,
) -> BundleBatch | None:
    """Bundles of a uniform exchange among nodes x locs, one per (src local, dst local,
    same node / same leaf / across leaves); None when the nodes are not spread evenly over
    leaves (then the caller models flows one by one).

    Exact: the flow set is invariant under permutations of nodes that keep the leaf
    structure, so the (unique) max-min allocation gives equal rates to flows that such
    permutations map onto each other, and flows of one bundle see equally loaded links.
    """
    G, L = topo.gpus_per_node, topo.links_per_node
    S = len(nodes)
    base = nodes * L
    acc = _Acc()
    f = topo.fabric
    for a in locs:
        for b in locs:
            a_, b_ = int(a), int(b)
            ranks = np.stack([nodes * G + a_, nodes * G + b_], axis=1)
            if a_ != b_ and pairs in ("all", "intra"):
                loc = np.asarray(topo.intra[a_][b_], dtype=np.int64)
                lat, over = _route_cost(topo, topo.intra[a_][b_], False, alpha)
                acc.add(
                    S,
                    per_pair + over,
                    lat,
                    [(base[None, :, None] + loc, 1.0)],
                    ranks.ravel()[None, :],
                )
            if S < 2 or pairs == "intra" or (pairs == "rail" and a_ != b_):
                continue
            assert f is not None
            sp, ia = topo.src_part(a_, b_, relay)
            dp, ib = topo.dst_part(b_)
            ls, ld = f.leaf(nodes, ia), f.leaf(nodes, ib)
            # n_same[x]: destinations y != x of source x behind x's own leaf; m_same[y] likewise
            cnt_d = np.bincount(ld, minlength=int(max(ls.max(), ld.max())) + 1)
            cnt_s = np.bincount(ls, minlength=len(cnt_d))
            n_same = cnt_d[ls] - (ld == ls)
            m_same = cnt_s[ld] - (ld == ls)
            if np.ptp(n_same) or np.ptp(m_same):
                return None  # uneven leaves: bundles would not be symmetric
            for trunk, n_rel, m_rel in (
                (False, n_same[0], m_same[0]),
                (True, S - 1 - n_same[0], S - 1 - m_same[0]),
            ):
                if n_rel == 0:
                    continue
                lat, over = _route_cost(topo, sp + dp, trunk, alpha)
                spa, dpa = np.asarray(sp, dtype=np.int64), np.asarray(dp, dtype=np.int64)
                links = [
                    (base[None, :, None] + spa, float(n_rel)),
                    (base[None, :, None] + dpa, float(m_rel)),
                ]
                if trunk:
                    up = np.unique(ls, return_counts=True)
                    down = np.unique(ld, return_counts=True)
                    links.append((topo.trunk_up(up[0])[None, :], up[1][None, :] * float(n_rel)))
                    links.append(
                        (topo.trunk_down(down[0])[None, :], down[1][None, :] * float(m_rel))
                    )
                acc.add(S * n_rel, per_pair + over, lat, links, ranks.ravel()[None, :])
    return acc.batch()


# -- the solver -----------------------------------------------------------------------------
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
