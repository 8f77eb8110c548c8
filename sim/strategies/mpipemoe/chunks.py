"""MPipeMoE's micro-batches: per-rank sizes of each chunk's tensors, GEMMs and all-to-all."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.graph import Task
from sim.strategies.chunking import chunk_sizes
from sim.workload.moe import MoELayer

# -- micro-batch sizes -------------------------------------------------------------------------


@dataclass
class Chunk:
    """Micro-batch j: per-rank sizes of its tensors and GEMMs, and its all-to-all."""

    layer: MoELayer
    j: int
    capacity: int  # capacity slots of this chunk
    rows: np.ndarray  # [P] token rows each rank's experts receive (T_DI rows)
    a2a_bytes: float  # uniform routing: bytes every rank sends
    split: np.ndarray | None  # otherwise: [P, P] bytes src -> dst

    @property
    def di_bytes(self) -> np.ndarray:
        return self.rows * self.layer.model_dim * self.layer.elem

    @property
    def m_bytes(self) -> np.ndarray:
        return self.rows * self.layer.hidden_dim * self.layer.elem

    def shapes(self, rank: int) -> tuple[dict, dict]:
        l = self.layer
        if self.split is None:  # grouped GEMM over the local experts' padded buffers
            m, b = l.world * self.capacity, l.local_experts
        else:
            m, b = int(self.rows[rank]), 1
        fc1 = {"batch": b, "m": m, "n": l.hidden_dim, "k": l.model_dim}
        fc2 = {"batch": b, "m": m, "n": l.model_dim, "k": l.hidden_dim}
        return fc1, fc2

    @property
    def fc1_shape(self) -> list[dict]:
        return [self.shapes(r)[0] for r in range(self.layer.world)]

    @property
    def fc1_flops(self) -> list[float]:
        return [_flops(s) for s in self.fc1_shape]

    @property
    def fc1_bytes(self) -> list[float]:
        return [_gemm_bytes(s, self.layer.elem) for s in self.fc1_shape]

    def exchange(
        self, rank: int, tid: str, coll: str, group: list[int], algo: str | None, reverse: bool
    ) -> Task:
        """This chunk's all-to-all on `rank`; `reverse` sends expert rows back to their owners."""
        if self.split is None:
            return Task(
                tid,
                rank,
                "comm",
                "all_to_all",
                bytes=self.a2a_bytes,
                group=group,
                coll=coll,
                algo=algo,
            )
        m = self.split.T if reverse else self.split
        send, recv = m[rank], m[:, rank]
        return Task(
            tid,
            rank,
            "comm",
            "all_to_allv",
            bytes=float(send.sum()),
            split=send.tolist(),
            recv_split=recv.tolist(),
            group=group,
            coll=coll,
            algo=algo,
        )


def chunk_plan(layer: MoELayer, n: int) -> list[Chunk]:
    s = chunk_sizes(layer, n)
    caps = layer.chunk_capacity(n)
    return [
        Chunk(layer, j, caps[j], s.rows[j], s.a2a_bytes[j], None if s.uniform else s.split[j])
        for j in range(n)
    ]


def _flops(s: dict) -> float:
    return 2.0 * s["batch"] * s["m"] * s["n"] * s["k"]


def _gemm_bytes(s: dict, elem: float) -> float:
    b, m, n, k = s["batch"], s["m"], s["n"], s["k"]
    return float(elem * b * (m * k + m * n + k * n))


def _dgrad(s: dict) -> dict:
    """dy W^T from a transposed view of W (sim.strategies.layer._t)."""
    return {"batch": s["batch"], "m": s["m"], "n": s["k"], "k": s["n"], "layout": "nt"}


def _wgrad(s: dict) -> dict:
    """x^T dy from a transposed view of x (sim.strategies.layer._w)."""
    return {"batch": s["batch"], "m": s["k"], "n": s["n"], "k": s["m"], "layout": "tn"}
