"""The schema of a calibration file (format 2; `moesim schema calibration`).

What `moesim calibrate` writes and `--calibration` reads: fits per op kind (GEMMs per dtype),
collective fits per group size (two ranks or more: one rank's "collective" is a local copy),
interference speeds, dispatch gaps, exact GEMM shapes, jitter quantiles and where it all was
measured. The ranges are those of `costs_schema` (the same alpha-beta fit in a topology, a
config or here), plus what only a measurement has: its fit quality and its sample counts.
The writer runs the same model before writing, so a file moesim writes is one it reads.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from sim.core.kinds import GEMM_DIMS
from sim.core.schema import Fraction, NonNegFloat, NonNegInt, PosInt, Strict
from sim.hardware.costs_schema import (
    AlphaBeta,
    CollectiveKind,
    ComputeKind,
    Dtype,
    Layout,
    Quantiles,
    Seconds,
    TaskKind,
    check_quantiles,
)
from sim.hardware.costs_schema import (
    Interference as CostsInterference,
)

FORMAT: Final = 2
# interference speeds below this are measuring accidents, not slowdowns: the fit drops them
SPEED_FLOOR = 0.05
Speed = Annotated[float, Field(ge=SPEED_FLOOR, le=1, allow_inf_nan=False)]
SpeedRow = dict[str, Speed]


class Fit(AlphaBeta):
    """One op's fitted t = alpha + beta * work, with how well it fitted its sizes."""

    r2: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        None,
        description="coefficient of determination over the sizes fitted (below 0: worse than "
        "their mean, a poor fit)",
    )
    mean_error: NonNegFloat | None = Field(
        None, description="mean relative error |fit / measured - 1| over the sizes fitted"
    )
    sizes: NonNegInt | None = Field(
        None, description="sizes fitted, each the median of its quiet repetitions"
    )
    quiet: Fraction | None = Field(
        None,
        description="share of its repetitions that were quiet (within 2x of their size's "
        "fastest; sim.hardware.costs.robust): the fit rests on those; below 0.5 the host "
        "was busy and the file's warnings say so",
    )

    @model_validator(mode="after")
    def _some_cost(self) -> Fit:
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("alpha and beta are both 0 (a cost of nothing)")
        return self


class GroupFit(Fit):
    """A collective's fit at one group size, measured over `n` message sizes."""

    ranks: PosInt = Field(
        description="the group size measured, 2 or more (one rank's collective is a local copy)"
    )

    @field_validator("ranks")
    @classmethod
    def _networked(cls, v: int) -> int:
        if v < 2:
            raise ValueError(
                f"expected ranks >= 2, got {v}: a collective of one rank is a local copy, "
                f"not a network cost"
            )
        return v

    n: NonNegInt | None = Field(
        None, description="message sizes fitted, each the median of its quiet repetitions"
    )


_MEASURED = (
    "measured relative speed of {kind}, in [0.05, 1], while the other stream kinds a key "
    "names ran on the same device: keys {others}"
)


class Interference(CostsInterference):
    """The cost file's table, its speeds floored at SPEED_FLOOR (the keys checked as there)."""

    compute: SpeedRow | None = Field(
        None, description=_MEASURED.format(kind="compute kernels", others="comm, copy, comm+copy")
    )
    comm: SpeedRow | None = Field(
        None,
        description=_MEASURED.format(kind="communication", others="compute, copy, compute+copy"),
    )
    copy_: SpeedRow | None = Field(  # `copy` is BaseModel's
        default=None,
        alias="copy",
        description=_MEASURED.format(kind="copies", others="compute, comm, compute+comm"),
    )


class Gap(Strict):
    """Seconds from a task being ready to its start (exec.measure.timings.dispatch_gaps)."""

    mean: Seconds = Field(
        description="mean seconds: what a run uses (costs.dispatch), since a makespan adds up "
        "every gap, the slow ones too"
    )
    median: Seconds = Field(description="median seconds")
    n: NonNegInt | None = Field(None, description="gaps measured")


class GemmShape(Strict):
    """One GEMM profiled at its exact shape: the median of its repetitions."""

    batch: PosInt = Field(1, description=GEMM_DIMS["batch"])
    m: PosInt = Field(description=GEMM_DIMS["m"])
    n: PosInt = Field(description=GEMM_DIMS["n"])
    k: PosInt = Field(description=GEMM_DIMS["k"])
    dtype: Dtype = Field("fp32", description="the dtype it ran in")
    layout: Layout = Field("nn", description=GEMM_DIMS["layout"])
    seconds: Annotated[float, Field(gt=0, lt=3600, allow_inf_nan=False)] = Field(
        description="the median time of its repetitions, seconds"
    )


class GroupFitV1(Fit):
    """Format 1 also fitted one-rank collectives (local copies); the upgrade drops them."""

    ranks: PosInt
    n: NonNegInt | None = None


Version = Annotated[str, Field(max_length=200)]


class HostLoad(Strict):
    """How busy the host was while it measured (exec.measure.environment.LoadProbe): a fit
    taken under load rests on its quiet repetitions (sim.hardware.costs.robust)."""

    loadavg_min: NonNegFloat | None = Field(
        None, description="lowest 1-minute load average seen while measuring"
    )
    loadavg_max: NonNegFloat | None = Field(
        None, description="highest 1-minute load average seen while measuring"
    )
    samples: NonNegInt | None = Field(None, description="load averages sampled")
    cores: PosInt | None = Field(
        None, description="cores this process may run on (its CPU affinity)"
    )
    busy_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = Field(
        None,
        description="share of all CPUs' time busy over the measurement (/proc/stat; the "
        "calibration's own ranks included), percent",
    )
    steal_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = Field(
        None,
        description="share of CPU time stolen by the hypervisor over the measurement "
        "(/proc/stat; absent where the OS does not count it), percent",
    )
    busy: bool | None = Field(
        None,
        description="whether the host counted as busy: a load average above 1.25 x its "
        "cores, or steal above 10%",
    )


class Meta(Strict):
    """Where and how it was measured (exec.measure.environment and the calibrate command)."""

    backend: Literal["gloo", "nccl"] | None = Field(
        None, description="the torch.distributed backend measured: gloo (CPU) or nccl (GPU)"
    )
    nprocs: PosInt | None = Field(None, description="processes (ranks) measured")
    device: Version | None = Field(None, description="the torch device measured (cpu, cuda:0)")
    device_type: Version | None = Field(None, description="the torch device type: cpu or cuda")
    device_name: Version | None = Field(
        None,
        description="the device's name as CUDA reports it, or 'cpu (CPU model)'; a topology "
        "whose gpu.model is of another family gets a warning",
    )
    capability: Version | None = Field(None, description="CUDA compute capability, major.minor")
    sms: PosInt | None = Field(None, description="the GPU's streaming multiprocessors")
    memory_bytes: PosInt | None = Field(None, description="the GPU's memory, bytes")
    host: Version | None = Field(None, description="host name")
    machine: Version | None = Field(None, description="machine architecture (e.g. x86_64)")
    cpu: Version | None = Field(None, description="CPU model name")
    cpus: PosInt | None = Field(None, description="logical CPUs of the host")
    cores: PosInt | None = Field(
        None, description="cores the ranks shared (the measuring process's CPU affinity)"
    )
    threads_per_rank: PosInt | None = Field(
        None,
        description="torch threads of each rank; with nprocs and cores, the share of the "
        "host a run on a CPU topology is scaled against (sim.hardware.costs.host)",
    )
    python: Version | None = Field(None, description="Python version")
    torch: Version | None = Field(None, description="torch version")
    cuda: Version | None = Field(None, description="the CUDA version torch was built with")
    nccl: Version | None = Field(None, description="NCCL version")
    measured_at: Version | None = Field(
        None, description="when it was measured: UTC, ISO 8601, to the second"
    )
    dtypes: list[Dtype] | None = Field(None, description="the dtypes measured")
    # graph dtype -> the dtype the device really ran it in (a CPU runs bf16 as fp32)
    stand_ins: dict[Dtype, Dtype] | None = Field(
        None,
        description="graph dtype -> the dtype the device really ran it in (a CPU runs bf16 "
        "as fp32), whose fits stand for it",
    )
    rows: NonNegInt | None = Field(None, description="measurements the fits were made from")
    load: HostLoad | None = Field(None, description="how busy the host was while measuring")
    warnings: list[Annotated[str, Field(max_length=2000)]] | None = Field(
        None,
        description="problems the fit found (poor fits, implausible speeds, measurements left out)",
    )
    local_collectives_not_fitted: list[CollectiveKind] | None = Field(
        None,
        description="collective kinds measured on one rank only (a local copy), so not "
        "fitted as network costs",
    )


ComputeFits = dict[ComputeKind, Fit | Annotated[dict[Dtype, Fit], Field(min_length=1)]]


class CalibrationFile(Strict):
    format: Literal[2] = Field(FORMAT, description="the file format's version")
    meta: Meta = Field(Meta(), description="where and how it was measured")
    compute: ComputeFits = Field(
        {},
        description="fits t = alpha + beta * work per compute or copy kind (work: m*n*k for "
        "a GEMM with a shape, bytes otherwise); GEMMs per dtype",
    )
    collectives: dict[CollectiveKind, Annotated[list[GroupFit], Field(min_length=1)]] = Field(
        {},
        description="fits t = alpha + beta * bytes per collective kind, one per group size "
        "measured",
    )
    interference: Interference = Field(
        Interference(), description="measured relative speeds of stream kinds beside others"
    )
    dispatch: dict[Literal["stream", "cross"], Gap] = Field(
        {},
        description="seconds from ready to start: stream (after the stream's previous task) "
        "and cross (after a task of another stream)",
    )
    launch: dict[TaskKind, Gap] = Field(
        {},
        description="host seconds the executor spent issuing one task, per task kind "
        "(measured on a GPU; costs.launch takes the mean)",
    )
    gemm_shapes: list[GemmShape] = Field(
        [], description="GEMMs profiled at their exact shapes (calibrate --shapes-from)"
    )
    jitter: Quantiles = Field(
        {},
        description="run-to-run noise per op kind: quantiles of time / median time, evenly "
        "spaced in probability from 0 to 1",
    )

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
