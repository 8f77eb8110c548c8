"""The schema of a run config's `model:` section (pydantic): the MoE layer's sizes, its
routing and the transformer blocks around it (`sim.workload.moe`, `sim.workload.blocks`).
`sim.config.run_schema.RunSpec` holds it; a preset (`{preset: NAME}`) is expanded before it is
checked."""

# Annotations evaluated as the classes are made (no `from __future__ import annotations`):
# as strings, pydantic would compile and evaluate each field's at start-up (~1% of a small
# `moesim simulate`). A method returning its own class names it in quotes.

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from sim.core.kinds import DTYPES
from sim.core.schema import Strict

Dtype = Literal[DTYPES]  # type: ignore[valid-type]
MAX_CAPACITY_FACTOR = 1e4  # beyond this C is the whole batch anyway
MAX_TOKENS_ENTRY = 2.0**53  # a routing matrix entry (tokens); exact as a float, safe as int64
# Layer sizes: far past any model, small enough that products of them stay exact integers
MAX_DIM = 2**24  # model_dim, hidden_dim, seq_len
MAX_BATCH = 2**20
MAX_EXPERTS = 2**20
Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]


class ImbalanceTarget(Strict):
    """One level's imbalance in a log-normal routing: exactly one measure."""

    max_mean: Annotated[float, Field(ge=1, le=MAX_EXPERTS, allow_inf_nan=False)] | None = Field(
        None, description="the hottest load over the mean (UltraEP: 1.30-4.01 per rank)"
    )
    gini: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = Field(
        None, description="Gini coefficient of the loads (DODOCO: 0.105-0.38 per expert)"
    )
    sigma: Annotated[float, Field(ge=0, le=20, allow_inf_nan=False)] | None = Field(
        None, description="the log-normal's sigma itself"
    )

    @model_validator(mode="after")
    def _one(self) -> "ImbalanceTarget":
        if sum(v is not None for v in (self.max_mean, self.gini, self.sigma)) != 1:
            raise ValueError("give exactly one of max_mean, gini, sigma")
        return self


ROUTING_FIELDS = {
    "uniform": set(),
    "zipf": {"s", "seed"},
    "matrix": {"tokens", "file"},
    "lognormal": {"node", "gpu", "expert", "gpus_per_node", "seed", "layer", "step", "drift"},
    "imbalance": {"workload", "seed", "step"},
    "replay": {"file", "step", "layer"},
}
Index = Annotated[int, Field(ge=0, lt=2**31)]


class RoutingSpec(Strict):
    """`{kind: uniform}`, `{kind: zipf, s, seed}`, `{kind: matrix, tokens | file}`,
    `{kind: lognormal, node | gpu | expert, ...}`, `{kind: imbalance, workload, ...}` or
    `{kind: replay, file, step, layer}`; a bare string is its kind (`sim.workload.routing`)."""

    kind: Literal["uniform", "zipf", "matrix", "lognormal", "imbalance", "replay"] = Field(
        description="uniform: every (GPU, expert) capacity slot full, the padded buffer "
        "exchanged; zipf: a seeded Zipf(s) popularity over experts, only routed tokens move "
        "(all-to-allv); matrix: the tokens each GPU sends to each expert, given; lognormal: "
        "log-normal loads with a target imbalance per node, GPU and expert; imbalance: one "
        "of NVIDIA's token-imbalance workloads W0-W7; replay: a recorded router map (.npz)"
    )
    s: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = Field(
        None, description="zipf: the exponent (0: equal popularity; larger: more skew); default 1.2"
    )
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = Field(
        None, description="zipf, lognormal, imbalance: seed of the draws; default 0"
    )
    tokens: list[list[Annotated[float, Field(ge=0, le=MAX_TOKENS_ENTRY)]]] | None = Field(
        None,
        description="matrix: tokens[p][e], the tokens GPU p routes to expert e (GPUs x "
        "experts), capped at the capacity",
    )
    file: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="matrix: a CSV, .npy or JSON file holding that matrix (e.g. counts taken "
        "from a trace); replay: a router map .npz (counts [steps, layers, P, E] or choices "
        "[steps, layers, P, T, k])",
    )
    node: ImbalanceTarget | None = Field(
        None, description="lognormal: imbalance of the loads per node (of gpus_per_node GPUs)"
    )
    gpu: ImbalanceTarget | None = Field(
        None,
        description="lognormal: imbalance of the loads per GPU, among a node's GPUs when node "
        "is given, else among all GPUs",
    )
    expert: ImbalanceTarget | None = Field(
        None,
        description="lognormal: imbalance of the loads per expert, among a GPU's experts when "
        "gpu is given (a node's when only node is), else among all experts",
    )
    gpus_per_node: Annotated[int, Field(gt=0, le=MAX_EXPERTS)] | None = Field(
        None, description="lognormal: GPUs per node of the node level; default 8"
    )
    layer: Index | None = Field(
        None, description="lognormal: the layer, folded into the seed; replay: the map's layer"
    )
    step: Index | None = Field(
        None,
        description="lognormal, imbalance: the training step, folded into the seed (with "
        "drift); replay: the map's step",
    )
    drift: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="lognormal: share of the hot-expert order renewed per step (1: drawn "
        "afresh each step, the default; 0: fixed)",
    )
    workload: Literal["W0", "W1", "W2", "W3", "W4", "W5", "W6", "W7"] | None = Field(
        None, description="imbalance: the workload (NVIDIA/Megatron-LM PR #7488's W0-W7)"
    )

    @model_validator(mode="after")
    def _fields_of_kind(self) -> "RoutingSpec":
        allowed = ROUTING_FIELDS[self.kind]
        given = {k for k in self.model_fields_set if k != "kind" and getattr(self, k) is not None}
        extra = sorted(given - allowed)
        if extra:
            raise ValueError(f"{extra} do not apply to routing kind {self.kind!r}")
        if self.kind == "matrix" and len(given) != 1:
            raise ValueError("a matrix needs exactly one of 'tokens' or 'file'")
        if self.kind == "replay" and self.file is None:
            raise ValueError("a replay needs the router map's 'file'")
        if self.kind == "imbalance" and self.workload is None:
            raise ValueError("an imbalance routing needs its 'workload' (W0-W7)")
        if self.kind == "lognormal" and not given & {"node", "gpu", "expert"}:
            raise ValueError("lognormal needs a target for at least one of node, gpu, expert")
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
    dropless: bool = Field(
        False,
        description="keep every choice (Megatron-Core, DeepSpeed, DeepSeek): the capacity "
        "follows the loads, nothing is dropped, the hottest GPU sets the pace; "
        "capacity_factor then does not apply",
    )
    routing: Annotated[RoutingSpec, BeforeValidator(_kind_only)] | None = Field(
        None,
        description="which tokens go to which expert: {kind: uniform} (the default), zipf, "
        "matrix, lognormal, imbalance (W0-W7) or replay (sim.workload.routing); a bare "
        "string is the kind",
    )
    blocks: BlocksSpec | None = Field(
        None,
        description="a transformer of n blocks around the MoE layers (sim.workload.blocks); "
        "omitted: one MoE layer",
    )

    @model_validator(mode="after")
    def _experts_once(self) -> "ModelSpec":
        if (self.experts is None) == (self.experts_per_gpu is None):
            raise ValueError("give 'experts' (in total) or 'experts_per_gpu', exactly one")
        if self.dropless and "capacity_factor" in self.model_fields_set:
            raise ValueError("capacity_factor does not apply to a dropless layer (dropless: true)")
        return self
