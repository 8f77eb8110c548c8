"""Peak memory of one GPU in a training step, per pipeline stage.

- Model state, per parameter on the GPU: the bf16 weight (2 B), the fp32 main gradient the
  wgrad GEMMs accumulate into (4 B, or 2 with bf16 reduction), the quantized copies of the
  linear weights Transformer Engine caches across micro-batches (row- and column-wise), and
  with the distributed optimizer the fp32 master weight and Adam's two moments (12 B) over the
  data-parallel ranks of that parameter (dense: DP x CP, experts: expert-DP); FSDP shards
  weights and gradients too.
- Activations: what each kernel keeps for its backward (a GEMM its input, in the GEMM dtype
  when quantized; fused attention Q, K, V, O; a one-in one-out kernel its input), less what the
  recipe recomputes, times the micro-batches a stage holds at once: `pp - stage` in 1F1B, the
  warm-up forwards plus one in the interleaved schedule (one chunk's layers each).
- The largest transient: the bf16 logits of the fused cross-entropy on the last stage.
- A fixed reserve for the CUDA context, NCCL's and the dispatcher's buffers and the caching
  allocator's fragmentation (`RESERVE_BYTES`, assumed; see its comment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.training.ops import ACT, DTYPE_BYTES, LayerWork

if TYPE_CHECKING:
    from sim.training.step import StepModel

# assumed: CUDA context ~0.5 GB, NCCL channel buffers ~1 GB at these group counts, DeepEP /
# HybridEP buffers ~1-2 GB where used, and ~5% allocator fragmentation of an 80 GB GPU
# (PyTorch's caching allocator reports reserved minus allocated of this order in Megatron runs)
RESERVE_BYTES = 6.0e9


@dataclass
class MemoryReport:
    peak_bytes: float
    capacity_bytes: float
    stage: int  # the stage at the peak
    parts: dict[str, float]

    @property
    def margin_bytes(self) -> float:
        return self.capacity_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.margin_bytes >= 0


def saved_bytes(lw: LayerWork, model: StepModel) -> float:
    """Bytes one layer keeps for its backward for one micro-batch."""
    lay = model.lay
    if lw.layer >= 0 and model.recomputed("", lw.layer):  # full: only the layer's input
        return lay.mbs * lay.seq / lay.cp / lay.tp * model.a.hidden * ACT
    if lw.layer >= 0 and model.index_in_stage.get(lw.layer, 0) < model.r.offload_layers:
        return 0.0  # offloaded to the host until its backward
    kept = 0.0
    for w in lw.work:
        if model.recomputed(w.module, lw.layer):
            continue
        if w.name == "core_attn" and model.recomputed("mla_up_proj", lw.layer):
            # Megatron-Core's up-projection recompute regenerates Q, K and V from the latents
            # in the backward: the attention keeps its output and log-sum-exp only
            kept += w.saved_min
            continue
        kept += w.kept
    return kept


def step_memory(model: StepModel, works: list[list[list[LayerWork]]]) -> MemoryReport:
    lay, r, a = model.lay, model.r, model.a
    best: MemoryReport | None = None
    for s in range(lay.pp):
        dense = expert = act = 0.0
        for c in range(lay.vp):
            per_mb = 0.0
            for lw in works[s][c]:
                d, e = model.params(lw)
                dense, expert = dense + d, expert + e
                per_mb += model.saved_bytes(lw)
            inflight = _inflight(lay.pp, lay.vp, lay.ga, s)
            act += per_mb * inflight / lay.vp if lay.vp > 1 else per_mb * inflight
        params = dense + expert
        qbytes = 0.0
        if model.p.quantized:  # cached row- and column-wise copies of the linear weights
            qbytes = 2 * DTYPE_BYTES[model.p.gemm] * params / (lay.fsdp or 1)
        if lay.fsdp:
            state = (2 + r.grad_reduce_bytes + 12) * params / lay.fsdp
        else:
            state = (2 + r.grad_reduce_bytes) * params + 12 * (dense / lay.dpcp + expert / lay.edp)
        logits = 0.0
        if s == lay.pp - 1:
            # bf16 logits; the fused cross-entropy (cross_entropy_fusion_impl: te) writes its
            # gradient in place
            logits = ACT * lay.mbs * lay.seq / lay.cp * a.vocab / lay.tp
        parts = {
            "model_state": state,
            "quantized_weights": qbytes,
            "activations": act,
            "logits": logits,
            "reserve": RESERVE_BYTES,
        }
        rep = MemoryReport(sum(parts.values()), model.gpu.memory_bytes, s, parts)
        if best is None or rep.peak_bytes > best.peak_bytes:
            best = rep
    assert best is not None
    return best


def _inflight(pp: int, vp: int, micro: int, stage: int) -> float:
    """Micro-batch passes (of one chunk each) a stage holds at its peak."""
    if vp == 1:
        return float(min(pp - stage, micro))
    return float(min((pp - stage - 1) * 2 + (vp - 1) * pp + 1, micro * vp))
