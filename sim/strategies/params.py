"""The strategies' parameters, the schema of a config's `strategy:` entry: one pydantic model
per strategy (types, defaults, help text), named by its `Strategy` ("sim.strategies.params:
TutelParams") and imported only where a parameter is checked or described. The builders'
modules do not import this one, so that a run whose config passed its checks before (the
validated-input cache, `sim.core.inputcache`) imports no pydantic.

The parameter types below are shared by the strategies that take a parameter of that name;
a `Hint` in a type's metadata is what a wrong value's error says was expected. A parameter
typed `Any` is checked by its builder (its own message, on the values it accepts).
"""

# Annotations evaluated as the classes are made (no `from __future__ import annotations`):
# as strings, pydantic would compile and evaluate each field's when the class is made.

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Hint:
    """What a parameter's value must be, as its error says it (`expected <text>`)."""

    text: str


Count = Annotated[int, Field(gt=0, le=2**20)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Degree = Annotated[Count | Literal["auto"], Hint("a positive integer or 'auto'")]
Candidates = Annotated[
    Annotated[list[Count], Field(min_length=1)] | None, Hint("a list of positive integers")
]
PosInt = Annotated[Count, Hint("a positive integer")]
AName = Annotated[Name, Hint("a name")]
Algo = Annotated[Name | None, Hint("an algorithm name")]
Shadow = Annotated[
    Literal["auto", "none"] | list[Annotated[int, Field(ge=0, le=2**20)]],
    Hint("'auto', 'none' or a list of expert ids"),
]
Flag = Annotated[bool, Hint("true or false")]


class StrategyParams(BaseModel):
    """Base of every strategy's `Params`: strict types (no bool for an int, no NaN)."""

    # defer_build: built when first used (`problems`, `describe`), not at import
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", defer_build=True)


def hint(field: Any) -> str:
    for m in field.metadata:
        if isinstance(m, Hint):
            return m.text
    return "valid"


def defaults() -> dict[str, dict[str, Any]]:
    """Each model's defaults, by its name as a `Strategy` gives it ("module:Class")."""
    return {
        f"{__name__}:{name}": {k: f.default for k, f in cls.model_fields.items()}
        for name, cls in globals().items()
        if isinstance(cls, type) and issubclass(cls, StrategyParams) and cls is not StrategyParams
    }


ALGO = "the all-to-all algorithm (sim.hardware.collectives); null: the default one"


class SequentialParams(StrategyParams):
    algo: Algo = Field(None, description=ALGO)


class PipelinedParams(StrategyParams):
    degree: Degree = Field(4, description="capacity chunks r pipelined per all-to-all")
    order: AName = Field(
        "tutel",
        description="how chunks are queued: tutel, alternating or two_streams (chunking.ORDERS)",
    )
    algo: Algo = Field(None, description=ALGO)


class PipeMoEParams(StrategyParams):
    degree: Degree = Field(
        "auto", description="chunks r, or auto: PipeMoE's selector (Theorem 1) on the cluster"
    )
    candidates: Candidates = Field(
        None, description="degrees the selector may pick; default 1..min(64, C)"
    )
    order: AName = Field(
        "tutel", description="how chunks are queued (PipeMoE runs inside Tutel: tutel)"
    )
    algo: Algo = Field(None, description=ALGO)


class TutelParams(StrategyParams):
    degree: Degree = Field(
        1, description="pipelining degree, or auto: Tutel's (degree, algo) search on the cluster"
    )
    algo: Algo = Field(
        "linear", description="all-to-all algorithm: linear or 2dh, or auto with degree auto"
    )
    parallel: AName = Field(
        "auto",
        description="auto, p1, p2 or ep: how sliced experts run (Tutel's switchable parallelism)",
    )


class TEDParams(StrategyParams):
    tp: PosInt = Field(2, description="tensor-parallel group size (consecutive ranks of a node)")
    algo: Algo = Field(None, description=ALGO)


class FasterMoEParams(StrategyParams):
    group_size: PosInt = Field(
        4,
        description="ranks per group of the group-wise exchange (FastMoE's 4, clamped to W)",
    )
    shadow: Shadow = Field(
        "auto",
        description="experts shadowed: auto (the greedy rule), none, or a list of expert ids",
    )
    order: AName = Field(
        "tutel", description="issue order of the steps (sim.strategies.chunking.ORDERS)"
    )


class MPipeMoEParams(StrategyParams):
    degree: Degree = Field(
        "auto", description="micro-batches n, or auto (granularity search on the cost model)"
    )
    reuse: AName = Field(
        "auto", description="memory reuse: none, S1, S2, S3, S4 or auto (Eq. 10 over S1-S4)"
    )
    candidates: Candidates = Field(
        None, description="degrees auto may pick; default DEGREES up to the capacity"
    )
    algo: Algo = Field(None, description=ALGO)


class LancetParams(StrategyParams):
    degree: Degree = Field(1, description="pipelining degree of the layer's all-to-alls")
    algo: Algo = Field(None, description=ALGO)
    partition: Any = Field(
        "auto", description="partitions of the extended pipeline, or auto (Lancet's DP)"
    )
    dw: Any = Field(
        "on", description="on or off: weight-gradient GEMMs scheduled into the all-to-alls"
    )
    gate: Any = Field("switch", description="the gate's kind (sim.strategies.lancet.plan.GATES)")


class ParmParams(StrategyParams):
    schedule: AName = Field("auto", description="baseline, s1, s2 or auto (Parm's selector)")
    saa: Flag = Field(True, description="overlap the all-to-all with the allgather (SAA)")
    tp: PosInt = Field(1, description="model-parallel (tensor) group size")
    esp: PosInt = Field(1, description="expert-sharding group size (ESP)")
    algo: Algo = Field(None, description=ALGO)


class DeepEPParams(StrategyParams):
    max_nodes: Any = Field(
        None,
        description="node-limited routing: each token to at most this many nodes; null: no limit",
    )
    dispatch_dtype: Any = Field("fp8", description="fp8 (1 byte + a fp32 scale per 128) or bf16")
    sms: Any = Field(
        24, description="SMs the dispatch / combine kernels hold (DeepEP V1 tests: 24 of 132)"
    )
    gpus_per_node: Any = Field(
        None, description="GPUs per node of the kernels' NVLink domain; null: the cluster's"
    )
    dedup: Any = Field(
        "expected",
        description="rows per node and GPU: expected (a token's k choices as independent "
        "draws) or tokens (counted from the per-token choices the executor's real gate makes "
        "for the routing: what `exec --moe` moves; uniform routing stays expected)",
    )


class LayerParams(StrategyParams):
    """What a Megatron-Core MoE layer takes, in its merged 1F1B (`megatron_ep`) and as
    DualPipe's chunks (`dualpipe`): the model's shape where it overrides the blocks', the
    token dispatcher and the DeepEP kernels' resources."""

    dispatcher: Any = Field(
        "alltoall", description="the token dispatcher (Megatron-Core's: alltoall, allgather, flex)"
    )
    shared_overlap: Any = Field(True, description="shared experts overlapped with the dispatch")
    layers: Any = Field(None, description="transformer layers; null: the model's")
    heads: Any = Field(None, description="attention heads; null: the model's")
    shared: Any = Field(None, description="shared experts; null: the model's")
    flash: Any = Field(None, description="flash attention; null: the model's")
    mla: Any = Field(None, description="multi-head latent attention; null: the model's")
    kv_heads: Any = Field(None, description="key/value heads (GQA); null: the model's")
    head_dim: Any = Field(None, description="head dimension; null: the model's")
    sms: Any = Field(24, description="SMs the DeepEP kernels hold (DeepEP V1's tests: 24 of 132)")
    dispatch_dtype: Any = Field(
        "bf16",
        description="dtype of the dispatched hidden states (Megatron-Core's fused_dispatch: bf16)",
    )
    gpus_per_node: Any = Field(None, description="GPUs per node; null: the cluster's")


class MegatronEPParams(LayerParams):
    overlap: Any = Field(
        True,
        description="EP communication overlapped with another micro-batch's compute (1F1B)",
    )
    micro: Any = Field(4, description="micro-batches")


class DualPipeParams(LayerParams):
    variant: Any = Field("dualpipe", description="dualpipe or dualpipev")
    pp: Any = Field(4, description="pipeline devices (parallel.pp)")
    micro: Any = Field(None, description="micro-batches; null: the schedule's default")
