"""A top-k gate's choices that reproduce a routing model's token counts, for the real layer.

The simulator's routing (`MoELayer.routed_matrix`, capped at the capacity C into
`tokens_matrix`) says how many of GPU p's choices go to expert e; the executor's real layer
needs the choices themselves: each of its T tokens picks k distinct experts. This module
turns the counts of one GPU into such choices so that, after the layer's GShard capacity rule
(first choices in token order, then second choices, ...; at most C per expert), the kept
choices per expert are exactly the simulator's `tokens_matrix[p]`, and the chunks of the
capacity dimension (`MoELayer.chunk_tokens`) hold what the simulator's graph exchanges.

Method. Whatever the order of choices, an expert chosen d times keeps min(d, C) of them, so
only the per-expert demand matters:

1. the demand to realise: an expert the simulator leaves below capacity (K_e < C) must be
   chosen exactly K_e times; a full one (K_e = C) any number of times in [C, T] (a token
   picks an expert at most once), starting from its modelled demand clipped into that range;
2. the demands must add up to k*T (every token makes k choices): missing choices go to the
   full experts with room left (they are dropped there, as in the model), surplus ones are
   taken from full experts above C (choices that were dropped anyway);
3. where that is impossible (the model's multinomial lets a token pick one expert twice, so a
   hot expert can be drawn more than T times; a `matrix:` row can add up to anything), the
   nearest realisable demand is taken (missing choices go to the most demanded experts with
   room, surplus ones come off the most demanded) and the plan says which counts differ;
4. the choices: write expert ids in ascending order, each repeated as often as its demand,
   and give position i to token (i mod T) as its choice number (i div T). An expert's
   demand is at most T, so its positions fall on distinct tokens; every token gets k choices.
   Tokens are then shuffled (seeded) so that which tokens are dropped is not a block.

The real layer prescribes only which experts a token picks: its combine weights remain the
gate's softmax probabilities of those experts, so gradients reach the gate as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.workload.moe import MoELayer


@dataclass(frozen=True)
class GatePlan:
    """Per GPU: the demand per expert the choices realise, and the kept counts they give."""

    demand: np.ndarray  # [P, E] choices per (GPU, expert), each row adding up to k*T
    kept: np.ndarray  # [P, E] min(demand, C): what the real layer keeps
    target: np.ndarray  # [P, E] the simulator's tokens_matrix
    tokens: int
    top_k: int

    @property
    def exact(self) -> bool:
        return bool((self.kept == self.target).all())

    def differences(self) -> list[str]:
        """'GPU p expert e: simulator n, real gate m' for every count that differs."""
        rows, cols = np.nonzero(self.kept != self.target)
        return [
            f"GPU {p} expert {e}: simulator {int(self.target[p, e])}, real gate "
            f"{int(self.kept[p, e])}"
            for p, e in zip(rows.tolist(), cols.tolist())
        ]

    def choices(self, rank: int, seed: int = 0) -> np.ndarray:
        """[T, k] expert ids of GPU `rank`'s tokens (distinct per token)."""
        return token_choices(self.demand[rank], self.tokens, self.top_k, seed, rank)


def plan(layer: MoELayer) -> GatePlan:
    """The gate plan of a layer with a routing model (uniform routing has none: every
    buffer is full whatever the gate does, and the real layer keeps its own gate)."""
    target = layer.tokens_matrix
    routed = layer.routed_matrix
    T, k, C = layer.tokens, layer.top_k, layer.capacity
    demand = np.stack([realisable(routed[p], target[p], T, k, C) for p in range(layer.world)])
    return GatePlan(demand, np.minimum(demand, C), target, T, k)


def realisable(routed: np.ndarray, kept: np.ndarray, T: int, k: int, C: int) -> np.ndarray:
    """[E] demands, each in [0, T] and adding up to k*T, whose capping at C gives `kept`
    where that can be done (module docstring, steps 1-3)."""
    kept = np.minimum(kept.astype(np.int64), T)
    full = kept >= C  # kept == C (kept never exceeds C); C <= T here
    d = np.where(full, np.clip(routed, C, T), kept).astype(np.int64)
    need = k * T - int(d.sum())
    order = np.argsort(-routed, kind="stable")  # the most demanded first
    if need > 0:  # missing choices: onto full experts with room, where they are dropped
        need = _add(d, [e for e in order if full[e]], T, need)
    elif need < 0:  # surplus: off full experts above C (choices dropped anyway)
        need = -_take(d, [e for e in order if full[e]], C, -need)
    if need > 0:  # not realisable: the most demanded experts with room take the rest (those
        need = _add(d, list(order), T, need)  # nearest capacity first: fewest kept changed)
    elif need < 0:
        need = -_take(d, list(order), 0, -need)
    assert need == 0, "k <= E guarantees room for k*T choices"
    return d


def _add(d: np.ndarray, experts: list, cap: int, n: int) -> int:
    for e in experts:
        step = min(cap - int(d[e]), n)
        if step > 0:
            d[e] += step
            n -= step
    return n


def _take(d: np.ndarray, experts: list, floor: int, n: int) -> int:
    for e in experts:
        step = min(int(d[e]) - floor, n)
        if step > 0:
            d[e] -= step
            n -= step
    return n


def assign(demand: np.ndarray, T: int, k: int, seed: int = 0) -> np.ndarray:
    """[T, k] expert ids: expert e in demand[e] rows, never twice in one row (step 4)."""
    demand = np.asarray(demand, dtype=np.int64)
    if int(demand.sum()) != k * T or (demand < 0).any() or (demand > T).any():
        raise ValueError(f"demand {demand.tolist()} is not k*T = {k * T} choices of <= {T} each")
    seq = np.repeat(np.arange(len(demand)), demand)  # position i: token i % T, choice i // T
    choices = seq.reshape(k, T).T
    perm = np.random.default_rng(seed).permutation(T)
    return np.ascontiguousarray(choices[perm])


def token_choices(demand, T: int, k: int, seed: int, rank: int) -> np.ndarray:
    """GPU `rank`'s [T, k] choices for its demand row, shuffled by (seed, rank)."""
    return assign(np.asarray(demand, dtype=np.int64), T, k, seed * 1_000_003 + rank)
