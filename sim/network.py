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

from sim.topology import Topology

# Bundles finishing within this relative window of the earliest finish complete together:
# symmetric flows then end in one event instead of thousands separated by rounding.
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
def per_flow(
    topo: Topology, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, alpha: float
) -> BundleBatch:
    """Every flow its own bundle. Self-sends and empty messages move nothing and are dropped."""
    keep = (src != dst) & (nbytes > 0)
    src, dst, nbytes = src[keep], dst[keep], nbytes[keep].astype(float)
    G, L = topo.gpus_per_node, topo.links_per_node
    na, la = np.divmod(src, G)
    nb, lb = np.divmod(dst, G)
    same = na == nb
    key = same * (G * G) + la * G + lb
    inc_b, inc_l, lat = [], [], np.zeros(len(src))
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    for grp in np.split(order, bounds):
        if len(grp) == 0:
            continue
        i0 = grp[0]
        a, b = la[i0], lb[i0]
        if same[i0]:
            parts = [(na[grp], topo.intra[a][b])]
        else:
            parts = [(na[grp], topo.out[a]), (nb[grp], topo.inn[b])]
        path_lat = 0.0
        for nodes, local in parts:
            if not local:
                continue
            loc = np.asarray(local, dtype=np.int64)
            inc_l.append((nodes[:, None] * L + loc[None, :]).ravel())
            inc_b.append(np.repeat(grp, len(loc)))
            path_lat += float(topo.local_lat[loc].sum())
        lat[grp] = alpha + path_lat
    n = len(src)
    inc_b_a = np.concatenate(inc_b) if inc_b else np.zeros(0, dtype=np.int64)
    inc_l_a = np.concatenate(inc_l) if inc_l else np.zeros(0, dtype=np.int64)
    return BundleBatch(
        np.ones(n),
        nbytes,
        lat,
        inc_b_a,
        inc_l_a,
        np.ones(len(inc_b_a)),
        np.repeat(np.arange(n), 2),
        np.stack([src, dst], axis=1).ravel(),
    )


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


def bundled_uniform(
    topo: Topology, nodes: np.ndarray, locs: np.ndarray, per_pair: float, alpha: float
) -> BundleBatch:
    """Bundles of a uniform all-to-all among nodes x locs, one per (src local, dst local, same?).

    Exact for a single-switch fabric: the flow set is invariant under node permutations, so
    the (unique) max-min allocation gives equal rates to flows that such permutations map
    onto each other.
    """
    G, L = topo.gpus_per_node, topo.links_per_node
    S = len(nodes)
    base = nodes * L
    count, lat, inc_b, inc_l, inc_m, rank_b, rank_r = [], [], [], [], [], [], []

    def add(c: float, parts: list[tuple[list[int], float]], ranks: np.ndarray, path_lat: float):
        b = len(count)
        count.append(c)
        lat.append(alpha + path_lat)
        for local, mult in parts:
            loc = np.asarray(local, dtype=np.int64)
            links = (base[:, None] + loc[None, :]).ravel()
            inc_l.append(links)
            inc_b.append(np.full(len(links), b))
            inc_m.append(np.full(len(links), mult))
        rank_r.append(ranks)
        rank_b.append(np.full(len(ranks), b))

    for a in locs:
        for b in locs:
            if a != b:
                loc = topo.intra[a][b]
                add(
                    S,
                    [(loc, 1.0)],
                    np.unique(np.concatenate([nodes * G + a, nodes * G + b])),
                    float(topo.local_lat[loc].sum()),
                )
            if S > 1:
                lat_ab = float(
                    topo.local_lat[topo.out[a]].sum() + topo.local_lat[topo.inn[b]].sum()
                )
                add(
                    S * (S - 1),
                    [(topo.out[a], S - 1.0), (topo.inn[b], S - 1.0)],
                    np.unique(np.concatenate([nodes * G + a, nodes * G + b])),
                    lat_ab,
                )
    n = len(count)
    if n == 0:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return BundleBatch(z, z, z, zi, zi, z, zi, zi)
    return BundleBatch(
        np.asarray(count, dtype=float),
        np.full(n, float(per_pair)),
        np.asarray(lat),
        np.concatenate(inc_b),
        np.concatenate(inc_l),
        np.concatenate(inc_m),
        np.concatenate(rank_b),
        np.concatenate(rank_r),
    )


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
    while not frozen.all():
        act = ~frozen[inc_b]
        load = np.bincount(inc_l[act], weights=inc_m[act], minlength=nl)
        busy = load > 0
        if not busy.any():  # bundles that cross no link (cannot happen for real flows)
            rate[~frozen] = np.inf
            break
        level = np.full(nl, np.inf)
        level[busy] = (cap[busy] - used[busy]) / load[busy]
        lev = max(float(level.min()), 0.0)
        sat = busy & (level <= lev * (1 + 1e-12) + 1e-300)
        hit = act & sat[inc_l]
        newly = np.unique(inc_b[hit])
        rate[newly] = lev
        frozen[newly] = True
        sel = np.isin(inc_b, newly) if len(newly) < n else np.ones(len(inc_b), dtype=bool)
        sel &= act
        used += np.bincount(inc_l[sel], weights=inc_m[sel] * lev, minlength=nl)
    return rate


class FlowNetwork:
    """Active bundles, their rates, and the bytes every link has carried."""

    def __init__(
        self,
        topo: Topology,
        now: Callable[[], float],
        rate_scale: Callable[[BundleBatch, np.ndarray], np.ndarray] | None = None,
    ):
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
        done = dt <= tmin + FINISH_RTOL * max(self.now(), 1e-12) + 1e-15
        if tmin > FINISH_RTOL * max(self.now(), 1e-12) + 1e-15:
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
