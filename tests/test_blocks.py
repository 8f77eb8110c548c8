"""Transformer models around the MoE layers (sim.workload.blocks, sim.strategies.model):
closed forms in the degenerate case, the dX/dW split, the gradient reductions, presets."""

from __future__ import annotations

import math

import pytest

from sim import commands
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import STRATEGIES, build, resolve_params
from sim.workload.blocks import MLA, PRESETS, BlockModel, attention_ops, expand_preset
from sim.workload.moe import MoELayer

TOPO = Topology.load("pipemoe-2080ti", nodes=1)  # 4 GPUs; links unused in collective mode
LAYER = MoELayer(batch=2, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=4, top_k=2)
FITS = {  # alpha + beta * work per kind (work: m*n*k for GEMMs, bytes otherwise)
    "gemm": (2e-5, 1e-12),
    "layernorm": (3e-6, 2e-11),
    "softmax": (4e-6, 3e-11),
    "elementwise": (1e-6, 1e-11),
    "attention": (5e-6, 4e-11),
    "gate": (2e-6, 1e-11),
    "encode": (2e-6, 1e-11),
    "decode": (2e-6, 1e-11),
}
COLL = {"all_to_all": (3e-5, 2e-10), "all_reduce": (4e-5, 3e-10)}


def alpha_beta() -> CostModel:
    return CostModel.build(
        TOPO,
        {
            "compute": "alpha_beta",
            "network": "collective",
            "alpha_beta": {k: {"alpha": a, "beta": b} for k, (a, b) in FITS.items()},
            "collectives": {k: {"alpha": a, "beta": b} for k, (a, b) in COLL.items()},
        },
    )


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("shared", [0, 1])
def test_sequential_model_is_the_sum_of_its_ops(flash, shared):
    """No overlap (sequential layer, one compute stream, collectives waiting on compute and
    compute on collectives): the step is the sum of every task's alpha-beta cost."""
    blocks = BlockModel(n=3, heads=4, moe_every=2, flash=flash, shared=shared)
    g = build("sequential", LAYER, {}, ("fwd", "bwd"), blocks=blocks)
    res = simulate(g, TOPO, alpha_beta())
    expect = 0.0
    for t in g:
        if t.rank != 0:
            continue
        if t.is_comm:
            a, b = COLL[t.kind]
            expect += a + b * t.bytes
        else:
            a, b = FITS[t.kind]
            s = t.shape
            work = s.get("batch", 1) * s["m"] * s["n"] * s["k"] if s else t.bytes
            expect += a + b * work
    assert math.isclose(res.makespan, expect, rel_tol=1e-9), (res.makespan, expect)


@pytest.mark.parametrize("flash", [False, True])
def test_dense_model_peak_is_every_blocks_kept_activations(flash):
    """A dense model on one compute stream: the forward's kept activations pile up block by
    block and all are live when the backward starts. In closed form, per block: LN1's input,
    QKV's input, the attention core's (the scores' and context's operands and the softmax
    output; or FlashAttention's Q, K, V, O), the projection's input, LN2's input, fc1's
    input, GELU's input and fc2's input (GELU's output)."""
    n, B, L, M, h, F, e = 3, 2, 64, 128, 4, 512, 2
    T = B * L
    blocks = BlockModel(n=n, heads=h, moe_every=n + 1, flash=flash, ffn_hidden=F)
    g = build("sequential", LAYER, {}, ("fwd", "bwd"), blocks=blocks)
    assert not any(t.tags.get("phase") == "fwd" and "chunk" in t.tags for t in g)  # no MoE
    res = simulate(g, TOPO, alpha_beta())
    d = M // h
    core = (
        4 * e * T * M
        if flash
        else e * B * h * L * (d + d) + e * B * h * L * L + e * B * h * (L * L + L * d)
    )
    per_block = e * T * M * 4 + core + e * T * M + 2 * e * T * F
    assert res.mem_peak[0] == pytest.approx(n * per_block)
    final = {r: b for _t, r, b in res.mem_timeline}
    assert all(v == pytest.approx(0.0, abs=1e-6) for v in final.values())
    fwd = simulate(build("sequential", LAYER, {}, ("fwd",), blocks=blocks), TOPO, alpha_beta())
    assert fwd.mem_peak[0] < per_block  # a forward alone keeps nothing past its part


def test_backward_split_has_twice_the_forward_gemm_work():
    """dX and dW of every GEMM (and the experts' dgrad/wgrad) each do the forward's work."""
    blocks = BlockModel(n=4, heads=4, moe_every=2, shared=1)
    g = build("pipelined", LAYER, {"degree": 2}, ("fwd", "bwd"), blocks=blocks)
    fwd = sum(t.flops for t in g if t.kind == "gemm" and t.tags["phase"] == "fwd")
    bwd = sum(t.flops for t in g if t.kind == "gemm" and t.tags["phase"] == "bwd")
    assert bwd == pytest.approx(2 * fwd, rel=1e-12)
    roles = {t.tags.get("role") for t in g if t.tags.get("phase") == "bwd" and not t.is_comm}
    assert roles == {"dX", "dW"}
    # the weight gradients of the non-expert GEMMs: qkv, proj (4 blocks), dense fc1/fc2 (2),
    # shared fc1/fc2 (2 MoE blocks); the experts' per chunk (2 chunks x fc1/fc2 x 2 blocks)
    dw = [t.tags["step"] for t in g if t.rank == 0 and t.tags.get("role") == "dW"]
    assert len(dw) == 4 * 2 + 2 * 2 + 2 * 2 + 2 * 2 * 2
    # a weight gradient is needed only by the gradient reduction
    needed = {d for t in g for d in t.deps if t.tags.get("step") != "grad_sync"}
    own = [t.id for t in g if t.tags.get("role") == "dW" and "chunk" not in t.tags]
    assert own and not needed & set(own)


def _params(M: int, F: int, E: int, H: int, shared: int, moe: bool) -> int:
    attn = 2 * M + (3 * M * M + 3 * M) + (M * M + M) + 2 * M  # ln1, qkv, proj, ln2
    if not moe:
        return attn + (M * F + F) + (F * M + M)
    S = shared * H
    return attn + M * E + (M * S + S) + (S * M + M)


def test_gradient_reductions_have_the_weights_bytes():
    """Non-expert gradients all-reduced over the world, experts' over their replicas."""
    blocks = BlockModel(n=4, heads=4, moe_every=2, shared=1, dp=2)
    layer = LAYER
    g = build("sequential", layer, {}, ("fwd", "bwd"), blocks=blocks)
    M, H, E, e = layer.model_dim, layer.hidden_dim, layer.experts, layer.elem
    non_expert = 2 * _params(M, 4 * M, E, H, 1, False) + 2 * _params(M, 4 * M, E, H, 1, True)
    experts = 2 * (E // layer.world) * (2 * M * H + H + M)  # two MoE blocks' local experts
    sync = {t.tags["step"]: t for t in g if t.rank == 1 and t.kind == "all_reduce"}
    assert sync["grad_sync"].bytes == e * non_expert
    assert sync["expert_grad_sync"].bytes == e * experts
    # laid over 2 replicas of 4: one all-reduce over all 8 GPUs, experts' over {r, r + 4}
    from sim.workload.parallel import ParallelLayout

    lay = ParallelLayout(ep=4, dp=2)
    full = build("sequential", layer, {}, ("fwd", "bwd"), layout=lay, blocks=blocks)
    t = full.tasks["dp1/r1/grad_sync"]
    assert t.group == list(range(8)) and t.coll == "grad_sync"
    t = full.tasks["dp1/r1/expert_grad_sync"]
    assert t.group == [1, 5] and t.coll == "expert_grad_sync.1"


def test_one_replica_stands_for_all_with_gradient_reductions():
    """The symmetric run (one replica built) and the full graph give the same step."""
    raw = {
        "topology": "pipemoe-2080ti",
        "nodes": 4,
        "parallel": {"ep": 8},
        "model": {
            "batch": 1,
            "seq_len": 64,
            "model_dim": 64,
            "hidden_dim": 128,
            "experts_per_gpu": 1,
            "blocks": {"n": 2, "heads": 2},
        },
        "strategy": {"name": "pipelined", "degree": 2},
        "passes": ["fwd", "bwd"],
    }
    on = commands.simulate_config({**raw, "costs": {"symmetry": "on"}}).summary
    off = commands.simulate_config({**raw, "costs": {"symmetry": "off"}}).summary
    assert on["symmetry"]["used"] and on["symmetry"]["replicas"] == 2
    assert on["makespan_s"] == pytest.approx(off["makespan_s"], rel=1e-9)


def test_every_strategy_builds_inside_blocks():
    blocks = BlockModel(n=2, heads=4, moe_every=1, first_dense=1)
    costs = CostModel.build(TOPO, {})
    from sim.strategies import Cluster

    for name in STRATEGIES:
        params = {"tp": 2} if name == "ted" else {}
        if name == "dualpipe":  # one device (a V of 2 stages): the pipeline fits TOPO's GPUs
            params = {"variant": "dualpipev", "pp": 2}
        if name == "pipemoe":
            continue  # its selector needs alpha-beta GEMM fits; covered by its own tests
        resolve_params(name, params)
        g = build(name, LAYER, params, ("fwd", "bwd"), Cluster(TOPO, costs), blocks=blocks)
        layer_steps = {t.tags["step"] for t in g if t.tags.get("layer") == 1}
        assert {"gate", "ln1", "res2", "grad_sync"} - layer_steps == {"grad_sync"}


def test_presets_and_config():
    assert PRESETS["deepseek-v3"]["blocks"]["n"] == 61
    b = BlockModel(**PRESETS["deepseek-v3"]["blocks"])
    assert len(b.moe_blocks) == 58 and b.moe_blocks[0] == 3
    b = BlockModel(**PRESETS["gpt2-s-moe"]["blocks"])
    assert b.moe_blocks == [1, 3, 5, 7, 9, 11]
    m = expand_preset({"preset": "gpt2-l-moe", "batch": 8, "blocks": {"flash": True}})
    assert m["batch"] == 8 and m["blocks"]["n"] == 24 and m["blocks"]["flash"]
    m = expand_preset({"preset": "gpt2-l-moe", "experts": 64})
    assert "experts_per_gpu" not in m and m["experts"] == 64
    cfg = RunConfig.from_dict(
        {"topology": "p4de-a100", "nodes": 2, "model": {"preset": "gpt2-s-moe"}}
    )
    wl = cfg.workload(cfg.load_topology())
    assert wl.blocks is not None and wl.blocks.n == 12 and wl.layer.experts == 32
    with pytest.raises(ConfigError, match=r"model.*preset.*gpt3"):
        RunConfig.from_dict({"topology": "p4de-a100", "model": {"preset": "gpt3"}})
    with pytest.raises(ConfigError, match=r"model\.blocks\.layers"):
        RunConfig.from_dict(
            {"topology": "p4de-a100", "model": {"preset": "gpt2-s-moe", "blocks": {"layers": 3}}}
        )
    with pytest.raises(ConfigError, match=r"heads"):
        cfg = RunConfig.from_dict(
            {"topology": "p4de-a100", "model": {"preset": "gpt2-s-moe", "blocks": {"heads": 7}}}
        )
        cfg.workload(cfg.load_topology())


DSV3_MLA = MLA(
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
)


def test_mla_is_deepseek_v3s_attention_in_closed_form():
    """MLA (DeepSeek-V2 Sec. 2.1) on DeepSeek-V3's config: 187,105,280 projection weights per
    block (q 7168x1536 + 1536x128x192, kv 7168x576 + 512x128x256, out 128x128x7168) and two
    RMSNorms' 1536 + 512; the fused kernel's QK^T and PV over 192 and 128 dims per head."""
    B, L, M, H = 1, 4096, 7168, 128
    ops = {op.name: op for op in attention_ops(B, L, M, H, 2, True, DSV3_MLA)}
    assert list(ops) == ["ln1", "q_a", "q_norm", "q_b", "kv_a", "kv_norm", "kv_b", "attn", "proj"]
    gemms = sum(op.params for op in ops.values() if op.kind == "gemm")
    assert gemms == 187_105_280
    assert ops["q_norm"].params + ops["kv_norm"].params == 1536 + 512
    assert ops["attn"].flops == 2.0 * B * H * L * L * (192 + 128)
    assert ops["kv_b"].shape == {"batch": 1, "m": L, "n": H * 256, "k": 512}
    # no query compression (DeepSeek-V2-Lite): one direct projection
    lite = MLA(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    q = [op for op in attention_ops(B, L, 2048, 16, 2, True, lite) if op.name.startswith("q")]
    assert [op.name for op in q] == ["q"] and q[0].params == 2048 * 16 * 192
    # standard attention is the special case it was: 4 B h L^2 d flops, Q K V O traffic
    std = {op.name: op for op in attention_ops(2, 64, 128, 4, 2, True)}
    assert std["attn"].flops == 4.0 * 2 * 4 * 64 * 64 * 32
    assert std["attn"].bytes == 4 * 2 * 128 * 128
    unfused = {op.name: op for op in attention_ops(B, 256, M, H, 2, False, DSV3_MLA)}
    assert unfused["scores"].shape["k"] == 192 and unfused["context"].shape["n"] == 128


def test_mla_model_is_the_sum_of_its_ops_and_the_preset_has_it():
    blocks = BlockModel(
        n=2,
        heads=4,
        moe_every=2,
        flash=True,
        mla={
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4,
            "v_head_dim": 8,
        },
    )
    assert isinstance(blocks.mla, MLA)
    g = build("sequential", LAYER, {}, ("fwd", "bwd"), blocks=blocks)
    assert {t.tags["step"] for t in g if t.rank == 0} >= {"kv_b", "kv_b_wgrad", "q_a_dgrad"}
    res = simulate(g, TOPO, alpha_beta())
    expect = sum(
        FITS[t.kind][0]
        + FITS[t.kind][1]
        * (
            t.shape.get("batch", 1) * t.shape["m"] * t.shape["n"] * t.shape["k"]
            if t.shape
            else t.bytes
        )
        if not t.is_comm
        else COLL[t.kind][0] + COLL[t.kind][1] * t.bytes
        for t in g
        if t.rank == 0
    )
    assert math.isclose(res.makespan, expect, rel_tol=1e-9)
    cfg = RunConfig.from_dict(
        {
            "topology": "dgx-h100-superpod",
            "nodes": 8,
            "parallel": {"ep": 64},
            "model": {"preset": "deepseek-v3"},
        }
    )
    assert cfg.workload(cfg.load_topology()).blocks.mla == DSV3_MLA


@pytest.mark.parametrize(
    "mla,field",
    [
        (
            {"kv_lora_rank": 0, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8},
            "kv_lora_rank",
        ),
        ({"kv_lora_rank": 16, "qk_nope_head_dim": 8, "v_head_dim": 8}, "qk_rope_head_dim"),
        (
            {
                "kv_lora_rank": 16,
                "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 4,
                "v_head_dim": 8,
                "rope_theta": 1e4,
            },
            "rope_theta",
        ),
        ("yes", "mla"),
    ],
)
def test_bad_mla_is_a_one_line_error(mla, field):
    with pytest.raises(ConfigError, match=field) as e:
        cfg = RunConfig.from_dict(
            {"topology": "p4de-a100", "model": {"preset": "gpt2-s-moe", "blocks": {"mla": mla}}}
        )
        cfg.workload(cfg.load_topology())
    assert "\n" not in str(e.value) and "model.blocks.mla" in str(e.value)
    with pytest.raises(ConfigError, match="strategy.mla"):
        build("megatron_ep", LAYER, {"mla": mla, "micro": 1}, ("fwd", "bwd"))


def test_grouped_query_attention_in_closed_form_and_the_qwen3_preset():
    """Qwen3-235B-A22B's attention: 64 query heads of 128 dims, 4 key / value heads, at
    hidden 4096: the QKV projection is (64 + 2 x 4) x 128 = 9,216 wide, the output
    projection reads 64 x 128 = 8,192; the fused kernel's work is per query head, its
    traffic Q and O per query head, K and V per key / value head."""
    B, L, M, H, KV, d = 1, 4096, 4096, 64, 4, 128
    ops = {op.name: op for op in attention_ops(B, L, M, H, 2, True, kv_heads=KV, head_dim=d)}
    assert ops["qkv"].shape == {"batch": 1, "m": L, "n": 9216, "k": M}
    assert ops["qkv"].params == M * 9216 + 9216 and ops["proj"].params == 8192 * M + M
    assert ops["attn"].flops == 4.0 * B * H * L * L * d
    assert ops["attn"].bytes == 2 * L * (H + KV) * 2 * d
    # no GQA is the standard attention, op for op
    std = attention_ops(2, 64, 128, 4, 2, True)
    assert attention_ops(2, 64, 128, 4, 2, True, kv_heads=4, head_dim=32) == std
    cfg = RunConfig.from_dict(
        {"topology": "dgx-h100", "nodes": 16, "model": {"preset": "qwen3-235b-a22b"}}
    )
    b = cfg.workload(cfg.load_topology()).blocks
    assert (b.n, b.heads, b.kv_heads, b.head_dim, len(b.moe_blocks)) == (94, 64, 4, 128, 94)


@pytest.mark.parametrize(
    "blocks,field",
    [
        ({"kv_heads": 5}, "kv_heads: expected a divisor of heads 12"),
        ({"heads": 7}, "heads: 7 heads must divide"),
        (
            {
                "kv_heads": 4,
                "mla": {
                    "kv_lora_rank": 16,
                    "qk_nope_head_dim": 8,
                    "qk_rope_head_dim": 4,
                    "v_head_dim": 8,
                },
            },
            "MLA sets its own",
        ),
    ],
)
def test_bad_attention_shapes_are_one_line_errors(blocks, field):
    with pytest.raises(ConfigError, match=field) as e:
        cfg = RunConfig.from_dict(
            {"topology": "p4de-a100", "model": {"preset": "gpt2-s-moe", "blocks": blocks}}
        )
        cfg.workload(cfg.load_topology())
    assert "\n" not in str(e.value)
    params = {k: v for k, v in blocks.items()} | {"micro": 1}
    with pytest.raises(ConfigError, match=field.split(":")[0]):
        build("megatron_ep", LAYER, {**params, "heads": blocks.get("heads", 4)}, ("fwd", "bwd"))
