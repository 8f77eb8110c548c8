"""Peak memory of one GPU in a training step, per pipeline stage.

- Model state, per parameter on the GPU: the bf16 weight (2 B), the fp32 main gradient the
  wgrad GEMMs accumulate into (4 B, or 2 with bf16 reduction), the quantized copies of the
  linear weights Transformer Engine caches across micro-batches (row- and column-wise, or one
  copy: `quantized_copies`), and with the distributed optimizer the master weight and Adam's
  two moments (`optimizer_bytes`: 12 B, less with the precision-aware optimizer) over the
  data-parallel ranks of that parameter (dense: DP x CP, experts: expert-DP); FSDP shards
  weights and gradients too, and holds two layers' gathered weights and gradients
  (`fsdp_buffers`). With `fp8_param_gather` the linear weights are Transformer Engine's
  quantized primary weights (`fp8_model_init`; the fp32 master copy lives in the optimizer,
  NVIDIA/TransformerEngine PR #1544): no bf16 copy of them is kept, only their quantized data.
  The embedding, the LM head and the router stay bf16.
- Activations: what each kernel keeps for its backward (a GEMM its input, in the GEMM dtype
  when quantized; fused attention Q, K, V, O; a one-in one-out kernel its input), less what the
  recipe recomputes, times the micro-batches a stage holds at once: `pp - stage` in 1F1B, the
  warm-up forwards plus one in the interleaved schedule (one chunk's layers each), DualPipe's
  device order's most (PP + 1 chunks, report Table 2).
- DualPipe (`sim.training.pipeline_kind`): a device's model state is that of the two chunks
  it holds, so DualPipe's (two stages of `pp`) is twice 1F1B's, DualPipeV's (two of 2 `pp`)
  the same.
- The largest transient: the bf16 logits of the fused cross-entropy on the device of the
  last stage.
- A fixed reserve for the CUDA context, NCCL's and the dispatcher's buffers and the caching
  allocator's fragmentation (`RESERVE_BYTES`, assumed; see its comment).

The capacity is what CUDA reports (`cuda_memory_bytes` of the topology's GPU), not the
datasheet's "GB", which are GiB.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.training.ops import ACT, DTYPE_BYTES, LayerWork
from sim.training.pipeline import schedule
from sim.training.pipeline_kind import Placement

if TYPE_CHECKING:
    from sim.training.step import StepModel

# assumed: CUDA context ~0.5 GB, NCCL channel buffers ~1 GB at these group counts, DeepEP /
# HybridEP buffers ~1-2 GB where used, and ~5% allocator fragmentation of an 80 GB GPU
# (PyTorch's caching allocator reports reserved minus allocated of this order in Megatron runs).
# Not sourced, the same on every GPU and recipe: Transformer Engine's userbuffers for TP overlap
# (`tp_comm_overlap`, a few gathered activations of the layer) are in it, and so is what
# `expandable_segments:True` (the 405B recipes' PYTORCH_CUDA_ALLOC_CONF) saves of the
# fragmentation; the driver's own share is outside the capacity (`cuda_memory_bytes`)
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
    if lw.layer >= 0 and model.index_in_stage.get(lw.layer, 0) < offloaded(model):
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


def offloaded(model: StepModel) -> int:
    """Layers whose activations the recipe offloads: the first `offload_layers` of the model
    (Transformer Engine's DefaultOffloadSynchronizer offloads layers 0..n-1 and keeps
    `(layers - n) x` one layer's activations on the GPU, `get_cpu_offload_context`), only
    without a pipeline: Megatron-Core refuses `cpu_offloading` with pipeline parallelism
    ("Currently there is no support for Pipeline parallelism with CPU offloading",
    TransformerConfig.__post_init__), so a recorded offload with PP > 1 never ran."""
    return model.r.offload_layers if model.lay.pp == 1 else 0


def quantized_copies(model: StepModel) -> int:
    """Quantized copies of a linear weight on the model's GPU (`Precision.copies`)."""
    return model.p.copies(model.gpu.fp8_any_layout)


def optimizer_bytes(model: StepModel, bf16_param: bool) -> float:
    """Bytes of optimizer state per parameter with the distributed optimizer: the fp32 master
    weight and Adam's two fp32 moments, 12 B. With the precision-aware optimizer
    (Megatron-Core `use_precision_aware_optimizer`) the moments take their configured dtypes,
    and where Transformer Engine's FusedAdam keeps the master weights (Megatron-Core's
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`: no FP8 recipe, or delayed scaling;
    megatron/core/optimizer/__init__.py passes `master_weights=True`) it keeps only the 16
    remainder bits of a bf16 parameter's fp32 master (`store_param_remainders`, True by
    default in OptimizerConfig; FusedAdam: an int16 state): 2 B. Megatron-FSDP runs without
    it (Megatron-Bridge `_set_megatron_fsdp_overrides`: "Disabling precision aware optimizer
    because it cannot work with FSDP together")."""
    r = model.r
    if not r.precision_aware_optimizer or model.lay.fsdp:
        return 12.0
    by_te = not model.p.quantized or r.fp8_recipe == "delayed"
    master = 2.0 if by_te and bf16_param else 4.0
    return master + r.exp_avg_bytes + r.exp_avg_sq_bytes


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
    copies = quantized_copies(model)
    qb = copies * DTYPE_BYTES[model.p.gemm] if model.p.quantized else 0.0
    fp8_primary = model.p.quantized and r.fp8_param_gather
    for s in range(lay.pp):
        dense = expert = plain = 0.0
        unit = 0.0  # the largest layer's gathered weights and gradients (FSDP)
        per_chunk = []
        for c in range(len(works[s])):  # chunks: vp, or DualPipe's two
            per_mb = 0.0
            for lw in works[s][c]:
                d, e = model.params(lw)
                dense, expert = dense + d, expert + e
                u = unquantized_params(lw, model)
                plain += u
                per_mb += model.saved_bytes(lw)
                if lw.layer >= 0:
                    gathered = qb * (d + e - u) + 2 * u if fp8_primary else 2 * (d + e)
                    unit = max(unit, gathered + r.grad_reduce_bytes * (d + e))
            per_chunk.append(per_mb)
        act = held_activations(per_chunk, lay.pp, lay.ga, s, model.place)
        params = dense + expert
        # bf16 weights: all of them, or only those Transformer Engine does not quantize
        weights = params
        qbytes = 0.0
        if model.p.quantized:  # quantized copies of the linear weights
            qbytes = qb * (params - plain) / (lay.fsdp or 1)
            if r.fp8_param_gather:
                weights = plain
        if lay.fsdp:
            state = (2 * weights + (r.grad_reduce_bytes + 12) * params) / lay.fsdp
        else:
            o_bf16 = optimizer_bytes(model, bf16_param=True)
            o_fp8 = optimizer_bytes(model, bf16_param=not fp8_primary)
            state = (
                2 * weights
                + r.grad_reduce_bytes * params
                + o_bf16 * plain / lay.dpcp
                + o_fp8 * ((dense - plain) / lay.dpcp + expert / lay.edp)
            )
        logits = 0.0
        if model.place.last(s):
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
        if lay.fsdp:
            # Megatron-FSDP gathers a layer's (FSDP unit's) weights and reduce-scatters its
            # gradients through two buffers of each (`fsdp_double_buffer`: FixedPoolAllocator
            # of UB_BUFFER_NUM = 2 for "fsdp_params", "fsdp_fp8_transpose_params" and
            # "fsdp_grads", megatron_fsdp/param_and_grad_buffer.py; without it the next
            # unit's all-gather is prefetched beside the current one's)
            parts["fsdp_buffers"] = 2 * unit
        rep = MemoryReport(sum(parts.values()), model.gpu.memory_bytes, s, parts)
        if best is None or rep.peak_bytes > best.peak_bytes:
            best = rep
    assert best is not None
    return best


def held_activations(
    per_chunk: list[float], pp: int, micro: int, stage: int, place: Placement | None = None
) -> float:
    """Most activation bytes a stage holds at once over its step; `per_chunk`: one
    micro-batch's kept bytes per model chunk. The stage's passes in Megatron-Core's order
    (`sim.training.pipeline.schedule`: plain 1F1B holds `pp - stage` micro-batches after its
    warm-up; the interleaved schedule `(pp - stage - 1) * 2 + (vp - 1) * pp + 1` chunk
    passes) are followed one by one, as chunks may differ (the embedding, the LM head);
    with DualPipe (`place`), its device's order (PP + 1 chunks at the first device, report
    Table 2; `sim.training.pipeline_kind`)."""
    counts = (
        place.held_counts(micro, stage)
        if place is not None and place.dual
        else _held_counts(pp, len(per_chunk), micro, stage)
    )
    return max(sum(n * b for n, b in zip(held, per_chunk)) for held in counts)


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
