"""A training run's parallel layout as Megatron-Core lays it out, and the groups it makes.

Ranks are ordered `tp-cp-dp-pp` for the dense part (attention, dense MLPs, embeddings) and
`etp-ep-edp-pp` for the experts (MoE parallel folding, Megatron-Core's
`RankGenerator(order="tp-cp-ep-dp-pp")` with a separate expert generator): TP innermost, so
TP groups are consecutive ranks inside a node, and a pipeline stage is a contiguous block of
`gpus / pp` ranks. Attention is split over TP x CP x DP x PP, experts over ETP x EP x EDP x PP
on the same ranks.

`groups(dim)` lists every group of one dimension: the collectives of one kind run on all of
them at once in a step (every DP group reduces its gradients at the same time), so their
traffic shares the fabric and a collective is timed with all of its groups together
(`sim.training.comm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.errors import ConfigError

DIMS = ("tp", "cp", "dp", "dpcp", "pp", "etp", "ep", "edp")


@dataclass(frozen=True)
class Layout:
    gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1  # virtual pipeline chunks per stage (1: plain 1F1B)
    ep: int = 1
    etp: int = 1  # expert tensor parallelism
    fsdp: int = 0  # 0: DDP with the distributed optimizer; N: FSDP over N GPUs
    mbs: int = 1
    gbs: int = 1
    seq: int = 4096
    where: str = "layout"  # names the row in errors

    def __post_init__(self) -> None:
        for k in ("gpus", "tp", "pp", "cp", "vp", "ep", "etp", "mbs", "gbs", "seq"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{self.where}: {k}: expected an integer >= 1, got {v!r}")
        if self.gpus % (self.tp * self.pp * self.cp):
            raise ConfigError(
                f"{self.where}: tp x pp x cp = {self.tp * self.pp * self.cp} does not divide "
                f"the {self.gpus} GPUs"
            )
        if self.gpus % (self.etp * self.ep * self.pp):
            raise ConfigError(
                f"{self.where}: ep: etp x ep x pp = {self.etp * self.ep * self.pp} does not "
                f"divide the {self.gpus} GPUs"
            )
        if self.gbs % (self.mbs * self.dp):
            raise ConfigError(
                f"{self.where}: gbs: {self.gbs} is not a multiple of mbs x dp = "
                f"{self.mbs} x {self.dp}"
            )
        if self.seq % self.cp or (self.cp > 1 and self.seq % (2 * self.cp)):
            raise ConfigError(
                f"{self.where}: seq_len: {self.seq} must split into 2 x cp = {2 * self.cp} "
                "chunks (context parallelism's load-balanced halves)"
            )
        if self.fsdp and self.fsdp not in (self.dp * self.cp, self.gpus):
            raise ConfigError(
                f"{self.where}: fsdp: expected 0 or the data-parallel size {self.dp * self.cp}, "
                f"got {self.fsdp}"
            )

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def edp(self) -> int:
        return self.gpus // (self.etp * self.ep * self.pp)

    @property
    def ga(self) -> int:
        """Micro-batches per step (gradient accumulation)."""
        return self.gbs // (self.mbs * self.dp)

    @property
    def stage_size(self) -> int:
        return self.gpus // self.pp

    @property
    def dpcp(self) -> int:
        """Ranks a dense gradient is reduced over (Megatron's data-parallel-with-CP group)."""
        return self.dp * self.cp

    def size(self, dim: str) -> int:
        return int(getattr(self, dim))

    def index(self, rank: int) -> dict[str, int]:
        """The rank's coordinate in every dimension."""
        s = rank % self.stage_size
        tp, cp = s % self.tp, (s // self.tp) % self.cp
        dp = s // (self.tp * self.cp)
        etp, ep = s % self.etp, (s // self.etp) % self.ep
        edp = s // (self.etp * self.ep)
        return {
            "tp": tp,
            "cp": cp,
            "dp": dp,
            "pp": rank // self.stage_size,
            "etp": etp,
            "ep": ep,
            "edp": edp,
        }

    def groups(self, dim: str) -> list[list[int]]:
        """Every group of `dim`: ranks that differ only in that coordinate, in its order."""
        if dim not in DIMS:
            raise ValueError(f"unknown dimension {dim!r}")
        n = self.size(dim)
        if dim == "pp":
            S = self.stage_size
            return [[s + p * S for p in range(self.pp)] for s in range(S)]
        inner = {
            "tp": 1,
            "cp": self.tp,
            "dp": self.tp * self.cp,
            "dpcp": self.tp,
            "etp": 1,
            "ep": self.etp,
            "edp": self.etp * self.ep,
        }[dim]
        ranks = np.arange(self.gpus)
        coord = (ranks % self.stage_size) // inner % n
        base = ranks - coord * inner
        out: dict[int, list[int]] = {}
        for r, b in zip(ranks.tolist(), base.tolist()):
            out.setdefault(b, []).append(r)
        return [sorted(g) for g in out.values()]
