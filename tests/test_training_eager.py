"""Eager kernel chains of Megatron-Core layers (`sim.training.eager`) in closed form, and where
`sim.training.ops` puts them: GPT-OSS's clamped GLU, expert fc2 bias and YaRN RoPE, the
attention projection's bias, Transformer Engine's FP8 padding of grouped GEMM inputs, and the
router in the model provider's dtype."""

from __future__ import annotations

import math

import pytest

from sim.training import eager
from sim.training.layout import Layout
from sim.training.ops import ACT, Work
from sim.training.recipe import Recipe
from tests.test_training_memory import _model

LAY = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)


def test_the_clamp_chain_moves_16_bytes_forward_and_30_backward_per_element() -> None:
    """Forward: two clamps of a [rows, F] half (read 2 B, write 2 B each) and their cat (read
    4, write 4 per row-element of one half) = 16 B; backward (PyTorch clamp_backward): 8 B
    (le + where) + 14 B (ge, le, logical_and_, where) + the chunk's cat 8 B = 30 B."""
    rows, width = 16384 * 4, 2880
    c = eager.clamped_glu(rows, width)
    nf = rows * width
    assert c.fwd_bytes == pytest.approx((2 * (2 + 2) + (4 + 4)) * nf) == 16 * nf
    assert c.bwd_bytes == pytest.approx((3 + 5 + (3 + 3 + 3 + 5) + 8) * nf) == 30 * nf
    # 2 clamps + cat + the linear_offset H2D copy; fill+le+where, fill+ge+le+and+where, cat
    assert (c.fwd_kernels, c.bwd_kernels) == (4, 9)


@pytest.mark.parametrize("local", [1, 2, 16])
def test_the_expert_bias_chain_in_bf16_and_fp32(local: int) -> None:
    """t + b * p per local expert, then cat: bf16 probabilities 12 B per element each way;
    fp32 ones 28 B forward (fp32 products, cat, cast back) and 36 B backward."""
    rows, h = 65536.0, 2880
    bf = eager.expert_bias(rows, h, local, 2)
    assert bf.fwd_bytes == pytest.approx((2 + (4 + 2) + (2 + 2)) * rows * h)
    assert bf.bwd_bytes == pytest.approx(((2 + 2 + 2) + (2 + 2 + 2)) * rows * h)
    assert (bf.fwd_kernels, bf.bwd_kernels) == (2 * local + 1, 5 * local)
    f32 = eager.expert_bias(rows, h, local, 4)
    assert f32.fwd_bytes == pytest.approx((4 + (2 + 4 + 4) + (4 + 4) + (4 + 2)) * rows * h)
    assert f32.bwd_bytes == pytest.approx((6 + 6 + 12 + 12) * rows * h)
    assert (f32.fwd_kernels, f32.bwd_kernels) == (2 * local + 2, 7 * local + 1)


def test_yarn_rope_is_unfused_and_plain_rope_is_one_fused_pass() -> None:
    """mscale = 0.1 ln(32) + 1 = 1.3466 is not 1, so Megatron-Core runs the eager RoPE: 24 B
    per element forward, 34 B backward; plain RoPE keeps TE's fused kernel (4 B, 8 B)."""
    assert eager.yarn_mscale(32.0) == pytest.approx(0.1 * math.log(32.0) + 1.0)
    assert eager.yarn_mscale(1.0) == eager.yarn_mscale(0.0) == 1.0
    x = 4096 * (64 + 8) * 64.0
    yarn = eager.rope(x, 32.0)
    assert yarn.fwd_bytes == pytest.approx((4 + 2 + 4 + 4 + 6 + 4) * x)
    assert yarn.bwd_bytes == pytest.approx((4 + 4 + 2 + 4 + 6 + 6 + 2 + 6) * x)
    assert (yarn.fwd_kernels, yarn.bwd_kernels) == (24, 18)
    plain = eager.rope(x)
    assert (plain.fwd_bytes, plain.bwd_bytes, plain.fwd_kernels) == (4 * x, 8 * x, 1)


def test_fp8_padding_copies_input_and_output_each_way() -> None:
    c = eager.fp8_padding(1000.0, 2048)
    assert c.fwd_bytes == c.bwd_bytes == pytest.approx(8 * 1000 * 2048)


def test_a_gpt_oss_layer_runs_its_eager_chains_where_megatron_core_does() -> None:
    """Tokens T = mbs x seq, routed rows T x top_k: the clamp sits between fc1 and the
    activation (recomputed with it), the probability-weighted fc2 bias after fc2, the
    projection bias after the projection; the router and its probabilities are bf16."""
    m = _model("gpt-oss-120b", LAY, "BF16", Recipe())
    a, lw = m.a, m.layer_work(1)
    by = {w.name: w for w in lw.work}
    names = [w.name for w in lw.work]
    T = LAY.mbs * LAY.seq
    routed, F, h = T * a.top_k, a.moe_ffn, a.hidden
    assert names.index("expert.fc1") < names.index("expert.clamp") < names.index("expert.act")
    assert names.index("expert.fc2") + 1 == names.index("expert.fc2.bias")
    assert names.index("proj") + 1 == names.index("proj.bias")
    clamp = by["expert.clamp"]
    assert clamp.module == "moe_act" and clamp.kind == "memory"
    assert clamp.bytes == pytest.approx(16 * routed * F)
    assert clamp.bytes * clamp.bwd == pytest.approx(30 * routed * F)
    assert m.gpu.launches(clamp, backward=True) == 9
    bias = by["expert.fc2.bias"]
    local = a.experts // LAY.ep
    assert bias.bytes == pytest.approx(12 * routed * h)
    assert m.gpu.launches(bias) == 2 * local + 1
    assert m.gpu.launches(bias, backward=True) == 5 * local
    assert by["rope"].bytes == pytest.approx(24 * T * (a.heads + a.kv_heads) * a.qk_dim)
    assert by["proj.bias"].bytes == pytest.approx(2 * ACT * T * h)
    assert by["router"].dtype == "bf16"
    assert by["router"].bytes == pytest.approx(2 * (T * h + h * a.experts + T * a.experts))


def test_models_without_those_features_keep_their_kernels() -> None:
    """Qwen3-30B-A3B: no clamp, no biases, TE's fused RoPE; DeepSeek-V3's router stays fp32."""
    m = _model("qwen3-30b-a3b", LAY, "BF16", Recipe())
    a, by = m.a, {w.name: w for w in m.layer_work(0).work}
    T = LAY.mbs * LAY.seq
    assert not {"expert.clamp", "expert.fc2.bias", "proj.bias", "expert.fp8_pad"} & set(by)
    assert by["rope"].bytes == pytest.approx(2 * ACT * T * (a.heads + a.kv_heads) * a.qk_dim)
    assert m.gpu.launches(by["rope"], backward=True) == 2
    ds = _model(
        "deepseek-v3", Layout(gpus=64, tp=1, pp=1, ep=64, gbs=64, seq=4096), "BF16", Recipe()
    )
    assert {w.name: w for w in ds.layer_work(5).work}["router"].dtype == "fp32"


@pytest.mark.parametrize(
    "dispatcher,drop,probs_fp32,pad",
    [
        ("alltoall", False, False, True),
        ("deepep", False, True, True),
        ("hybridep", False, True, False),  # HybridEP pads in its dispatch (pad_multiple)
        ("alltoall", True, False, False),  # capacity-padded routing: static, aligned splits
    ],
)
def test_the_dispatcher_decides_fp8_padding_and_probability_dtype(
    dispatcher: str, drop: bool, probs_fp32: bool, pad: bool
) -> None:
    r = Recipe(dispatcher=dispatcher, notes={"moe_token_drop": drop})
    m = _model("qwen3-30b-a3b", LAY, "FP8-CS", r)
    assert m.dispatch[1:] == (probs_fp32, pad)
    by = {w.name: w for w in m.layer_work(0).work}
    routed = LAY.mbs * LAY.seq * m.a.top_k
    if pad:
        assert by["expert.fp8_pad"].bytes == pytest.approx(8 * routed * m.a.hidden)
    else:
        assert "expert.fp8_pad" not in by
    bf16 = _model("qwen3-30b-a3b", LAY, "BF16", r)  # unquantized GEMMs need no padding
    assert "expert.fp8_pad" not in {w.name for w in bf16.layer_work(0).work}
    oss = _model("gpt-oss-120b", LAY, "BF16", r)
    bias = {w.name: w for w in oss.layer_work(0).work}["expert.fc2.bias"]
    oss_routed = LAY.mbs * LAY.seq * oss.a.top_k
    assert bias.bytes == pytest.approx((28 if probs_fp32 else 12) * oss_routed * oss.a.hidden)


def test_backward_launches_default_to_bwd_times_forward() -> None:
    m = _model("qwen3-30b-a3b", LAY, "BF16", Recipe())
    w = Work("x", "memory", bytes=1.0, launches=3, bwd=2.0)
    assert m.gpu.launches(w, backward=True) == 6
    assert m.gpu.launches(Work("y", "memory", launches=3, bwd_launches=7), backward=True) == 7
