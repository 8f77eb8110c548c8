"""Batch partitions of a MoE layer with the capacity passed between them (Lancet Sec. 5,
Fig. 5(c)): no token is dropped that the unpartitioned layer keeps.

Partition j holds sequences [B*j/k, B*(j+1)/k) of each GPU's batch. Cutting the capacity
too (C/k slots per partition, plain micro-batching) would drop the tokens of a partition that
routes more than C/k to an expert. Instead partition j may use whatever its predecessors
left of C: kept_j = min(demand_j, C - sum of kept before j). The kept counts of all
partitions add up to min(demand, C), the unpartitioned layer's. The all-to-alls become
irregular (all-to-allv): each partition sends what it kept.
"""

from __future__ import annotations

import numpy as np

from sim.strategies.chunking import ChunkSizes
from sim.workload.moe import MoELayer


def batch_bounds(batch: int, k: int) -> list[int]:
    """Sequence bounds of k batch partitions (sizes differ by at most one)."""
    return [batch * j // k for j in range(k + 1)]


def split_demand(demand: np.ndarray, batch: int, k: int) -> np.ndarray:
    """[k, ...] each partition's share of the demand, in proportion to its sequences (the
    routing model has counts per GPU, not per token: spread evenly over the batch)."""
    bounds = batch_bounds(batch, k)
    cum = [demand * b // batch for b in bounds]
    return np.stack([hi - lo for lo, hi in zip(cum, cum[1:])])


def pass_capacity(demand: np.ndarray, capacity: int) -> np.ndarray:
    """[k, ...] tokens each partition keeps when it may use what earlier ones left of C."""
    kept = np.zeros_like(demand)
    used = np.zeros_like(demand[0])
    for j in range(demand.shape[0]):
        kept[j] = np.minimum(demand[j], capacity - used)
        used = used + kept[j]
    return kept


def partition_tokens(layer: MoELayer, k: int) -> np.ndarray:
    """[k, P, E] tokens partition j of GPU p sends to expert e."""
    return pass_capacity(split_demand(layer.routed_matrix, layer.batch, k), layer.capacity)


def partition_sizes(layer: MoELayer, k: int) -> ChunkSizes:
    """What each partition's exchanges move and rows its experts compute, in the layout of
    the layer builder's capacity chunks. Uniform routing keeps padded even exchanges of the
    partition's slots (the paper's static-shape estimate: capacity C/k)."""
    P, El, M, e = layer.world, layer.local_experts, layer.model_dim, layer.elem
    toks = partition_tokens(layer, k)
    if layer.uniform:
        caps = [int(c) for c in toks[:, 0, 0]]
        a2a = [float(layer.experts * c * M * e) for c in caps]
        return ChunkSizes(True, a2a, [], [np.full(P, float(El * P * c)) for c in caps])
    split, rows = [], []
    for j in range(k):
        per_owner = toks[j].reshape(P, P, El).sum(axis=2).astype(float)  # [src, dst]
        split.append(per_owner * M * e)
        rows.append(per_owner.sum(axis=0))
    caps = [int(c) for c in toks.max(axis=(1, 2))]
    return ChunkSizes(False, [float(layer.experts * c * M * e) for c in caps], split, rows)
