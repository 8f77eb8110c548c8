"""The run config's schema (pydantic): every field's type, range and allowed values.

`RunConfig.from_dict` checks raw YAML against `RunSpec` first, so a typo, a bool where a
number goes, a NaN or an out-of-range value is refused with its path before anything runs;
what depends on more than one field (experts over GPUs, a layout's product, a strategy's
parameters) is checked where it is resolved. `moesim schema config` prints the JSON Schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from sim.core.schema import (
    Fraction,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Strict,
)
from sim.hardware.costs.compute import DTYPE_BYTES

Dtype = Literal[tuple(DTYPE_BYTES)]  # type: ignore[valid-type]
MAX_REPLICAS = 1000  # jitter replicas: each is a whole simulation
MAX_CAPACITY_FACTOR = 1e4  # beyond this C is the whole batch anyway


class RoutingSpec(Strict):
    """`{kind: uniform}`, `{kind: zipf, s, seed}` or `{kind: matrix, tokens | file}`; a bare
    string is its kind."""

    kind: Literal["uniform", "zipf", "matrix"]
    s: NonNegFloat | None = None
    seed: NonNegInt | None = None
    tokens: list[list[NonNegFloat]] | None = None
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


class ModelSpec(Strict):
    batch: PosInt
    seq_len: PosInt
    model_dim: PosInt
    hidden_dim: PosInt
    experts: PosInt | None = None
    experts_per_gpu: PosInt | None = None
    top_k: PosInt = 1
    capacity_factor: Annotated[float, Field(gt=0, le=MAX_CAPACITY_FACTOR)] = 1.0
    dtype: Dtype = "bf16"
    routing: Annotated[RoutingSpec, BeforeValidator(_kind_only)] | None = None


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


class RooflineSpec(Strict):
    flops_efficiency: Fraction | None = None
    mem_efficiency: Fraction | None = None


class AlphaBeta(Strict):
    alpha: NonNegFloat
    beta: NonNegFloat
    source: str | None = None


class CollectiveFit(AlphaBeta):
    ranks: PosInt | None = None


class DispatchSpec(Strict):
    stream: NonNegFloat | None = None
    cross: NonNegFloat | None = None


class JitterSpec(Strict):
    quantiles: dict[str, Annotated[list[PosFloat], Field(min_length=2)]]
    seed: NonNegInt = 0
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 11

    @field_validator("quantiles")
    @classmethod
    def _non_decreasing(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for kind, q in v.items():
            if any(b < a for a, b in zip(q, q[1:])):
                raise ValueError(f"quantiles of {kind!r} must be non-decreasing")
        return v


SpeedRow = dict[str, Fraction]


class CostsSpec(Strict):
    compute: Literal["roofline", "alpha_beta"] | None = None
    network: Literal["flow", "collective"] | None = None
    fidelity: Literal["auto", "flow", "bundled"] | None = None
    finish_rtol: Annotated[float, Field(ge=0, le=0.05, allow_inf_nan=False)] | None = None
    bundle_min_ranks: PosInt | None = None
    alpha: NonNegFloat | None = None
    roofline: RooflineSpec | None = None
    alpha_beta: dict[str, AlphaBeta] | None = None
    collectives: dict[str, AlphaBeta | list[CollectiveFit]] | None = None
    interference: dict[Literal["compute", "comm", "copy"], SpeedRow] | None = None
    dispatch: DispatchSpec | None = None
    jitter: JitterSpec | None = None
    calibration: str | None = None
    gemm_shapes: list[dict[str, Any]] | None = None
    symmetry: Literal["auto", "on", "off"] | bool | None = None  # bare on/off: YAML bools


class OutputSpec(Strict):
    dir: Annotated[str, Field(min_length=1)] | None = None
    trace_format: Literal["csv", "parquet"] | None = None
    chrome_trace: bool | None = None
    max_trace_ranks: PosInt | None = None


def _named(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class StrategySpec(Strict):
    """`name` plus the strategy's own parameters (checked against its DEFAULTS on load)."""

    model_config = Strict.model_config | {"extra": "allow"}
    name: str


def _listed(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class RunSpec(Strict):
    topology: Annotated[str, Field(min_length=1)]
    nodes: PosInt | None = None
    fabric: FabricSpec | None = None
    parallel: ParallelSpec | None = None
    model: ModelSpec
    strategy: Annotated[StrategySpec, BeforeValidator(_named)] | None = None
    passes: (
        Annotated[list[Literal["fwd", "bwd"]], Field(min_length=1), BeforeValidator(_listed)]
        | None
    ) = None
    costs: CostsSpec | None = None
    output: OutputSpec | None = None
