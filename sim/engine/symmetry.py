"""Symmetry: which simulated rank stands for which ranks, and the network as seen from them.

Where a group of rank permutations maps the whole task graph onto itself and each permutation
is a topology automorphism (nodes permuted with their local GPU order kept, leaf/unit
structure kept, so every route maps onto a route of equal links), the max-min allocation,
which is unique, gives a flow and its images equal rates, and every task starts and ends when
its images do. The engine then runs one representative per orbit of ranks. Its network is
the quotient by the same group: a link stands for its orbit O, and a bundle of a collective
with c copies in the whole cluster (its images: the other replicas' copies and those of
represented ranks, "shadow flows") loads it with

    c * (flows of the bundle crossing links of O) / |O|

which is the load every link of O carries in the full simulation; progressive filling on
the quotient therefore saturates the same links at the same levels and freezes the same
bundles. Links of the representatives' own nodes that other traffic never shares keep their
multiplicity; a leaf's spine trunk shared by k replicas carries k times the representative's
flows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.hardware.network import BundleBatch


@dataclass
class Symmetry:
    """Ranks and links folded onto the representatives the simulation runs."""

    rep_of: np.ndarray  # per rank of the topology: the simulated rank standing for it
    weight: np.ndarray  # per rank: size of its orbit (read at representatives)
    link_rep: np.ndarray  # per link instance: the link of its orbit the simulation loads
    info: dict[str, Any] = field(default_factory=dict)  # what was reduced, why, and how much

    def __post_init__(self) -> None:
        self.orbit = np.bincount(self.link_rep, minlength=len(self.link_rep)).astype(float)

    def copies(self, ranks: Sequence[int], size: int) -> float:
        """Copies of an operation in the full cluster: the ranks its present members stand
        for, over the ranks one copy involves."""
        return float(self.weight[np.asarray(ranks, dtype=np.int64)].sum()) / size

    def fold(self, batch: BundleBatch, copies: float) -> BundleBatch:
        """`batch` on the quotient network (see the module docstring). A bundle's incidences
        on links of one orbit merge into one, so a bundle spread over a thousand equivalent
        nodes costs the solver one entry per link class."""
        lk = self.link_rep[batch.inc_l]
        key = batch.inc_b * len(self.link_rep) + lk
        uniq, inv = np.unique(key, return_inverse=True)
        inc_b, inc_l = np.divmod(uniq, len(self.link_rep))
        mult = np.bincount(inv, weights=batch.inc_m, minlength=len(uniq))
        return BundleBatch(
            batch.count,
            batch.nbytes,
            batch.latency,
            inc_b,
            inc_l,
            mult * (copies / self.orbit[inc_l]),
            batch.rank_b,
            batch.rank_r,
        )

    def expand_links(self, carried: np.ndarray) -> np.ndarray:
        """Bytes per link instance of the whole cluster: each as its orbit's representative."""
        out: np.ndarray = carried[self.link_rep]
        return out
