"""Bundles: the unit the flow solver moves.

A bundle is `count` flows known to get the same rate, each with `remaining` bytes to send,
crossing link instances with multiplicities (how many of the bundle's flows cross that link).
Per-flow fidelity makes every flow its own bundle; the bundled fidelity (sim.hardware.network.
layouts) groups the flows of a collective that are equivalent under permutations of nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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


class BundleAccumulator:
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
        count: np.ndarray | float,
        nbytes: np.ndarray | float,
        lat: np.ndarray | float,
        links: Sequence[tuple[np.ndarray, np.ndarray | float]],
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

        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

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
