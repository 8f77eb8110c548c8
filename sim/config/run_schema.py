"""The run config's schema (pydantic): every field's type, range and allowed values.

`RunConfig.from_dict` checks raw YAML against `RunSpec` first, so a typo, a bool where a
number goes, a NaN or an out-of-range value is refused with its path before anything runs;
what depends on more than one field (experts over GPUs, a layout's product, a strategy's
parameters) is checked where it is resolved. `moesim schema config` prints the JSON Schema.
The `model:` section's models are in `sim.config.model_schema`.
"""

# Annotations evaluated as the classes are made (no `from __future__ import annotations`):
# as strings, pydantic would compile and evaluate each field's at start-up (~1% of a small
# `moesim simulate`). A method returning its own class names it in quotes.

from typing import Annotated, Literal

from pydantic import Field, field_validator

from sim.config.model_schema import Dtype
from sim.config.run_core import SECTIONS, RunCore
from sim.core.kinds import GEMM_DIMS, GEMM_LAYOUTS
from sim.core.limits import DEFAULT as LIMIT_DEFAULTS
from sim.core.limits import NAMES as LIMIT_NAMES
from sim.core.schema import PosInt, Strict
from sim.hardware.costs_schema import (
    Collectives,
    ComputeFits,
    CostsRoofline,
    DispatchParams,
    Interference,
    Quantiles,
    ResourceParams,
    Seconds,
    SharedCpu,
    TaskKind,
    check_quantiles,
)
from sim.hardware.topology.schema import FABRIC_FIELDS


class FabricSpec(Strict):
    """Fields replacing the topology's own `fabric:` ones (the topology schema checks the
    result: `sim.hardware.topology.schema.FabricSpec`). A field may be omitted but not null:
    the override is merged into the topology's fabric as given, where a null would reach the
    arithmetic (the fields are typed without `| None`, the default None standing for absent)."""

    # a None default outside the field's type, on purpose (above): hence the type ignores
    type: Literal["switch", "fat_tree", "rail"] = Field(
        None,  # type: ignore[arg-type]
        description=FABRIC_FIELDS["type"],
    )
    class_: str = Field(  # type: ignore[assignment]
        default=None, alias="class", description=FABRIC_FIELDS["class"]
    )
    attach: list[str] = Field(
        None,  # type: ignore[arg-type]
        description=FABRIC_FIELDS["attach"],
    )
    nodes_per_leaf: PosInt = Field(  # type: ignore[assignment]
        None, description=FABRIC_FIELDS["nodes_per_leaf"]
    )
    nodes_per_unit: PosInt = Field(  # type: ignore[assignment]
        None, description=FABRIC_FIELDS["nodes_per_unit"]
    )
    oversubscription: Annotated[float, Field(ge=1, allow_inf_nan=False)] = Field(  # type: ignore[assignment]
        None, description=FABRIC_FIELDS["oversubscription"]
    )
    planes: Literal["single", "multi"] = Field(
        None,  # type: ignore[arg-type]
        description=FABRIC_FIELDS["planes"],
    )


class ParallelSpec(Strict):
    """Sizes that multiply to the GPU count (sim.workload.parallel); missing ones derived."""

    ep: PosInt | None = Field(
        None,
        description="expert-parallel group size: the GPUs exchanging tokens in the MoE "
        "all-to-all; default: what the other sizes leave of the GPUs",
    )
    dp: PosInt | None = Field(
        None,
        description="data-parallel replicas; default: what ep and the other sizes leave of "
        "the GPUs, or 1 when ep is not given either",
    )
    tp: PosInt | None = Field(
        None,
        description="tensor-parallel group size: consecutive ranks inside a node (ted; parm "
        "lays its model-parallel groups over the MoE ranks); default 1 (ted: its strategy.tp)",
    )
    esp: PosInt | None = Field(
        None,
        description="GPUs each expert is sliced over (Tutel P1/P2, Parm's ESP); default 1",
    )
    pp: PosInt | None = Field(
        None,
        description="pipeline devices of a replica, each an EP group (dualpipe only); default 1",
    )


class JitterSpec(Strict):
    quantiles: Quantiles = Field(
        description="per task kind (gemm, all_to_all, ...) or stream kind (compute, comm, "
        "copy: the fallback of its kinds), non-decreasing quantiles of time / median time "
        "evenly spaced in probability from 0 to 1; each task's duration is multiplied by a "
        "factor drawn from them"
    )
    seed: Annotated[int, Field(ge=0, lt=2**63)] = Field(
        0, description="seed of the first replica's draws (the next ones use seed + 1, ...)"
    )
    replicas: PosInt = Field(  # bounded by limits.max_replicas when the run starts
        11,
        description="seeded runs per simulation, the one with the median makespan reported "
        "(at most limits.max_replicas)",
    )

    @field_validator("quantiles")
    @classmethod
    def _non_decreasing(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        return check_quantiles(v)


# what each size limit bounds (sim.core.limits.Limits, whose defaults are quoted from it)
_LIMITS = {
    "max_world": "GPUs of the topology (nodes x gpus_per_node), whose link arrays grow with "
    "them whether or not every rank is simulated",
    "max_ranks": "ranks whose tasks are built and simulated (a replicated layout builds every "
    "replica)",
    "max_tasks": "tasks of one graph, built or loaded; tasks x jitter replicas for a run",
    "max_replicas": "jitter replicas, each a whole simulation",
    "max_matrix": "entries of an array sized by the input (the routing matrix: GPUs x "
    "experts, per chunk; a graph's all-to-allv splits, members x peers summed)",
    "max_flows": "flows of a `moesim collectives` sweep: sizes x ranks x phases",
    "max_pairs": "memory of the all-to-all group's P x P exchange, estimated before building: "
    "P x P rank pairs x what the strategy keeps per pair in ~64-byte units (1 for a uniform "
    "exchange; more for per-peer all-to-allv splits, e.g. megatron_ep 81 on the demo, and for "
    "a derived alpha-beta fit: pipemoe's selector, costs.network: collective)",
    "max_skewed_flows": "flows simulated one by one, summed over a run's all-to-alls (a "
    "skewed exchange, or fidelity: flow, has P(P-1))",
}


def _limit(name: str) -> str:
    return f"{_LIMITS[name]}; default {getattr(LIMIT_DEFAULTS, name):,}"


class LimitsSpec(Strict):
    """Size limits of the run (`sim.core.limits`: what each bounds and its default)."""

    model_config = Strict.model_config | {"extra": "forbid"}
    max_world: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_world")
    )
    max_ranks: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_ranks")
    )
    max_tasks: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_tasks")
    )
    max_replicas: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_replicas")
    )
    max_matrix: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_matrix")
    )
    max_flows: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_flows")
    )
    max_skewed_flows: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_skewed_flows")
    )
    max_pairs: Annotated[int, Field(gt=0, le=10**12)] | None = Field(
        None, description=_limit("max_pairs")
    )


assert set(LimitsSpec.model_fields) == set(LIMIT_NAMES)


class GemmShapeTime(Strict):
    """A GEMM shape profiled exactly (a calibration's `gemm_shapes` row)."""

    m: Annotated[int, Field(gt=0, le=2**31)] = Field(description=GEMM_DIMS["m"])
    n: Annotated[int, Field(gt=0, le=2**31)] = Field(description=GEMM_DIMS["n"])
    k: Annotated[int, Field(gt=0, le=2**31)] = Field(description=GEMM_DIMS["k"])
    batch: Annotated[int, Field(gt=0, le=2**31)] = Field(1, description=GEMM_DIMS["batch"])
    seconds: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = Field(
        description="its measured time (the median of its repetitions), seconds"
    )
    dtype: Dtype | None = Field(
        None, description="the dtype it was measured in; omitted: it stands for every dtype"
    )
    layout: Literal[GEMM_LAYOUTS] | None = Field(  # type: ignore[valid-type]
        None, description=GEMM_DIMS["layout"]
    )


class CostsSpec(Strict):
    """The cost model (`sim.hardware.costs.CostModel.build`): over the topology's parameters,
    with a calibration's below the ones given here."""

    compute: Literal["roofline", "alpha_beta"] | None = Field(
        None,
        description="roofline (the GPU's peak FLOP/s and memory bandwidth, and its GEMM model "
        "where it has one) or alpha_beta (t = alpha + beta * work per op kind, PipeMoE Eq. "
        "13; kinds without a fit use the roofline); default roofline, alpha_beta with a "
        "calibration that has compute fits",
    )
    network: Literal["flow", "collective"] | None = Field(
        None,
        description="flow (collectives as point-to-point flows sharing links max-min fairly) "
        "or collective (t = alpha + beta * bytes per collective, PipeMoE Eq. 16; kinds "
        "without a fit derived from the flow model); default flow, collective with a "
        "calibration that has collective fits",
    )
    fidelity: Literal["auto", "flow", "bundled"] | None = Field(
        None,
        description="flow mode: flow (each flow its own max-min share, the reference), "
        "bundled (a uniform exchange's flows grouped over whole nodes) or auto (bundled from "
        "bundle_min_ranks ranks); default auto",
    )
    finish_rtol: Annotated[float, Field(ge=0, le=0.05, allow_inf_nan=False)] | None = Field(
        None,
        description="flows ending within this fraction of the current time end together: "
        "faster skewed all-to-allv, each flow ending up to finish_rtol x now early; default "
        "1e-9 (exact)",
    )
    bundle_min_ranks: PosInt | None = Field(
        None,
        description="fidelity auto: collectives of this many ranks or more are bundled; default 64",
    )
    alpha: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = Field(
        None,
        description="start-up seconds per message in flow mode; default: the topology's "
        "network.alpha",
    )
    roofline: CostsRoofline | None = Field(
        None, description="replaces fields of the topology's gpu.roofline"
    )
    alpha_beta: ComputeFits | None = Field(
        None,
        description="compute fits per op kind (gemm, elementwise, d2h, ...), one for every "
        "dtype or one per dtype, over the topology's gpu.alpha_beta; used with compute: "
        "alpha_beta",
    )
    collectives: Collectives | None = Field(
        None,
        description="fits per collective kind, one for every group size or a list by group "
        "size, over the topology's; used with network: collective",
    )
    interference: Interference | None = Field(
        None,
        description="relative speeds of stream kinds while others run (MPipeMoE Fig. 3), "
        "replacing the topology's rows; default 1 (no slowdown)",
    )
    resources: ResourceParams | None = Field(
        None,
        description="replaces fields of the topology's gpu.resources: SM and HBM sharing, "
        "hardware queues, host launch cost",
    )
    dispatch: DispatchParams | None = Field(
        None,
        description="seconds from a task being ready to its start, replacing fields of the "
        "topology's gpu.dispatch; default 0",
    )
    launch: dict[TaskKind, Seconds] | None = Field(
        None,
        description="host seconds a rank's launch thread spends issuing one task of this "
        "kind (sim.hardware.costs.launch; a GPU calibration measures the executor's); "
        "kinds not named: resources.launch_s",
    )
    jitter: JitterSpec | None = Field(
        None,
        description="run-to-run noise: factors per op kind over seeded replicas; omitted: a "
        "calibration's, if it has one; null: the ideal, noise-free model, run once",
    )
    calibration: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="path of a calibration file (`moesim calibrate`); its fitted parameters "
        "apply below the ones given here",
    )
    gemm_shapes: list[GemmShapeTime] | None = Field(
        None,
        description="GEMMs profiled at their exact shapes: their measured seconds replace the "
        "alpha-beta fit (compute: alpha_beta)",
    )
    shared_cpu: SharedCpu | Literal[False] | None = Field(
        None,
        description="replaces fields of the topology's shared_cpu (cores, threads per rank, "
        "...); false: the host model off",
    )
    symmetry: Literal["auto", "on", "off"] | bool | None = Field(  # bare on/off: YAML bools
        None,
        description="simulate one representative per class of equivalent ranks: auto (from "
        "64 represented ranks, where exact), on (any size) or off (the full simulation); a "
        "bare YAML on / off reads as true / false; default auto",
    )


class OutputSpec(Strict):
    # omitted, not null: a null dir or format would be taken as given (see FabricSpec; the
    # type ignores are the None defaults, as there)
    dir: Annotated[str, Field(min_length=1)] = Field(  # type: ignore[assignment]
        None,
        description="where `moesim simulate` writes its output set when --out is not given; "
        "omitted: nothing is written",
    )
    trace_format: Literal["csv", "parquet"] = Field(
        None,  # type: ignore[arg-type]
        description="format of the trace table: csv or parquet (needs pyarrow); default csv",
    )
    chrome_trace: bool = Field(  # type: ignore[assignment]
        None, description="also write trace.chrome.json (for ui.perfetto.dev); default true"
    )
    max_trace_ranks: PosInt = Field(  # type: ignore[assignment]
        None, description="the Chrome trace shows the ranks below this number; default: all"
    )


# The run config: RunCore's fields, its optional sections typed by the models above
# (`sim.config.run_spec` checks a config that leaves them all out by RunCore). No docstring:
# it would be the JSON Schema's description.
class RunSpec(RunCore):
    fabric: FabricSpec | None = Field(None, description=SECTIONS["fabric"])
    parallel: ParallelSpec | None = Field(None, description=SECTIONS["parallel"])
    costs: CostsSpec | None = Field(None, description=SECTIONS["costs"])
    output: OutputSpec | None = Field(None, description=SECTIONS["output"])
    limits: LimitsSpec | None = Field(None, description=SECTIONS["limits"])
