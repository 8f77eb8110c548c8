"""Seconds of a training step's kernels on one GPU, from the GPU's figures in its topology
preset: dense peaks per dtype (`gpu.peak_flops`), HBM bandwidth (`gpu.mem_bw`) and the shares of
them the training kernels reach (`gpu.kernels`, each with its source in the preset).

A GEMM takes the longer of its FLOPs at the dtype's GEMM rate and its bytes at the memory rate
(a roofline: the small MoE GEMMs of fine-grained experts are bound by their weights), the rate
falling with a short reduction length where the GPU has a `gemm_k0` (`k_share`); grouped
expert GEMMs reach `grouped_gemm` of that rate; fused attention its forward and backward
shares of the bf16 peak, carried to the kernel's sequence and head dim by `attention_shape`
(sim.training.attention_shape); everything else is memory-bound. The GEMM and attention
shares are short-run figures; in a step the GPU draws power without pause and holds its SM
clock lower, so they run at `sustained` of them (HBM-bound kernels do not: the memory clock
holds). Every kernel pays `launch_s` of host time unless the recipe captures it in a CUDA
graph, and `kernel_s` of GPU time whatever the host does (the GPU's own per-kernel floor: an
empty kernel and the gap to the next one).

A GEMM's output is computed in tiles, a wave of them per SM at a time: one whose tiles
leave SMs idle in its last wave runs at the share of the waves it fills (`wave_share`; a
grouped GEMM schedules the tiles of all its experts together). TILE is the CTA tile the
Hopper and Blackwell libraries favour for large GEMMs (the first of `dgx-h100`'s
`gpu.gemm.tiles`, assumed for every GPU here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError
from sim.training.attention_shape import AttentionShape
from sim.training.ops import Work

TILE = (128, 256)  # rows x columns of a GEMM's output tile
K_REF = 8192.0  # the reduction length of the GEMMs the gemm shares were measured on (8192^3)


@dataclass(frozen=True)
class GpuKernels:
    name: str
    peak: dict[str, float]
    mem_bw: float
    gemm: dict[str, float]
    grouped_gemm: float
    attention_fwd: float
    attention_bwd: float
    memory_bound: float
    launch_s: float
    memory_bytes: float  # what an allocator can have: CUDA's total (`cuda_memory_bytes`)
    sms: int = 0
    kernel_s: float = 0.0
    compute_capability: tuple[int, int] = (0, 0)  # (0, 0): not given
    attention_shape: AttentionShape | None = None  # None: one attention share for every shape
    gemm_k0: dict[str, float] = field(default_factory=dict)  # dtype -> K at half the share
    hybridep_link_share: float = 0.0  # 0: not given (HybridEP as DeepEP's kernels)
    # share of its short-run rate an SM-bound kernel (GEMM, attention) holds under a step's
    # sustained power draw (`gpu.kernels.sustained`; 1: none given)
    sustained: float = 1.0

    @property
    def fp8_any_layout(self) -> bool:
        """Whether FP8 GEMMs take any operand layout, so that a per-tensor scaled FP8 tensor
        needs no transposed copy (Transformer Engine `is_non_tn_fp8_gemm_supported`:
        compute capability 10.x, or 13.0 and later; Hopper takes only TN layouts)."""
        return (10, 0) <= self.compute_capability < (12, 0) or self.compute_capability >= (13, 0)

    @classmethod
    def from_gpu(cls, gpu: dict[str, Any], where: str) -> GpuKernels:
        k = gpu.get("kernels")
        if not k:
            raise ConfigError(
                f"{where}: the topology's gpu has no `kernels` section (the shares of peak "
                "training kernels reach); a whole-step prediction needs one"
            )
        missing = [
            f
            for f in ("gemm", "attention_fwd", "attention_bwd", "memory_bound")
            if k.get(f) is None
        ]
        if missing:
            raise ConfigError(f"{where}: gpu.kernels lacks {', '.join(missing)}")
        cc = gpu.get("compute_capability") or (0, 0)
        shape = k.get("attention_shape")
        return cls(
            name=str(gpu.get("model", where)),
            peak={str(d): float(v) for d, v in gpu["peak_flops"].items()},
            mem_bw=float(gpu["mem_bw"]),
            gemm={str(d): float(v) for d, v in k["gemm"].items()},
            grouped_gemm=float(k.get("grouped_gemm") or 1.0),
            attention_fwd=float(k["attention_fwd"]),
            attention_bwd=float(k["attention_bwd"]),
            memory_bound=float(k["memory_bound"]),
            launch_s=float(k.get("launch_s") or 0.0),
            memory_bytes=float(gpu.get("cuda_memory_bytes") or gpu["memory_bytes"]),
            sms=int(gpu.get("sms") or 0),
            kernel_s=float(k.get("kernel_s") or 0.0),
            compute_capability=(int(cc[0]), int(cc[1])),
            attention_shape=AttentionShape.from_spec(shape) if shape else None,
            gemm_k0={str(d): float(v) for d, v in (k.get("gemm_k0") or {}).items()},
            hybridep_link_share=float(k.get("hybridep_link_share") or 0.0),
            sustained=float(k.get("sustained") or 1.0),
        )

    def rate(self, dtype: str) -> float:
        """FLOP/s a large GEMM of `dtype` reaches in a training step (its short-run share
        held down to `sustained`)."""
        if dtype == "fp32":  # the router: fp32 on CUDA cores, at the roofline's share
            fp32 = self.peak.get("fp32", self.peak["bf16"] / 16)
            return fp32 * self.gemm.get("bf16", 0.7) * self.sustained
        if dtype not in self.peak or dtype not in self.gemm:
            raise ConfigError(
                f"{self.name}: no {dtype} GEMMs (peak_flops has {sorted(self.peak)}, "
                f"kernels.gemm {sorted(self.gemm)}): this precision does not run on this GPU"
            )
        return self.peak[dtype] * self.gemm[dtype] * self.sustained

    def seconds(self, w: Work, backward: bool = False) -> float:
        """One work item's forward (or backward) time, launches excluded."""
        scale = w.bwd if backward else 1.0
        mem = w.bytes * scale / (self.mem_bw * self.memory_bound)
        if w.kind == "memory":
            return mem
        if w.kind == "attention":
            share = (self.attention_bwd if backward else self.attention_fwd) * self.sustained
            if self.attention_shape is not None:
                share *= self.attention_shape.factor(w.span, w.head_dim, backward)
            return max(w.flops * scale / (self.peak["bf16"] * share), mem)
        rate = self.rate(w.dtype) * self.wave_share(w)
        if w.kind == "grouped_gemm":
            rate *= self.grouped_gemm
        if w.shape is None or w.dtype not in self.gemm_k0:
            return max(w.flops * scale / rate, mem)
        m, n, k = w.shape
        if not backward:
            return max(w.flops / (rate * self.k_share(w.dtype, k)), mem)
        # the data gradient reduces over the output width n, the weight gradient over the
        # rows (tokens per expert): each does the forward's FLOPs (bwd = 2)
        half = w.flops * scale / 2
        return max(
            half / (rate * self.k_share(w.dtype, n)) + half / (rate * self.k_share(w.dtype, m)),
            mem,
        )

    def k_share(self, dtype: str, k: float) -> float:
        """A GEMM's share at reduction length `k` over its share at 8192 (`gemm_k0`): each
        output tile's fixed work (prologue, epilogue) against its K loop; 1 where no k0."""
        k0 = self.gemm_k0.get(dtype, 0.0)
        if k0 <= 0 or k <= 0:
            return 1.0
        return (1.0 + k0 / K_REF) / (1.0 + k0 / k)

    def wave_share(self, w: Work) -> float:
        """Share of the SM-waves a GEMM's tiles fill (1: no idle SMs in its last wave)."""
        if w.shape is None or self.sms < 1:
            return 1.0
        m, n, _ = w.shape
        tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1]) * max(1, w.experts)
        if tiles < 1:
            return 1.0
        return tiles / (math.ceil(tiles / self.sms) * self.sms)

    def stretch(self, gpu_s: float, kernels: int, launches: int, synced: bool) -> float:
        """A stretch of `kernels` kernels taking `gpu_s` of GPU work, `launches` of them
        issued by the host: plus each kernel's floor (`kernel_s`); after a host sync the
        host cannot run ahead, so the longer of that and the launches (`launch_s` each)."""
        t = gpu_s + kernels * self.kernel_s
        return max(t, launches * self.launch_s) if synced else t

    def launches(self, w: Work, backward: bool = False) -> int:
        if backward and w.bwd_launches is not None:
            return w.bwd_launches
        return int(round(w.launches * (w.bwd if backward else 1.0)))
