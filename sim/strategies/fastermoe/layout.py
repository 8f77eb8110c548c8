"""Where FasterMoE's tokens go under a shadow set: token rows between ranks once shadowed
experts' tokens stay home, and the members of each step's exchange (groups of g ranks, the
n groups walking G -> G + s; a step's exchanges split into gcd(n, s) disjoint cycles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.workload.moe import MoELayer


@dataclass
class StepLayout:
    """Token rows of the layer under a shadow set: rows[p, q] p sends to q (unshadowed)."""

    g: int
    n: int
    shadow: tuple[int, ...]
    tok: np.ndarray  # [P, E]
    rows: np.ndarray  # [P, P]
    members: dict[tuple[int, int], list[int]]  # (step, cycle) -> ranks, one shared list

    def group(self, rank: int) -> int:
        return rank // self.g

    def cycle(self, s: int, rank: int) -> tuple[int, list[int]]:
        d = math.gcd(self.n, s)  # gcd(n, 0) = n: every group alone at step 0
        c = self.group(rank) % d
        return c, self.members[(s, c)]


def step_layout(layer: MoELayer, g: int, n: int, shadow: tuple[int, ...]) -> StepLayout:
    P, El = layer.world, layer.local_experts
    tok = layer.tokens_matrix.astype(float)
    kept = tok.copy()
    kept[:, list(shadow)] = 0
    rows = kept.reshape(P, P, El).sum(axis=2)  # experts of rank q are q*El .. q*El+El-1
    members: dict[tuple[int, int], list[int]] = {}
    for s in range(n):
        d = math.gcd(n, s)
        for c in range(d):
            members[(s, c)] = [r for r in range(P) if (r // g) % d == c]
    return StepLayout(g, n, shadow, tok, rows, members)
