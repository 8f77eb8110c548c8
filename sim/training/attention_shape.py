"""How far a fused attention kernel's share of peak moves with its shape.

A FlashAttention-style kernel streams the keys past each tile of queries: the work that grows
with the key loop (two GEMMs per key block) reaches the long-sequence share, and each query
tile's fixed work (loading Q, the softmax rescale, writing O and the log-sum-exp) is paid once
per tile. So the share falls with the loop's length as 1 / (1 + len0 / L), L the causal
sequence that loops as far (a causal kernel over L tokens loops over L / 2 keys on average).
The head dim sets how much GEMM work each softmax element carries: small heads spend more of
the kernel in the exponentials (`head_dim`, relative to head dim 128).

The presets' `attention_fwd` / `attention_bwd` hold at head dim 128 and `ref_len`; this law
carries them to other lengths and head dims. Its figures come from a measured sweep (the
GPU suite's attention part), recorded with their source in each preset.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AttentionShape:
    len0: tuple[float, float]  # (forward, backward): tokens at half the long-sequence share
    head_dim: tuple[tuple[int, float, float], ...]  # (dim, forward, backward), dims ascending
    ref_len: float = 6144.0

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> AttentionShape:
        """From a preset's `gpu.kernels.attention_shape` (checked by the topology schema)."""
        heads = sorted(
            (int(d), float(v["fwd"]), float(v["bwd"])) for d, v in spec["head_dim"].items()
        )
        len0 = spec["len0"]
        return cls(
            (float(len0["fwd"]), float(len0["bwd"])),
            tuple(heads),
            float(spec.get("ref_len", 6144.0)),
        )

    def head(self, dim: int, backward: bool) -> float:
        """The head-dim factor: linear between the dims given, the nearest beyond them."""
        dims = [d for d, _, _ in self.head_dim]
        col = 2 if backward else 1
        i = bisect.bisect_left(dims, dim)
        if i < len(dims) and dims[i] == dim:
            return self.head_dim[i][col]
        if i == 0:
            return self.head_dim[0][col]
        if i == len(dims):
            return self.head_dim[-1][col]
        (d0, *f0), (d1, *f1) = self.head_dim[i - 1], self.head_dim[i]
        t = (dim - d0) / (d1 - d0)
        return f0[col - 1] + t * (f1[col - 1] - f0[col - 1])

    def factor(self, length: float, dim: int, backward: bool) -> float:
        """The share at (causal-equivalent `length`, head `dim`) over the share at (ref_len,
        128); 1 where the kernel's shape is unknown (length or dim 0)."""
        if length <= 0 or dim <= 0:
            return 1.0
        l0 = self.len0[1] if backward else self.len0[0]
        return self.head(dim, backward) * (1.0 + l0 / self.ref_len) / (1.0 + l0 / length)
