"""Bundles from flows: per-flow (every flow its own bundle) and bundled uniform exchanges.

The bundled fidelity groups the flows of a collective that are equivalent under permutations
of nodes (same source-local GPU, destination-local GPU, same/other node), which is exact on a
single-switch fabric with identical nodes and turns the 4 M flows of a 2,048-GPU all-to-all
into ~128 bundles. The max-min solver is the same for both, so they agree wherever bundling
applies (tests check it).
"""

from __future__ import annotations

import numpy as np

from sim.hardware.network.bundles import BundleAccumulator, BundleBatch
from sim.hardware.topology import Topology


def route_cost(topo: Topology, local: list[int], trunk: bool, alpha: float) -> tuple[float, float]:
    """(latency before data moves, per-message overhead in bytes) of a route.

    A message occupies its route for the largest per-message cost of the link classes it
    crosses (the NIC's message rate, usually); that time is charged as bytes at the route's
    bottleneck rate, so a thousand tiny messages through one NIC cost a thousand times it.
    The cost that grows with the messages sharing a link is added per step
    (`connection_cost`).
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


def connection_cost(topo: Topology, batch: BundleBatch) -> BundleBatch:
    """Charge each message the per-connection cost of the links it crosses.

    On a link whose class sets `conn_cost`, every message of a collective step occupies the
    link `conn_cost` seconds longer per message crossing that link in the same step (its
    concurrent peer connections: F of them cost F * conn_cost each, F^2 * conn_cost in all);
    like `msg_cost`, the time is charged as bytes at the message's bottleneck rate. Where the
    class also sets `conn_inflight` (K), no more than K of those connections are served at
    once (NCCL progresses a grouped send/recv's peers in rounds: p2p channels x work elements
    per channel), so a message pays conn_cost * min(F, K): F * K * conn_cost in all once F
    passes K, linear in the peers. Without such a link the batch comes back unchanged.
    """
    conn = topo.link_conn
    if not len(batch) or not conn.any():
        return batch
    on = conn[batch.inc_l] > 0
    if not on.any():
        return batch
    lk, bk = batch.inc_l[on], batch.inc_b[on]
    flows = np.bincount(lk, weights=batch.inc_m[on], minlength=len(conn))
    flows = np.minimum(flows, topo.link_inflight)  # rounds of conn_inflight beyond it
    # per bundle, the largest term and the lowest capacity of its links (one sort, no ufunc.at)
    order = np.lexsort((-(conn[lk] * flows[lk]), bk))
    first = np.r_[True, bk[order][1:] != bk[order][:-1]]
    extra = np.zeros(len(batch))
    extra[bk[order][first]] = (conn[lk] * flows[lk])[order][first]
    order = np.lexsort((topo.link_cap[batch.inc_l], batch.inc_b))
    head = np.r_[True, batch.inc_b[order][1:] != batch.inc_b[order][:-1]]
    cap = np.full(len(batch), np.inf)
    cap[batch.inc_b[order][head]] = topo.link_cap[batch.inc_l][order][head]
    batch.nbytes = batch.nbytes + extra * np.where(np.isfinite(cap), cap, 0.0)
    return batch


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
    if G == 1:  # one GPU per node (a flat switch): no division, one kind of pair
        na, nb = src, dst
        la = lb = np.zeros(len(src), dtype=np.int64)
    else:
        na, la = np.divmod(src, G)
        nb, lb = np.divmod(dst, G)
    same = na == nb
    key = same * (G * G) + la * G + lb
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    acc = BundleAccumulator()
    for grp in np.split(order, bounds) if len(order) else []:
        a, b = int(la[grp[0]]), int(lb[grp[0]])
        if same[grp[0]]:
            loc = np.asarray(topo.intra[a][b], dtype=np.int64)
            lat, over = route_cost(topo, topo.intra[a][b], False, alpha)
            own = na[grp, None] * L + loc[None, :]
            acc.add(
                np.ones(len(grp)),
                nbytes[grp] + over,
                lat,
                [(own, 1.0)],
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
            lat, over = route_cost(topo, sp + dp, trunk, alpha)
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
    return connection_cost(topo, acc.batch())


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
    mask: np.ndarray
    if pairs == "all":
        mask = src != dst
    elif pairs == "intra":
        mask = (src // G == dst // G) & (src != dst)
    else:
        mask = (src % G == dst % G) & (src != dst)
    return mask


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
    acc = BundleAccumulator()
    f = topo.fabric
    for a in locs:
        for b in locs:
            a_, b_ = int(a), int(b)
            ranks = np.stack([nodes * G + a_, nodes * G + b_], axis=1)
            if a_ != b_ and pairs in ("all", "intra"):
                loc = np.asarray(topo.intra[a_][b_], dtype=np.int64)
                lat, over = route_cost(topo, topo.intra[a_][b_], False, alpha)
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
                lat, over = route_cost(topo, sp + dp, trunk, alpha)
                spa, dpa = np.asarray(sp, dtype=np.int64), np.asarray(dp, dtype=np.int64)
                links: list[tuple[np.ndarray, np.ndarray | float]] = [
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
    return connection_cost(topo, acc.batch())
