"""Capacity chunks of a MoE layer (Tutel/PipeMoE): what each chunk's exchanges move and rows
its experts compute, and the order the exchanges of all chunks are issued in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.errors import ConfigError
from sim.workload.moe import MoELayer

ORDERS = ("tutel", "alternating", "two_streams")


def comm_order(r: int, order: str) -> list[tuple[str, int, str]]:
    """Issue order of (first|second exchange, chunk, stream) on the comm stream(s).

    tutel: all first exchanges queued before any second one on one stream.
    alternating (MPipeMoE Fig. 4b): S1, S2, R1, S3, R2, ..., Sr, R(r-1), Rr on one stream.
    two_streams: first exchanges on `comm`, second exchanges on `comm.1`.
    """
    if order == "tutel":
        return [("first", j, "comm") for j in range(r)] + [("second", j, "comm") for j in range(r)]
    if order == "alternating":
        seq = [("first", 0, "comm")]
        for j in range(1, r):
            seq += [("first", j, "comm"), ("second", j - 1, "comm")]
        return seq + [("second", r - 1, "comm")]
    if order == "two_streams":
        return [("first", j, "comm") for j in range(r)] + [
            ("second", j, "comm.1") for j in range(r)
        ]
    raise ConfigError(f"strategy.order: expected one of {ORDERS}, got {order!r}")


@dataclass
class ChunkSizes:
    """Per chunk: per-rank send bytes (uniform) or split matrix, and expert rows per rank."""

    uniform: bool
    a2a_bytes: list[float]  # uniform: per-rank buffer bytes per chunk
    split: list[np.ndarray]  # non-uniform: [P, P] bytes p sends to q, per chunk
    rows: list[np.ndarray]  # [P] token rows each rank's experts process, per chunk


def chunk_sizes(layer: MoELayer, r: int) -> ChunkSizes:
    P, El, M, e = layer.world, layer.local_experts, layer.model_dim, layer.elem
    caps = layer.chunk_capacity(r)
    a2a = [float(layer.experts * c * M * e) for c in caps]
    if layer.uniform:  # closed form: no [P, E] matrices at 2,048 GPUs
        return ChunkSizes(True, a2a, [], [np.full(P, float(El * P * c)) for c in caps])
    chunks = layer.chunk_tokens(r)  # [r, P, E]; experts of rank q are q*El .. q*El+El-1
    split, rows = [], []
    for j in range(r):
        per_owner = chunks[j].reshape(P, P, El).sum(axis=2).astype(float)  # [src, dst] tokens
        split.append(per_owner * M * e)
        rows.append(per_owner.sum(axis=0))
    return ChunkSizes(False, a2a, split, rows)
