"""The schema of cost parameters, wherever they are given: a topology's `gpu:` section, a run
config's `costs:` section, a calibration file. One model per parameter family, so that an
alpha-beta fit or an interference row has the same ranges in all three places.

Ranges are what the cost models can use without producing nonsense: times finite and >= 0
(and below a second where they are per-message or per-launch), efficiencies and relative
speeds in (0, 1], fits with the group sizes they were measured at.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from sim.core.graph_schema import DTYPES, GEMM_LAYOUTS
from sim.core.kinds import ALL_KINDS, COLLECTIVE_KINDS, COMPUTE_KINDS, COPY_KINDS
from sim.core.schema import Fraction, PosInt, Strict

STREAM_KINDS = ("compute", "comm", "copy")
MAX_JITTER_FACTOR = 1e3  # a run 1000x its median is a broken measurement, not noise

Seconds = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # a latency, a launch
CollectiveKind = Literal[tuple(sorted(COLLECTIVE_KINDS))]  # type: ignore[valid-type]
Dtype = Literal[DTYPES]  # type: ignore[valid-type]
# the task kinds a compute model costs (alpha_beta keys): compute kernels and copies
ComputeKind = Literal[tuple(sorted(COMPUTE_KINDS | COPY_KINDS))]  # type: ignore[valid-type]
# jitter quantiles: per task kind, or per stream kind as the fallback of its kinds
JitterKind = Literal[tuple(sorted(ALL_KINDS | set(STREAM_KINDS)))]  # type: ignore[valid-type]
Layout = Literal[GEMM_LAYOUTS]  # type: ignore[valid-type]


class RooflineParams(Strict):
    """t = launch + max(flops / (peak * flops_efficiency), bytes / (mem_bw * mem_efficiency))."""

    launch_s: Seconds | None = None
    flops_efficiency: Fraction | None = None
    mem_efficiency: Fraction | None = None


class AlphaBeta(Strict):
    """t = alpha + beta * work (PipeMoE Eq. 13 for compute, Eq. 16 for collectives): alpha
    a start-up below a second, beta seconds per unit of work (a flop, a byte) below 1e-3
    (slower than 1 KB/s is a broken fit, not a machine)."""

    alpha: Seconds
    beta: Annotated[float, Field(ge=0, le=1e-3, allow_inf_nan=False)]
    source: str | None = None


class CollectiveFit(AlphaBeta):
    ranks: PosInt | None = None


# per compute or copy kind (`gemm`, `elementwise`, `d2h`, ...): one fit, or one per dtype
ComputeFits = dict[ComputeKind, AlphaBeta | Annotated[dict[Dtype, AlphaBeta], Field(min_length=1)]]


# per collective kind: one fit for every group size, or fits per group size
Collectives = dict[CollectiveKind, AlphaBeta | Annotated[list[CollectiveFit], Field(min_length=1)]]

SpeedRow = dict[str, Fraction]


def check_interference(table: dict[str, SpeedRow]) -> dict[str, SpeedRow]:
    """Each row's keys name the other stream kinds busy at the same time, '+'-joined."""
    for kind, row in table.items():
        for key in row:
            others = set(key.split("+"))
            if not others <= set(STREAM_KINDS) or kind in others:
                raise ValueError(
                    f"{kind}.{key}: expected other stream kinds than {kind!r} joined by '+' "
                    f"(of {list(STREAM_KINDS)})"
                )
    return table


class Interference(Strict):
    """Relative speed (<= 1) of a stream kind while others run (MPipeMoE Fig. 3)."""

    compute: SpeedRow | None = None
    comm: SpeedRow | None = None
    copy_: SpeedRow | None = Field(default=None, alias="copy")  # `copy` is BaseModel's

    @field_validator("compute", "comm", "copy_")
    @classmethod
    def _keys(cls, row: SpeedRow | None, info: ValidationInfo) -> SpeedRow | None:
        if row is not None:
            check_interference({(info.field_name or "").rstrip("_"): row})
        return row


class DispatchParams(Strict):
    """Seconds from ready to start: after the stream's previous task / another stream's."""

    stream: Seconds | None = None
    cross: Seconds | None = None


JitterFactor = Annotated[float, Field(gt=0, le=MAX_JITTER_FACTOR, allow_inf_nan=False)]


def check_quantiles(v: dict[str, list[float]]) -> dict[str, list[float]]:
    for kind, q in v.items():
        if any(b < a for a, b in zip(q, q[1:])):
            raise ValueError(f"quantiles of {kind!r} must be non-decreasing")
    return v


Quantiles = dict[JitterKind, Annotated[list[JitterFactor], Field(min_length=2)]]


Tile = Annotated[list[Annotated[int, Field(gt=0, le=4096)]], Field(min_length=2, max_length=2)]
Tiles = Annotated[list[Tile], Field(min_length=1)]


class GemmModelParams(Strict):
    """A topology's `gpu.gemm`: output tiles in waves over the SMs against the bytes moved
    (`sim.hardware.costs.gemm`)."""

    sms: Annotated[int, Field(gt=0, le=100_000)]
    efficiency: Annotated[dict[Dtype, Fraction], Field(min_length=1)]
    tiles: Tiles | Annotated[dict[str, Tiles], Field(min_length=1)]  # per dtype, or "default"
    k_step: Annotated[int, Field(gt=0, le=2**20)] | None = None
    tile_overhead_k: Annotated[float, Field(ge=0, le=2**31, allow_inf_nan=False)] | None = None
    launch_s: Seconds | None = None
    read_efficiency: Fraction
    write_efficiency: Fraction
    split_k: Annotated[list[Annotated[int, Field(gt=0, le=4096)]], Field(min_length=1)] | None = (
        None
    )
    split_k_s: Seconds | None = None
    split_k_min_depth: Annotated[int, Field(gt=0, le=2**31)] | None = None
    unaligned_efficiency: Fraction | None = None
    alignment_bytes: Annotated[int, Field(gt=0, le=4096)] | None = None

    @field_validator("tiles")
    @classmethod
    def _tile_keys(cls, v: object) -> object:
        if isinstance(v, dict) and not set(v) <= {"default", *DTYPES}:
            raise ValueError(f"keys must be 'default' or dtypes ({', '.join(DTYPES)})")
        return v


class ResourceParams(Strict):
    """A topology's `gpu.resources` or a run's `costs.resources`: the GPU-internal resource
    model (`sim.hardware.costs.resources`, whose docstring gives each parameter's role)."""

    max_connections: Annotated[int, Field(ge=1, le=32)] | None = None  # CUDA: 1 to 32
    comm_sms: Annotated[int, Field(ge=0, le=1024)] | None = None  # NCCL: a block per channel
    sm_penalty: Fraction | None = None
    sm_share: Fraction | None = None
    sm_bw: Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False)] | None = None
    mem_knee: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    mem_slope: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    launch_s: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None  # host s
    comm_sm_bw: Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False)] | None = None
    comm_sm_efficiency: Fraction | None = None
