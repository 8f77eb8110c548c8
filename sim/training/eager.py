"""Chains of eager PyTorch kernels that Megatron-Core runs where no fused kernel applies: bytes
and kernels of their forward and backward, from the module code at the versions the published
runs pinned (Megatron-Bridge v0.2.0 -> Megatron-LM core_dev_r0.15.0 @ 0d8e0714 with Transformer
Engine 2.9 for 25.11; v0.3.0 -> core_r0.16.0 @ b0cc2706 with TE 2.12 @ 5671fd36 for 26.02; the
code below is the same in both, and the FP8 padding also in core_v0.14.0 for 25.09) and
PyTorch's autograd formulas (FunctionsManual.cpp `clamp_backward`, `cat_tensors_backward`,
`slice_backward_wrapper`).

Each chain is memory-bound: every kernel reads its inputs from HBM and writes its output there.
Counting convention: X elements of a bf16 tensor read and written once = 4X bytes; a bool mask
is one byte per element; broadcast operands (a bias row, a per-row probability, a RoPE table of
[s, 1, 1, d]) are negligible next to the [rows, width] tensors and are not counted. Kernel
counts are the ATen kernels launched (a view, `chunk`, `narrow` or `split` launches none); the
host issues each one, so they also count as launches (`sim.training.ops.Work.launches`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Chain:
    fwd_bytes: float
    bwd_bytes: float
    fwd_kernels: int
    bwd_kernels: int


def yarn_mscale(factor: float) -> float:
    """YaRN's attention factor Megatron-Core multiplies cos and sin by
    (yarn_rotary_pos_embedding.py `_yarn_get_mscale`, `yarn_mscale` None): 0.1 ln(f) + 1."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0


def rope(elems: float, yarn_factor: float = 0.0) -> Chain:
    """Rotary embedding of q and k (`elems` = tokens x (q heads + kv heads) x head dim).

    Fused (Transformer Engine's `fused_apply_rotary_pos_emb`, what `apply_rope_fusion` selects):
    each element read and written once, twice that in the backward (one launch forward, as
    this model has always counted it).

    YaRN with mscale != 1 (GPT-OSS: factor 32, mscale 1.35): Megatron-Core's
    `rope_utils.apply_rotary_pos_emb` warns that TE's fused RoPE does not take mscale and runs
    `_apply_rotary_pos_emb_bshd`: per tensor cos/sin of the [s, 1, 1, d] table, times mscale,
    cast (6 small kernels); then t * cos (4X), `_rotate_half`: -x2 (2X, half the elements) and
    cat((-x2, x1)) (4X), times sin (4X), the sum (6X), cat((t, t_pass)) with an empty t_pass
    (a copy, 4X): 24X bytes in 6 + 6 kernels. Backward: g * cos (4X), g * sin (4X), the
    negation (2X), the chunk's cat of the halves' gradients (4X), their sum with t's (6X),
    `slice_backward` of t[..., :d] (zeros + copy, 6X) and of the empty t[..., d:] (zeros, 2X),
    the sum of the two (6X): 34X bytes in 9 kernels.
    """
    x = float(elems)
    if yarn_mscale(yarn_factor) == 1.0:
        return Chain(4.0 * x, 8.0 * x, 1, 2)
    return Chain(24.0 * x, 34.0 * x, 2 * 12, 2 * 9)  # q and k


def clamped_glu(rows: float, width: int) -> Chain:
    """GPT-OSS's clamp before its quick-GEGLU (fused_bias_geglu.py
    `weighted_bias_quick_geglu_impl`, `clamp_value` = activation_func_clamp_value 7.0), eager
    on the fc1 output [rows, 2 x width] (bf16), before the compiled activation.

    Forward: x_glu.clamp(max) and x_linear.clamp(-v, v) (a new [rows, width] tensor each, 4 B
    per element each) and torch.cat of the two (8 B per element of one half): 16 B x rows x
    width in 3 kernels, plus `torch.tensor(linear_offset, device=...)`, a host-to-device copy
    that synchronises the stream (a 4th host op). Backward (autograd, PyTorch
    `clamp_backward`): the cat's gradient is two narrows; clamp(max): scalar_tensor(0) fill,
    `self <= max` (2 B read, 1 B mask) and `where` (mask 1 + grad 2 read, 2 written) = 8 B;
    clamp(min, max): fill, >=, <= (3 B each), logical_and_ (3 B), where (5 B) = 14 B; the
    chunk's backward concatenates the two gradients (8 B): 30 B x rows x width in 9 kernels.
    """
    nf = float(rows) * width
    return Chain(16.0 * nf, 30.0 * nf, 4, 9)


def expert_bias(rows: float, hidden: int, local: int, probs_bytes: int) -> Chain:
    """The experts' fc2 bias, added after the grouped GEMM weighted by each row's routing
    probability (experts.py `TEGroupedMLP._apply_bias`: fc2 is built with skip_bias_add, and
    per local expert `t + b * p` over torch.split of the rows, then torch.cat and `.to` the
    activation dtype). `probs_bytes`: the probabilities' dtype (the router's with the
    all-to-all dispatcher; fp32 after DeepEP / HybridEP), which the products take.

    bf16 probabilities (r = 2): b * p writes 2 B, the sum reads 4 and writes 2, the cat reads
    2 and writes 2: 12 B x rows x hidden in 2 kernels per expert + 1. Backward: the cat's and
    the sum's gradients are views; the product's: g * p and its sum over rows (bias gradient,
    6 B), g * b and its sum over the hidden dimension (probability gradient, 6 B), and the
    bias gradient's accumulation into its main_grad: 12 B in 5 kernels per expert.
    fp32 probabilities (r = 4): products and sums in fp32 (4 + 10 + 8 B) and the final cast
    (6 B): 28 B; backward the cast back (6 B), the gradient of t cast to bf16 (6 B), both
    products and sums in fp32 (24 B): 36 B in 1 + 7 kernels per expert.
    """
    nh = float(rows) * hidden
    if probs_bytes <= 2:
        return Chain(12.0 * nh, 12.0 * nh, 2 * local + 1, 5 * local)
    return Chain(28.0 * nh, 36.0 * nh, 2 * local + 2, 7 * local + 1)


def proj_bias(tokens: float, hidden: int) -> Chain:
    """The attention output projection's bias: Megatron-Core builds linear_proj with
    skip_bias_add and adds the bias in the unfused bias-dropout-add
    (fused_bias_dropout.py `_bias_dropout_add_func`, bias_dropout_fusion off; dropout 0 is a
    no-op): x + bias (4 B per element) before the residual sum. Backward: the bias gradient is
    a sum over the tokens (2 B) and its main_grad accumulation."""
    th = float(tokens) * hidden
    return Chain(4.0 * th, 2.0 * th, 1, 2)


def fp8_padding(rows: float, hidden: int) -> Chain:
    """Quantized grouped GEMMs need each expert's rows a multiple of 16 (32 for MXFP8 and
    NVFP4): TEGroupedMLP pads its input and probabilities (TE `Fp8Padding`,
    `fused_multi_row_padding`) and unpads its output (`Fp8Unpadding`) unless every count is
    already aligned, which force-balanced random routing almost never gives. Forward: the
    [rows, hidden] bf16 input copied (4 B), the probabilities (negligible), the output copied
    back (4 B): 8 B x rows x hidden in 3 kernels; backward the same copies of the gradients."""
    nh = float(rows) * hidden
    return Chain(8.0 * nh, 8.0 * nh, 3, 3)
