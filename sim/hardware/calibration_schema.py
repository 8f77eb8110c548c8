"""The schema of a calibration file (format 2; `moesim schema calibration`).

What `moesim calibrate` writes and `--calibration` reads: fits per op kind (GEMMs per dtype),
collective fits per group size (two ranks or more: one rank's "collective" is a local copy),
interference speeds, dispatch gaps, exact GEMM shapes, jitter quantiles and where it all was
measured. The ranges are those of `costs_schema` (the same alpha-beta fit in a topology, a
config or here), plus what only a measurement has: its fit quality and its sample counts.
The writer runs the same model before writing, so a file moesim writes is one it reads.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.core.schema import Fraction, NonNegFloat, NonNegInt, PosInt, Strict
from sim.hardware.costs_schema import (
    AlphaBeta,
    CollectiveKind,
    ComputeKind,
    Dtype,
    Layout,
    Quantiles,
    Seconds,
    check_quantiles,
)
from sim.hardware.costs_schema import (
    Interference as CostsInterference,
)

FORMAT = 2
# interference speeds below this are measuring accidents, not slowdowns: the fit drops them
SPEED_FLOOR = 0.05
Speed = Annotated[float, Field(ge=SPEED_FLOOR, le=1, allow_inf_nan=False)]
SpeedRow = dict[str, Speed]


class Fit(AlphaBeta):
    """One op's fitted t = alpha + beta * work, with how well it fitted its sizes."""

    r2: Annotated[float, Field(allow_inf_nan=False)] | None = None  # may be < 0: a poor fit
    mean_error: NonNegFloat | None = None
    sizes: NonNegInt | None = None

    @model_validator(mode="after")
    def _some_cost(self) -> Fit:
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("alpha and beta are both 0 (a cost of nothing)")
        return self


class GroupFit(Fit):
    """A collective's fit at one group size, measured over `n` message sizes."""

    ranks: PosInt

    @field_validator("ranks")
    @classmethod
    def _networked(cls, v: int) -> int:
        if v < 2:
            raise ValueError(
                f"expected ranks >= 2, got {v}: a collective of one rank is a local copy, "
                f"not a network cost"
            )
        return v

    n: NonNegInt | None = None


class Interference(CostsInterference):
    """The cost file's table, its speeds floored at SPEED_FLOOR (the keys checked as there)."""

    compute: SpeedRow | None = None
    comm: SpeedRow | None = None
    copy_: SpeedRow | None = Field(default=None, alias="copy")  # `copy` is BaseModel's


class Gap(Strict):
    """Seconds from a task being ready to its start (exec.measure.timings.dispatch_gaps)."""

    mean: Seconds
    median: Seconds
    n: NonNegInt | None = None


class GemmShape(Strict):
    """One GEMM profiled at its exact shape: the median of its repetitions."""

    batch: PosInt = 1
    m: PosInt
    n: PosInt
    k: PosInt
    dtype: Dtype = "fp32"
    layout: Layout = "nn"
    seconds: Annotated[float, Field(gt=0, lt=3600, allow_inf_nan=False)]


class GroupFitV1(Fit):
    """Format 1 also fitted one-rank collectives (local copies); the upgrade drops them."""

    ranks: PosInt
    n: NonNegInt | None = None


Version = Annotated[str, Field(max_length=200)]


class Meta(Strict):
    """Where and how it was measured (exec.measure.environment and the calibrate command)."""

    backend: Literal["gloo", "nccl"] | None = None
    nprocs: PosInt | None = None
    device: Version | None = None
    device_type: Version | None = None
    device_name: Version | None = None
    capability: Version | None = None
    sms: PosInt | None = None
    memory_bytes: PosInt | None = None
    host: Version | None = None
    machine: Version | None = None
    cpu: Version | None = None
    cpus: PosInt | None = None
    python: Version | None = None
    torch: Version | None = None
    cuda: Version | None = None
    nccl: Version | None = None
    measured_at: Version | None = None
    dtypes: list[Dtype] | None = None
    # graph dtype -> the dtype the device really ran it in (a CPU runs bf16 as fp32)
    stand_ins: dict[Dtype, Dtype] | None = None
    rows: NonNegInt | None = None
    warnings: list[Annotated[str, Field(max_length=2000)]] | None = None
    local_collectives_not_fitted: list[CollectiveKind] | None = None


ComputeFits = dict[ComputeKind, Fit | Annotated[dict[Dtype, Fit], Field(min_length=1)]]


class CalibrationFile(Strict):
    format: Literal[2] = FORMAT
    meta: Meta = Meta()
    compute: ComputeFits = {}
    collectives: dict[CollectiveKind, Annotated[list[GroupFit], Field(min_length=1)]] = {}
    interference: Interference = Interference()
    dispatch: dict[Literal["stream", "cross"], Gap] = {}
    gemm_shapes: list[GemmShape] = []
    jitter: Quantiles = {}

    @field_validator("jitter")
    @classmethod
    def _jitter(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        return check_quantiles(v)

    @model_validator(mode="after")
    def _some_fit(self) -> CalibrationFile:
        if not (self.compute or self.collectives):
            raise ValueError("no compute or collective fits")
        return self


class CalibrationFileV1(Strict):
    """Format 1 (no `format` key), checked for shape before it is upgraded: one GEMM fit
    for every dtype, and collectives that may include one-rank fits (dropped on upgrade)."""

    meta: dict[str, Any] = {}
    compute: dict[ComputeKind, Fit | dict[Dtype, Fit]] = {}
    collectives: dict[CollectiveKind, list[GroupFitV1]] = {}
    # speeds as measured: what one rank's comm stream gave (0.01) is dropped on upgrade
    interference: dict[Literal["compute", "comm", "copy"], dict[str, Fraction]] = {}
    dispatch: dict[Literal["stream", "cross"], Gap] = {}
    gemm_shapes: list[GemmShape] = []
    jitter: Quantiles = {}
