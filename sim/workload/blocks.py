"""Transformer models of N blocks, MoE every k-th block: sizes, presets and the forward ops of
one block (the backward and the task graph are built in `sim.strategies.model`).

A block is pre-norm (GPT-2): x -> LN1 -> attention (QKV projection, scores, softmax, context,
output projection; or one fused FlashAttention-style kernel) -> +x -> LN2 -> FFN -> +.
The FFN is dense (`ffn_hidden` units) or the MoE layer of the run config (`model:` fields,
built by the run's strategy unchanged), plus `shared` always-on experts of the expert size
(DeepSeek-MoE). Block i (0-based) is MoE when i >= first_dense and
(i - first_dense + 1) % moe_every == 0: `moe_every: 2` gives GShard/Lancet's every other
block (1, 3, 5, ...), `first_dense: 3, moe_every: 1` DeepSeek-V3's layout.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError

# Presets: `model: {preset: NAME}` fills the model fields and `blocks:`; fields given next to
# the preset win. Every number's source is beside it.
PRESETS: dict[str, dict[str, Any]] = {
    # Lancet (MLSys'24) Sec. 6: GPT-2 from HF transformers with every other block's FFN an
    # MoE layer; 12 blocks of hidden size 768, sequence 512, two experts per GPU, batch 24
    # per GPU on A100 (16 on V100). Heads 12 and FFN 4*768: GPT-2 small's own config.
    # Switch gate (Lancet's main setting) routes top-1; capacity factor 1.0: assumed.
    "gpt2-s-moe": {
        "batch": 24,
        "seq_len": 512,
        "model_dim": 768,
        "hidden_dim": 3072,
        "experts_per_gpu": 2,
        "top_k": 1,
        "capacity_factor": 1.0,
        "dtype": "fp16",  # assumed: mixed precision on V100/A100
        "blocks": {"n": 12, "moe_every": 2, "heads": 12, "ffn_hidden": 3072},
    },
    # Lancet Sec. 6: 24 blocks of hidden size 1024, batch 48 per GPU on A100 (8 on V100).
    # Heads 16 and FFN 4*1024: GPT-2 medium's config (24 x 1024); the rest as above.
    "gpt2-l-moe": {
        "batch": 48,
        "seq_len": 512,
        "model_dim": 1024,
        "hidden_dim": 4096,
        "experts_per_gpu": 2,
        "top_k": 1,
        "capacity_factor": 1.0,
        "dtype": "fp16",
        "blocks": {"n": 24, "moe_every": 2, "heads": 16, "ffn_hidden": 4096},
    },
    # DeepSeek-V3 technical report (arXiv 2412.19437) Sec. 4.2: 61 blocks, hidden 7168, 128
    # heads, the first 3 FFNs dense, the others MoE with 1 shared + 256 routed experts of
    # hidden 2048, 8 routed per token; sequence 4K in pre-training. Dense FFN 18432: the
    # released config's intermediate_size. MLA (Sec. 4.2): 128 heads of 128 dims, KV
    # compression 512, query compression 1536, decoupled RoPE key / query 64 per head
    # (config.json: kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
    # v_head_dim): 187.1M attention weights per block.
    # Batch 1 sequence per GPU, capacity factor 1.0 (V3 drops no tokens: uniform routing
    # fills every slot) and bf16 GEMMs (V3 uses FP8 for most GEMMs): assumed.
    "deepseek-v3": {
        "batch": 1,
        "seq_len": 4096,
        "model_dim": 7168,
        "hidden_dim": 2048,
        "experts": 256,
        "top_k": 8,
        "capacity_factor": 1.0,
        "dtype": "bf16",
        "blocks": {
            "n": 61,
            "first_dense": 3,
            "moe_every": 1,
            "heads": 128,
            "ffn_hidden": 18432,
            "shared": 1,
            "flash": True,
            "mla": {
                "q_lora_rank": 1536,
                "kv_lora_rank": 512,
                "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64,
                "v_head_dim": 128,
            },
        },
    },
    # Qwen3 technical report (arXiv 2505.09388) Table 2: Qwen3-235B-A22B, 94 blocks, 64 query
    # and 4 key / value heads (grouped-query attention), 128 experts with 8 activated, no
    # shared expert; released config.json: hidden_size 4096, head_dim 128,
    # moe_intermediate_size 1536, every block MoE. Sequence 4096, batch 1, capacity factor
    # 1.0 and bf16: assumed, as for deepseek-v3. Both presets' experts are two-matrix FFNs of
    # the expert width; their SwiGLU's third matrix (1/3 of the expert FLOPs) is not modelled.
    "qwen3-235b-a22b": {
        "batch": 1,
        "seq_len": 4096,
        "model_dim": 4096,
        "hidden_dim": 1536,
        "experts": 128,
        "top_k": 8,
        "capacity_factor": 1.0,
        "dtype": "bf16",
        "blocks": {
            "n": 94,
            "moe_every": 1,
            "heads": 64,
            "kv_heads": 4,
            "head_dim": 128,
            "flash": True,
        },
    },
}

_EXPERT_FIELDS = ("experts", "experts_per_gpu")


def expand_preset(model: dict[str, Any], source: str = "model") -> dict[str, Any]:
    """A config's `model:` with its `preset` replaced by the preset's fields (those given
    explicitly win; `blocks:` entries are merged one by one)."""
    if not isinstance(model, dict) or "preset" not in model:
        return model
    name = model["preset"]
    if name not in PRESETS:
        raise ConfigError(f"{source}.preset: unknown preset {name!r} (known: {sorted(PRESETS)})")
    out = copy.deepcopy(PRESETS[name])
    given = {k: v for k, v in model.items() if k != "preset"}
    if any(k in given for k in _EXPERT_FIELDS):  # one way of counting experts, the user's
        for k in _EXPERT_FIELDS:
            out.pop(k, None)
    blocks = given.pop("blocks", None)
    out.update(given)
    if isinstance(blocks, dict):
        out["blocks"] = {**out["blocks"], **blocks}
    elif blocks is not None:
        out["blocks"] = blocks
    return out


@dataclass(frozen=True)
class MLA:
    """DeepSeek's multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): the
    queries through a rank-`q_lora_rank` bottleneck (None: one direct projection), keys and
    values from one shared rank-`kv_lora_rank` latent, each normalised (RMSNorm) before its up
    projection, and one RoPE key part of `qk_rope_head_dim` shared by every head. A head
    attends over qk_nope + qk_rope dims and returns `v_head_dim`. Field names are the
    Hugging Face config's. RoPE's rotation itself is not modelled (elementwise, small)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def parse(cls, raw: Any, where: str) -> MLA | None:
        """From a mapping of the fields (None: standard attention), or a one-line error."""
        if raw is None or isinstance(raw, MLA):
            return raw
        if not isinstance(raw, dict):
            fields = ", ".join(_MLA_FIELDS)
            raise ConfigError(f"{where}: expected a mapping of {fields}, got {raw!r}")
        unknown = sorted(set(raw) - set(_MLA_FIELDS))
        missing = sorted(set(_MLA_FIELDS) - set(raw) - {"q_lora_rank"})
        if unknown or missing:
            what = f"unknown field(s) {unknown}" if unknown else f"missing field(s) {missing}"
            raise ConfigError(f"{where}: {what} (fields: {', '.join(_MLA_FIELDS)})")
        for k, v in raw.items():
            low = 0 if k == "qk_rope_head_dim" else 1
            if not (v is None and k == "q_lora_rank") and (
                isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_MLA_DIM
            ):
                raise ConfigError(
                    f"{where}.{k}: expected an integer in [{low}, {MAX_MLA_DIM}], got {v!r}"
                )
        return cls(**raw)


_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MAX_MLA_DIM = 1 << 20


@dataclass(frozen=True)
class BlockModel:
    """The transformer around the MoE layers; `dp` the data-parallel replicas the non-expert
    and expert gradients are reduced over (from the parallel layout)."""

    n: int
    heads: int
    moe_every: int = 2
    first_dense: int = 0
    ffn_hidden: int | None = None  # dense FFN units; None: 4 x model_dim (GPT-2)
    shared: int = 0  # shared experts of the expert size on every token (DeepSeek-MoE)
    flash: bool = False  # one fused attention kernel instead of scores/softmax/context
    mla: MLA | None = None  # DeepSeek's latent attention; None: standard multi-head
    kv_heads: int | None = None  # key / value heads (grouped-query attention); None: heads
    head_dim: int | None = None  # dims per head; None: model_dim / heads
    dp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.mla, dict):  # a preset's or a config's mapping
            object.__setattr__(self, "mla", MLA.parse(self.mla, "model.blocks.mla"))

    def is_moe(self, i: int) -> bool:
        return i >= self.first_dense and (i - self.first_dense + 1) % self.moe_every == 0

    @property
    def moe_blocks(self) -> list[int]:
        return [i for i in range(self.n) if self.is_moe(i)]

    @classmethod
    def from_spec(cls, spec: dict[str, Any], model_dim: int, dp: int = 1) -> BlockModel:
        b = cls(dp=dp, **spec)
        check_heads(model_dim, b.heads, b.kv_heads, b.head_dim, b.mla, "model.blocks")
        if b.first_dense > b.n:
            raise ConfigError(f"model.blocks.first_dense: {b.first_dense} exceeds the {b.n} blocks")
        return b


def check_heads(
    M: int, heads: int, kv_heads: int | None, head_dim: int | None, mla: MLA | None, where: str
) -> None:
    """One-line errors for attention shapes the ops cannot take."""
    if mla is None and head_dim is None and M % heads:
        raise ConfigError(
            f"{where}.heads: {heads} heads must divide model_dim {M} (or give head_dim)"
        )
    for key, v in (("kv_heads", kv_heads), ("head_dim", head_dim)):
        if mla is not None and v is not None:
            raise ConfigError(f"{where}.{key}: MLA sets its own head dims; give one or the other")
    if kv_heads is not None and heads % kv_heads:
        raise ConfigError(f"{where}.kv_heads: expected a divisor of heads {heads}, got {kv_heads}")


@dataclass(frozen=True)
class Op:
    """One forward operator of a block on one GPU. `params`: weight elements it owns (their
    gradient is reduced over the data-parallel group); GEMMs have a `shape`, batched
    activation-by-activation GEMMs (attention) none of weights. `saved`: bytes of
    activations it keeps for its backward (None: half its traffic, i.e. the input of a
    one-in one-out op such as a layer norm or an activation function)."""

    name: str
    kind: str
    flops: float
    bytes: float
    shape: dict[str, int] | None = None
    params: int = 0
    saved: float | None = None

    @property
    def kept(self) -> float:
        return self.bytes / 2 if self.saved is None else self.saved


def kept_bytes(ops: list[Op]) -> float:
    """Bytes of activations a sequence of operators keeps for its backward."""
    return float(sum(op.kept for op in ops))


def gemm(name: str, b: int, m: int, n: int, k: int, e: float, params: int = 0) -> Op:
    """y[b, m, n] = x[b, m, k] @ w[b, k, n]: 2bmnk flops, each operand read or written once.
    Its backward keeps x for the weight gradient, or both operands when w is an activation
    (attention's scores and context)."""
    return Op(
        name,
        "gemm",
        2.0 * b * m * n * k,
        float(e * b * (m * k + k * n + m * n)),
        {"batch": b, "m": m, "n": n, "k": k},
        params,
        float(e * b * (m * k if params else m * k + k * n)),
    )


def attention_ops(
    B: int,
    L: int,
    M: int,
    heads: int,
    e: float,
    flash: bool,
    mla: MLA | None = None,
    *,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> list[Op]:
    """LN1 .. output projection of one block's attention sublayer (without the residual):
    multi-head attention of `heads` query heads of `head_dim` dims (None: M / heads) and
    `kv_heads` key / value heads (None: as many; fewer: grouped-query attention, each shared
    by heads / kv_heads query heads), or DeepSeek's MLA (its own dims)."""
    T = B * L
    ln1 = Op("ln1", "layernorm", 8.0 * T * M, float(2 * e * T * M), params=2 * M)
    kv = heads
    if mla is None:
        d, kv = head_dim or M // heads, kv_heads or heads
        width = (heads + 2 * kv) * d  # Q, K, V side by side
        proj: list[Op] = [gemm("qkv", 1, T, width, M, e, params=M * width + width)]
        dq = dv = d
    else:
        proj = _mla_projections(T, M, heads, e, mla)
        dq, dv = mla.qk_head_dim, mla.v_head_dim
    ops = [ln1, *proj]
    if flash:
        # two GEMMs per head (QK^T, PV) in one kernel that never writes the L x L scores:
        # reads Q, K, V and writes O (causal masking is not skipped: an upper bound)
        # its backward keeps Q, K, V and O (and recomputes the scores)
        qkvo = float(e * T * (heads + kv) * (dq + dv))
        ops.append(Op("attn", "attention", 2.0 * B * heads * L * L * (dq + dv), qkvo, saved=qkvo))
    else:
        ops += [
            gemm("scores", B * heads, L, L, dq, e),
            Op("softmax", "softmax", 5.0 * B * heads * L * L, float(2 * e * B * heads * L * L)),
            gemm("context", B * heads, L, dv, L, e),
        ]
    if mla is None:
        ops.append(gemm("proj", 1, T, M, heads * dv, e, params=heads * dv * M + M))
    else:  # DeepSeek's projections carry no biases
        ops.append(gemm("proj", 1, T, M, heads * dv, e, params=heads * dv * M))
    return ops


def _mla_projections(T: int, M: int, heads: int, e: float, a: MLA) -> list[Op]:
    """MLA's query and key/value projections: down, RMSNorm, up (the latent's RoPE part
    goes straight to the keys)."""

    def norm(name: str, d: int) -> Op:  # RMSNorm: weight only
        return Op(name, "layernorm", 6.0 * T * d, float(2 * e * T * d), params=d)

    hq, r, c = heads * a.qk_head_dim, a.qk_rope_head_dim, a.kv_lora_rank
    if a.q_lora_rank is None:
        q = [gemm("q", 1, T, hq, M, e, params=M * hq)]
    else:
        ql = a.q_lora_rank
        q = [
            gemm("q_a", 1, T, ql, M, e, params=M * ql),
            norm("q_norm", ql),
            gemm("q_b", 1, T, hq, ql, e, params=ql * hq),
        ]
    hkv = heads * (a.qk_nope_head_dim + a.v_head_dim)
    kv = [
        gemm("kv_a", 1, T, c + r, M, e, params=M * (c + r)),
        norm("kv_norm", c),
        gemm("kv_b", 1, T, hkv, c, e, params=c * hkv),
    ]
    return q + kv


def residual(name: str, T: int, M: int, e: float) -> Op:
    """x + f(x): two reads and a write of T x M; its backward keeps nothing (an add)."""
    return Op(name, "elementwise", float(T * M), float(3 * e * T * M), saved=0.0)


def dense_ffn_ops(prefix: str, T: int, M: int, F: int, e: float) -> list[Op]:
    """fc1 -> GELU -> fc2 with F hidden units (`prefix` names a shared expert's)."""
    return [
        gemm(f"{prefix}fc1", 1, T, F, M, e, params=M * F + F),
        Op(f"{prefix}gelu", "elementwise", 8.0 * T * F, float(2 * e * T * F)),
        gemm(f"{prefix}fc2", 1, T, M, F, e, params=F * M + M),
    ]


def expert_params(model_dim: int, hidden_dim: int, local_experts: int) -> int:
    """Weights and biases of a GPU's experts (fc1 and fc2)."""
    return local_experts * (2 * model_dim * hidden_dim + hidden_dim + model_dim)
