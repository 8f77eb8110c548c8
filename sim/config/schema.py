"""The run config's schema (pydantic): every field's type, range and allowed values.

`RunConfig.from_dict` checks raw YAML against `RunSpec` first, so a typo, a bool where a
number goes, a NaN or an out-of-range value is refused with its path before anything runs;
what depends on more than one field (experts over GPUs, a layout's product, a strategy's
parameters) is checked where it is resolved. `moesim schema config` prints the JSON Schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from sim.core.errors import ConfigError
from sim.core.graph_schema import DTYPES, GEMM_LAYOUTS
from sim.core.limits import NAMES as LIMIT_NAMES
from sim.core.schema import PosInt, Strict, short
from sim.hardware.costs_schema import (
    Collectives,
    ComputeFits,
    DispatchParams,
    Interference,
    Quantiles,
    ResourceParams,
    RooflineParams,
    check_quantiles,
)

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

    kind: Literal["uniform", "zipf", "matrix"]
    s: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    tokens: list[list[Annotated[float, Field(ge=0, le=MAX_TOKENS_ENTRY)]]] | None = None
    file: Annotated[str, Field(min_length=1)] | None = None

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

    kv_lora_rank: Dim
    qk_nope_head_dim: Dim
    qk_rope_head_dim: Annotated[int, Field(ge=0, le=MAX_DIM)]
    v_head_dim: Dim
    q_lora_rank: Dim | None = None


class BlocksSpec(Strict):
    """`model.blocks`: a transformer of `n` blocks around the MoE layers
    (`sim.workload.blocks`)."""

    n: Annotated[int, Field(gt=0, le=4096)]
    heads: Annotated[int, Field(gt=0, le=MAX_DIM)]
    moe_every: Annotated[int, Field(gt=0, le=4096)] = 2
    first_dense: Annotated[int, Field(ge=0, le=4096)] = 0
    ffn_hidden: Dim | None = None
    shared: Annotated[int, Field(ge=0, le=1024)] = 0
    flash: bool = False
    mla: MLASpec | None = None
    kv_heads: Annotated[int, Field(gt=0, le=MAX_DIM)] | None = None
    head_dim: Dim | None = None


def _preset(v: Any) -> Any:
    from sim.workload.blocks import PRESETS, expand_preset

    if isinstance(v, dict) and "preset" in v and v["preset"] not in PRESETS:
        raise ValueError(f"preset: unknown preset {v['preset']!r} (known: {sorted(PRESETS)})")
    return expand_preset(v)


class ModelSpec(Strict):
    batch: Annotated[int, Field(gt=0, le=MAX_BATCH)]
    seq_len: Dim
    model_dim: Dim
    hidden_dim: Dim
    experts: Annotated[int, Field(gt=0, le=MAX_EXPERTS)] | None = None
    experts_per_gpu: Annotated[int, Field(gt=0, le=MAX_EXPERTS)] | None = None
    top_k: Annotated[int, Field(gt=0, le=1024)] = 1
    capacity_factor: Annotated[float, Field(gt=0, le=MAX_CAPACITY_FACTOR)] = 1.0
    dtype: Dtype = "bf16"
    routing: Annotated[RoutingSpec, BeforeValidator(_kind_only)] | None = None
    blocks: BlocksSpec | None = None

    @model_validator(mode="after")
    def _experts_once(self) -> ModelSpec:
        if (self.experts is None) == (self.experts_per_gpu is None):
            raise ValueError("give 'experts' (in total) or 'experts_per_gpu', exactly one")
        return self


class FabricSpec(Strict):
    type: Literal["switch", "fat_tree", "rail"] | None = None
    class_: str | None = Field(default=None, alias="class")
    attach: list[str] | None = None
    nodes_per_leaf: PosInt | None = None
    nodes_per_unit: PosInt | None = None
    oversubscription: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    planes: Literal["single", "multi"] | None = None


class ParallelSpec(Strict):
    ep: PosInt | None = None
    dp: PosInt | None = None
    tp: PosInt | None = None
    esp: PosInt | None = None
    pp: PosInt | None = None


class JitterSpec(Strict):
    quantiles: Quantiles
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    replicas: PosInt = 11  # bounded by limits.max_replicas when the run starts

    @field_validator("quantiles")
    @classmethod
    def _non_decreasing(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        return check_quantiles(v)


class LimitsSpec(Strict):
    """Size limits of the run (`sim.core.limits`: what each bounds and its default)."""

    model_config = Strict.model_config | {"extra": "forbid"}
    max_world: Annotated[int, Field(gt=0, le=10**12)] | None = None
    max_ranks: Annotated[int, Field(gt=0, le=10**12)] | None = None
    max_tasks: Annotated[int, Field(gt=0, le=10**12)] | None = None
    max_replicas: Annotated[int, Field(gt=0, le=10**12)] | None = None
    max_matrix: Annotated[int, Field(gt=0, le=10**12)] | None = None
    max_flows: Annotated[int, Field(gt=0, le=10**12)] | None = None
    max_skewed_flows: Annotated[int, Field(gt=0, le=10**12)] | None = None


assert set(LimitsSpec.model_fields) == set(LIMIT_NAMES)


class CostsSpec(Strict):
    compute: Literal["roofline", "alpha_beta"] | None = None
    network: Literal["flow", "collective"] | None = None
    fidelity: Literal["auto", "flow", "bundled"] | None = None
    finish_rtol: Annotated[float, Field(ge=0, le=0.05, allow_inf_nan=False)] | None = None
    bundle_min_ranks: PosInt | None = None
    alpha: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = None
    roofline: RooflineParams | None = None
    alpha_beta: ComputeFits | None = None
    collectives: Collectives | None = None
    interference: Interference | None = None
    resources: ResourceParams | None = None
    dispatch: DispatchParams | None = None
    jitter: JitterSpec | None = None
    calibration: Annotated[str, Field(min_length=1)] | None = None
    gemm_shapes: list[GemmShapeTime] | None = None
    symmetry: Literal["auto", "on", "off"] | bool | None = None  # bare on/off: YAML bools


class GemmShapeTime(Strict):
    """A GEMM shape profiled exactly (a calibration's `gemm_shapes` row)."""

    m: Annotated[int, Field(gt=0, le=2**31)]
    n: Annotated[int, Field(gt=0, le=2**31)]
    k: Annotated[int, Field(gt=0, le=2**31)]
    batch: Annotated[int, Field(gt=0, le=2**31)] = 1
    seconds: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
    dtype: Dtype | None = None
    layout: Literal[GEMM_LAYOUTS] | None = None  # type: ignore[valid-type]


CostsSpec.model_rebuild()


class OutputSpec(Strict):
    dir: Annotated[str, Field(min_length=1)] | None = None
    trace_format: Literal["csv", "parquet"] | None = None
    chrome_trace: bool | None = None
    max_trace_ranks: PosInt | None = None


def _named(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


Name = Annotated[str, Field(min_length=1, max_length=256)]
# The types of strategy parameters, by name (a name means the same thing in every strategy
# that takes it); which names a strategy takes and which values it accepts are its own checks
# (`sim.strategies.resolve_params` and the builders), run when the config is resolved.
PARAM_TYPES: dict[str, TypeAdapter] = {
    name: TypeAdapter(t, config=ConfigDict(strict=True, allow_inf_nan=False))
    for name, t in {
        "degree": Annotated[int, Field(gt=0, le=2**20)] | Literal["auto"],
        "candidates": Annotated[list[Annotated[int, Field(gt=0, le=2**20)]], Field(min_length=1)]
        | None,
        "order": Name,
        "algo": Name | None,
        "parallel": Name,
        "reuse": Name,
        "tp": Annotated[int, Field(gt=0, le=2**20)],
        "group_size": Annotated[int, Field(gt=0, le=2**20)],
        "shadow": Literal["auto", "none"] | list[Annotated[int, Field(ge=0, le=2**20)]],
        "schedule": Name,
        "saa": bool,
        "esp": Annotated[int, Field(gt=0, le=2**20)],
    }.items()
}


class StrategySpec(Strict):
    """`name` plus the strategy's own parameters (typed by PARAM_TYPES: `check_params`)."""

    model_config = Strict.model_config | {"extra": "allow"}
    name: Name


def check_params(params: dict[str, Any], source: str) -> None:
    """Each strategy parameter of a known name has its type (ConfigError naming it)."""
    problems = []
    for key, value in params.items():
        adapter = PARAM_TYPES.get(key)
        if adapter is None:
            continue  # unknown to every strategy: resolve_params names it
        try:
            adapter.validate_python(value)
        except ValidationError:
            hint = _PARAM_HINTS.get(key, "valid")
            problems.append(f"strategy.{key}: expected {hint}, got {short(value)}")
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


_PARAM_HINTS = {
    "degree": "a positive integer or 'auto'",
    "candidates": "a list of positive integers",
    "tp": "a positive integer",
    "group_size": "a positive integer",
    "shadow": "'auto', 'none' or a list of expert ids",
    "algo": "an algorithm name",
    "order": "a name",
    "parallel": "a name",
    "reuse": "a name",
    "schedule": "a name",
    "saa": "true or false",
    "esp": "a positive integer",
}


def _listed(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class RunSpec(Strict):
    topology: Annotated[str, Field(min_length=1)]
    nodes: PosInt | None = None
    fabric: FabricSpec | None = None
    parallel: ParallelSpec | None = None
    model: Annotated[ModelSpec, BeforeValidator(_preset)]
    strategy: Annotated[StrategySpec, BeforeValidator(_named)] | None = None
    passes: (
        Annotated[list[Literal["fwd", "bwd"]], Field(min_length=1), BeforeValidator(_listed)] | None
    ) = None
    costs: CostsSpec | None = None
    output: OutputSpec | None = None
    limits: LimitsSpec | None = None
