"""The schema of a run config's `model:` section (pydantic): the MoE layer's sizes, its
routing and the transformer blocks around it (`sim.workload.moe`, `sim.workload.blocks`).
`sim.config.run_schema.RunSpec` holds it; a preset (`{preset: NAME}`) is expanded before it is
checked."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from sim.core.graph_schema import DTYPES
from sim.core.schema import Strict

Dtype = Literal[DTYPES]  # type: ignore[valid-type]
MAX_CAPACITY_FACTOR = 1e4  # beyond this C is the whole batch anyway
MAX_TOKENS_ENTRY = 2.0**53  # a routing matrix entry (tokens); exact as a float, safe as int64
# Layer sizes: far past any model, small enough that products of them stay exact integers
MAX_DIM = 2**24  # model_dim, hidden_dim, seq_len
MAX_BATCH = 2**20
MAX_EXPERTS = 2**20
Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]


class RoutingSpec(Strict):
    """`{kind: uniform}`, `{kind: zipf, s, seed}` or `{kind: matrix, tokens | file}`; a bare
    string is its kind."""

    kind: Literal["uniform", "zipf", "matrix"] = Field(
        description="uniform: every (GPU, expert) capacity slot full, the padded buffer "
        "exchanged; zipf: a seeded Zipf(s) popularity over experts, only routed tokens move "
        "(all-to-allv); matrix: the tokens each GPU sends to each expert, given"
    )
    s: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = Field(
        None, description="zipf: the exponent (0: equal popularity; larger: more skew); default 1.2"
    )
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = Field(
        None, description="zipf: seed of the popularity order and the draws; default 0"
    )
    tokens: list[list[Annotated[float, Field(ge=0, le=MAX_TOKENS_ENTRY)]]] | None = Field(
        None,
        description="matrix: tokens[p][e], the tokens GPU p routes to expert e (GPUs x "
        "experts), capped at the capacity",
    )
    file: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="matrix: a CSV, .npy or JSON file holding that matrix (e.g. counts taken "
        "from a trace)",
    )

    @model_validator(mode="after")
    def _fields_of_kind(self) -> RoutingSpec:
        allowed = {"uniform": set(), "zipf": {"s", "seed"}, "matrix": {"tokens", "file"}}
        given = {k for k in ("s", "seed", "tokens", "file") if getattr(self, k) is not None}
        extra = sorted(given - allowed[self.kind])
        if extra:
            raise ValueError(f"{extra} do not apply to routing kind {self.kind!r}")
        if self.kind == "matrix" and len(given) != 1:
            raise ValueError("a matrix needs exactly one of 'tokens' or 'file'")
        return self


def _kind_only(v: Any) -> Any:
    return {"kind": v} if isinstance(v, str) else v


class MLASpec(Strict):
    """`model.blocks.mla`: DeepSeek's multi-head latent attention (`sim.workload.blocks.MLA`;
    the Hugging Face config's field names)."""

    kv_lora_rank: Dim = Field(
        description="rank of the latent shared by keys and values (DeepSeek-V3: 512)"
    )
    qk_nope_head_dim: Dim = Field(
        description="query / key dims per head without rotary embedding (DeepSeek-V3: 128)"
    )
    qk_rope_head_dim: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        description="query / key dims per head with rotary embedding; the RoPE key part is "
        "shared by every head (DeepSeek-V3: 64)"
    )
    v_head_dim: Dim = Field(
        description="value dims per head, what a head returns (DeepSeek-V3: 128)"
    )
    q_lora_rank: Dim | None = Field(
        None,
        description="rank of the query bottleneck (DeepSeek-V3: 1536); omitted: one direct "
        "query projection",
    )


class BlocksSpec(Strict):
    """`model.blocks`: a transformer of `n` blocks around the MoE layers
    (`sim.workload.blocks`)."""

    n: Annotated[int, Field(gt=0, le=4096)] = Field(description="transformer blocks")
    heads: Annotated[int, Field(gt=0, le=MAX_DIM)] = Field(description="attention (query) heads")
    moe_every: Annotated[int, Field(gt=0, le=4096)] = Field(
        2,
        description="block i (from 0) is MoE when i >= first_dense and (i - first_dense + 1) "
        "is a multiple of this: 2 makes blocks 1, 3, 5, ... MoE",
    )
    first_dense: Annotated[int, Field(ge=0, le=4096)] = Field(
        0, description="leading blocks whose FFN is dense (DeepSeek-V3: 3)"
    )
    ffn_hidden: Dim | None = Field(
        None, description="units of a dense block's FFN; default 4 x model_dim (GPT-2)"
    )
    shared: Annotated[int, Field(ge=0, le=1024)] = Field(
        0,
        description="shared experts of the expert size that every token also passes (DeepSeek-MoE)",
    )
    flash: bool = Field(
        False,
        description="one fused attention kernel (FlashAttention-style) instead of separate "
        "scores, softmax and context",
    )
    mla: MLASpec | None = Field(
        None,
        description="DeepSeek's multi-head latent attention; omitted: multi-head (or "
        "grouped-query) attention",
    )
    kv_heads: Annotated[int, Field(gt=0, le=MAX_DIM)] | None = Field(
        None,
        description="key / value heads, a divisor of heads (grouped-query attention); "
        "default: heads",
    )
    head_dim: Dim | None = Field(None, description="dims per head; default model_dim / heads")


def model_preset(v: Any) -> Any:
    """`model:` with its `{preset: NAME}` expanded (a ValueError naming an unknown preset)."""
    from sim.workload.blocks import PRESETS, expand_preset

    if isinstance(v, dict) and "preset" in v and v["preset"] not in PRESETS:
        raise ValueError(f"preset: unknown preset {v['preset']!r} (known: {sorted(PRESETS)})")
    return expand_preset(v)


class ModelSpec(Strict):
    batch: Annotated[int, Field(gt=0, le=MAX_BATCH)] = Field(description="B: sequences per GPU")
    seq_len: Dim = Field(description="L: tokens per sequence")
    model_dim: Dim = Field(description="M: the model dimension, a token's activation width")
    hidden_dim: Dim = Field(description="H: the hidden dimension of each expert's FFN")
    experts: Annotated[int, Field(gt=0, le=MAX_EXPERTS)] | None = Field(
        None, description="E: experts in total (give this or experts_per_gpu)"
    )
    experts_per_gpu: Annotated[int, Field(gt=0, le=MAX_EXPERTS)] | None = Field(
        None,
        description="E/P: experts per GPU of the expert-parallel group (give this or experts)",
    )
    top_k: Annotated[int, Field(gt=0, le=1024)] = Field(
        1, description="k: experts each token is routed to"
    )
    capacity_factor: Annotated[float, Field(gt=0, le=MAX_CAPACITY_FACTOR)] = Field(
        1.0,
        description="f: each expert takes at most C = ceil(k * f * B * L / E) tokens from each "
        "GPU; the rest are dropped",
    )
    dtype: Dtype = Field(
        "bf16",
        description="element type of the layer's tensors: its bytes per element and the GPU's "
        "peak FLOP/s for it",
    )
    routing: Annotated[RoutingSpec, BeforeValidator(_kind_only)] | None = Field(
        None,
        description="which tokens go to which expert: {kind: uniform} (the default), {kind: "
        "zipf, s, seed} or {kind: matrix, tokens | file}; a bare string is the kind",
    )
    blocks: BlocksSpec | None = Field(
        None,
        description="a transformer of n blocks around the MoE layers (sim.workload.blocks); "
        "omitted: one MoE layer",
    )

    @model_validator(mode="after")
    def _experts_once(self) -> ModelSpec:
        if (self.experts is None) == (self.experts_per_gpu is None):
            raise ValueError("give 'experts' (in total) or 'experts_per_gpu', exactly one")
        return self
