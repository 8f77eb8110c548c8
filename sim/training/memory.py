"""Peak memory of one GPU in a training step, per pipeline stage.

- Model state, per parameter on the GPU: the bf16 weight (2 B), the fp32 main gradient the
  wgrad GEMMs accumulate into (4 B, or 2 with bf16 reduction), the quantized copies of the
  linear weights Transformer Engine caches across micro-batches (row- and column-wise), and
  with the distributed optimizer the fp32 master weight and Adam's two moments (12 B) over the
  data-parallel ranks of that parameter (dense: DP x CP, experts: expert-DP); FSDP shards
  weights and gradients too. With `fp8_param_gather` the linear weights are Transformer
  Engine's quantized primary weights (`fp8_model_init`; the fp32 master copy lives in the
  optimizer, NVIDIA/TransformerEngine PR #1544): no bf16 copy of them is kept, only their
  quantized row- and column-wise data. The embedding, the LM head and the router stay bf16.
- Activations: what each kernel keeps for its backward (a GEMM its input, in the GEMM dtype
  when quantized; fused attention Q, K, V, O; a one-in one-out kernel its input), less what the
  recipe recomputes, times the micro-batches a stage holds at once: `pp - stage` in 1F1B, the
  warm-up forwards plus one in the interleaved schedule (one chunk's layers each).
- The largest transient: the bf16 logits of the fused cross-entropy on the last stage.
- A fixed reserve for the CUDA context, NCCL's and the dispatcher's buffers and the caching
  allocator's fragmentation (`RESERVE_BYTES`, assumed; see its comment).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.training.ops import ACT, DTYPE_BYTES, LayerWork
from sim.training.pipeline import schedule

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


def unquantized_params(lw: LayerWork, model: StepModel) -> float:
    """Weights of a layer work that stay bf16 whatever the precision: the embedding and the
    LM head (vocabulary split by TP), the router, MTP's projection (norms are negligible)."""
    a, tp = model.a, model.lay.tp
    names = {w.name for w in lw.work}
    n = 0.0
    if "embedding" in names:
        n += a.vocab * a.hidden / tp
    if "lm_head" in names:
        n += a.vocab * a.hidden / tp
    if "mtp.proj" in names:
        n += 2 * a.hidden * a.hidden / tp
    if "router" in names:
        n += a.hidden * a.experts
    return n


def step_memory(model: StepModel, works: list[list[list[LayerWork]]]) -> MemoryReport:
    lay, r, a = model.lay, model.r, model.a
    best: MemoryReport | None = None
    for s in range(lay.pp):
        dense = expert = plain = 0.0
        per_chunk = []
        for c in range(lay.vp):
            per_mb = 0.0
            for lw in works[s][c]:
                d, e = model.params(lw)
                dense, expert = dense + d, expert + e
                plain += unquantized_params(lw, model)
                per_mb += model.saved_bytes(lw)
            per_chunk.append(per_mb)
        act = held_activations(per_chunk, lay.pp, lay.ga, s)
        params = dense + expert
        # bf16 weights: all of them, or only those Transformer Engine does not quantize
        weights = params
        qbytes = 0.0
        if model.p.quantized:  # row- and column-wise copies of the linear weights
            linear = params - plain
            qbytes = 2 * DTYPE_BYTES[model.p.gemm] * linear / (lay.fsdp or 1)
            if r.fp8_param_gather:
                weights = plain
        if lay.fsdp:
            state = (2 * weights + (r.grad_reduce_bytes + 12) * params) / lay.fsdp
        else:
            state = (
                2 * weights
                + r.grad_reduce_bytes * params
                + 12 * (dense / lay.dpcp + expert / lay.edp)
            )
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


def held_activations(per_chunk: list[float], pp: int, micro: int, stage: int) -> float:
    """Most activation bytes a stage holds at once over its step; `per_chunk`: one
    micro-batch's kept bytes per model chunk. The stage's passes in Megatron-Core's order
    (`sim.training.pipeline.schedule`: plain 1F1B holds `pp - stage` micro-batches after its
    warm-up; the interleaved schedule `(pp - stage - 1) * 2 + (vp - 1) * pp + 1` chunk
    passes) are followed one by one, as chunks may differ (the embedding, the LM head)."""
    return max(
        sum(n * b for n, b in zip(held, per_chunk))
        for held in _held_counts(pp, len(per_chunk), micro, stage)
    )


@functools.lru_cache(maxsize=4096)
def _held_counts(pp: int, vp: int, micro: int, stage: int) -> tuple[tuple[int, ...], ...]:
    """The distinct numbers of micro-batches held per chunk after each forward of the stage
    (a peak follows a forward); cached, as a plan asks the same schedules many times."""
    held = [0] * vp
    seen: set[tuple[int, ...]] = set()
    for kind, _, chunk in schedule(pp, vp, micro, stage):
        held[chunk] += 1 if kind == "F" else -1
        if kind == "F":
            seen.add(tuple(held))
    return tuple(seen) if seen else ((0,) * vp,)
