"""The schema of cost parameters, wherever they are given: a topology's `gpu:` section, a run
config's `costs:` section, a calibration file. One model per parameter family, so that an
alpha-beta fit or an interference row has the same ranges in all three places.

Ranges are what the cost models can use without producing nonsense: times finite and >= 0
(and below a second where they are per-message or per-launch), efficiencies and relative
speeds in (0, 1], fits with the group sizes they were measured at.
"""

# Annotations evaluated as the classes are made (no `from __future__ import annotations`):
# as strings, pydantic would compile and evaluate each field's at start-up (~1% of a small
# `moesim simulate`). A method returning its own class names it in quotes.

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from sim.core.kinds import (
    ALL_KINDS,
    COLLECTIVE_KINDS,
    COMPUTE_KINDS,
    COPY_KINDS,
    DTYPES,
    GEMM_LAYOUTS,
)
from sim.core.schema import Fraction, PosInt, Strict

STREAM_KINDS = ("compute", "comm", "copy")
MAX_JITTER_FACTOR = 1e3  # a run 1000x its median is a broken measurement, not noise

Seconds = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # a latency, a launch
# Literals built from the kinds' one definition (sim.core.kinds): pydantic checks them at run
# time; a type checker cannot evaluate a Literal of a computed tuple, so to it they are str.
if TYPE_CHECKING:
    CollectiveKind = str
    Dtype = str
    ComputeKind = str
    JitterKind = str
    Layout = str
    TaskKind = str
else:
    CollectiveKind = Literal[tuple(sorted(COLLECTIVE_KINDS))]
    Dtype = Literal[DTYPES]
    # the task kinds a compute model costs (alpha_beta keys): compute kernels and copies
    ComputeKind = Literal[tuple(sorted(COMPUTE_KINDS | COPY_KINDS))]
    # jitter quantiles: per task kind, or per stream kind as the fallback of its kinds
    JitterKind = Literal[tuple(sorted(ALL_KINDS | set(STREAM_KINDS)))]
    Layout = Literal[GEMM_LAYOUTS]
    TaskKind = Literal[tuple(sorted(ALL_KINDS))]  # any task's kind (costs.launch)


class RooflineParams(Strict):
    """t = launch + max(flops / (peak * flops_efficiency), bytes / (mem_bw * mem_efficiency))."""

    launch_s: Seconds | None = Field(
        None, description="seconds added to every compute task (kernel launch and tail); default 0"
    )
    flops_efficiency: Fraction | None = Field(
        None, description="share of the dtype's peak FLOP/s a kernel reaches, in (0, 1]; default 1"
    )
    mem_efficiency: Fraction | None = Field(
        None,
        description="share of the GPU's memory bandwidth (gpu.mem_bw) a kernel reaches, in "
        "(0, 1]; default 1",
    )


class CostsRoofline(RooflineParams):
    """`costs.roofline`: the GPU's roofline parameters overridden for one run, and whether
    GEMMs with a shape take the GPU's GEMM model (`gpu.gemm`: waves of output tiles)."""

    gemm_model: bool | None = Field(
        None,
        description="false: GEMMs take the plain roofline too, not the GPU's GEMM model "
        "(waves of output tiles over the SMs); default true where the GPU has one",
    )


class AlphaBeta(Strict):
    """t = alpha + beta * work (PipeMoE Eq. 13 for compute, Eq. 16 for collectives): alpha
    a start-up below a second, beta seconds per unit of work (a flop, a byte) below 1e-3
    (slower than 1 KB/s is a broken fit, not a machine)."""

    alpha: Seconds = Field(description="start-up seconds per operation, below one second")
    beta: Annotated[float, Field(ge=0, le=1e-3, allow_inf_nan=False)] = Field(
        description="seconds per unit of work: per m*n*k (times batch) for a GEMM with a "
        "shape, per byte otherwise; for a collective, per byte each rank sends"
    )
    source: str | None = Field(
        None,
        description="where the fit comes from (a paper's figure, a measurement): "
        "documentation, the simulator ignores it",
    )


class CollectiveFit(AlphaBeta):
    ranks: PosInt | None = Field(
        None,
        description="group size the fit was measured at (needed in a list of fits); between "
        "listed sizes alpha and beta are interpolated in log2(ranks), outside them the nearest "
        "size's fit applies",
    )


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


SPEEDS = (
    "relative speed of {kind}, in (0, 1], while the other stream kinds a key names run on the "
    "same GPU: keys {others}; a missing key is speed 1"
)


class Interference(Strict):
    """Relative speed (<= 1) of a stream kind while others run (MPipeMoE Fig. 3)."""

    compute: SpeedRow | None = Field(
        None, description=SPEEDS.format(kind="compute kernels", others="comm, copy, comm+copy")
    )
    comm: SpeedRow | None = Field(
        None, description=SPEEDS.format(kind="communication", others="compute, copy, compute+copy")
    )
    copy_: SpeedRow | None = Field(  # `copy` is BaseModel's
        default=None,
        alias="copy",
        description=SPEEDS.format(kind="copies", others="compute, comm, compute+comm"),
    )

    @field_validator("compute", "comm", "copy_")
    @classmethod
    def _keys(cls, row: SpeedRow | None, info: ValidationInfo) -> SpeedRow | None:
        if row is not None:
            check_interference({(info.field_name or "").rstrip("_"): row})
        return row


class DispatchParams(Strict):
    """Seconds from ready to start: after the stream's previous task / another stream's."""

    stream: Seconds | None = Field(
        None,
        description="seconds from ready to start when the stream's previous task just "
        "finished (a kernel launch gap); default 0",
    )
    cross: Seconds | None = Field(
        None,
        description="seconds from ready to start when the task waited on a task of another "
        "stream (an event wait, a woken thread); default 0",
    )


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

    sms: Annotated[int, Field(gt=0, le=100_000)] = Field(
        description="streaming multiprocessors the output tiles are spread over, in waves"
    )
    efficiency: Annotated[dict[Dtype, Fraction], Field(min_length=1)] = Field(
        description="per dtype: share of its peak FLOP/s a tile's main loop reaches, in (0, 1]"
    )
    tiles: Tiles | Annotated[dict[str, Tiles], Field(min_length=1)] = Field(
        description="CTA tile shapes [[Tm, Tn], ...] the library picks from, or a mapping of "
        "dtypes and 'default' (required) to such lists"
    )
    k_step: Annotated[int, Field(gt=0, le=2**20)] | None = Field(
        None, description="a tile reduces over k in steps of this many elements; default 64"
    )
    tile_overhead_k: Annotated[float, Field(ge=0, le=2**31, allow_inf_nan=False)] | None = Field(
        None,
        description="a tile's fixed cost (pipeline fill, epilogue) as this much more k; default 0",
    )
    launch_s: Seconds | None = Field(None, description="seconds added once per GEMM; default 0")
    read_efficiency: Fraction = Field(
        description="share of gpu.mem_bw reached reading the operands A and B, in (0, 1]"
    )
    write_efficiency: Fraction = Field(
        description="share of gpu.mem_bw reached writing the output, in (0, 1]"
    )
    split_k: Annotated[list[Annotated[int, Field(gt=0, le=4096)]], Field(min_length=1)] | None = (
        Field(
            None,
            description="splits of k tried when the tiles leave SMs idle, 1 among them; "
            "default [1] (no split)",
        )
    )
    split_k_s: Seconds | None = Field(
        None,
        description="seconds of the split-K reduction kernel, added to a split GEMM; default 0",
    )
    split_k_min_depth: Annotated[int, Field(gt=0, le=2**31)] | None = Field(
        None, description="no split leaves a CTA less of k than this; default 512"
    )
    unaligned_efficiency: Fraction | None = Field(
        None,
        description="compute rate, relative to aligned, of a GEMM with a leading dimension "
        "that is not a multiple of alignment_bytes, in (0, 1]; default 1",
    )
    alignment_bytes: Annotated[int, Field(gt=0, le=4096)] | None = Field(
        None,
        description="bytes a leading dimension must be a multiple of for the fast (TMA, "
        "tensor-core) kernels; default 16",
    )

    @field_validator("tiles")
    @classmethod
    def _tile_keys(cls, v: object) -> object:
        if isinstance(v, dict) and not set(v) <= {"default", *DTYPES}:
            raise ValueError(f"keys must be 'default' or dtypes ({', '.join(DTYPES)})")
        return v


class ResourceParams(Strict):
    """A topology's `gpu.resources` or a run's `costs.resources`: the GPU-internal resource
    model (`sim.hardware.costs.resources`, whose docstring gives each parameter's role)."""

    max_connections: Annotated[int, Field(ge=1, le=32)] | None = Field(
        None,
        description="hardware queues a rank's streams share, each starting kernels in host "
        "issue order (CUDA_DEVICE_MAX_CONNECTIONS: 1 to 32); default 8",
    )
    comm_sms: Annotated[int, Field(ge=0, le=1024)] | None = Field(
        None,
        description="SMs each communication kernel holds unless its task names its own (NCCL: "
        "a block per channel); compute beside it runs on the others; default 0",
    )
    sm_penalty: Fraction | None = Field(
        None,
        description="speed a kernel keeps as soon as any SM is reserved beside it (its tile "
        "grid no longer fills the waves evenly), in (0, 1]; default 1",
    )
    sm_share: Fraction | None = Field(
        None,
        description="share of a kernel's time that scales with the SMs left to it (an Amdahl "
        "split), in (0, 1]; default 1",
    )
    sm_bw: Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False)] | None = Field(
        None,
        description="bytes/s per SM a streaming kernel that reserves SMs moves at most; "
        "default: no bound",
    )
    mem_knee: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="share of HBM bandwidth streaming neighbours take before other kernels "
        "slow down; default 0",
    )
    mem_slope: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = Field(
        None,
        description="speed lost per share of HBM bandwidth beyond mem_knee (factor "
        "max(0.05, 1 - mem_slope * (u - mem_knee))); default 0: no bandwidth term",
    )
    launch_s: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="host seconds a rank's launch thread spends per task it launches "
        "(sim.engine.launch); default 0: launches are free",
    )
    comm_sm_bw: Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False)] | None = Field(
        None,
        description="bytes/s per SM a communication kernel holding SMs of its own sends at "
        "most; default: no bound",
    )
    comm_sm_efficiency: Fraction | None = Field(
        None,
        description="share of its links' rate a communication kernel holding SMs of its own "
        "reaches, in (0, 1]; default 1",
    )
    coll_sms: Annotated[int, Field(ge=0, le=1024)] | None = Field(
        None,
        description="SMs (one CTA per channel) an NCCL ring all-gather or reduce-scatter of a "
        "large buffer holds inside one NVLink domain; the training step model slows compute "
        "overlapped with such a collective (FSDP, the distributed optimizer); default 0",
    )
    coll_sms_net: Annotated[int, Field(ge=0, le=1024)] | None = Field(
        None,
        description="SMs the same collective holds when its group spans NVLink domains (its "
        "rings cross the network); default 0",
    )


class SharedCpu(Strict):
    """A topology's `shared_cpu` or a run's `costs.shared_cpu`: the ranks are processes on
    one CPU host sharing its cores and memory bandwidth (sim.hardware.costs.host)."""

    cores: PosInt | Literal["auto"] | None = Field(
        None,
        description="cores the ranks share; auto: this machine's (its CPU affinity) when "
        "simulating; default auto",
    )
    threads_per_rank: PosInt | Literal["auto"] | None = Field(
        None,
        description="torch threads of each rank; auto: as the executor sets them, the cores "
        "shared out, at least 1 (exec.runtime.launch.rank_threads); default auto",
    )
    thread_mem_bw: Annotated[float, Field(ge=1e3, le=1e15, allow_inf_nan=False)] | None = Field(
        None, description="bytes/s one thread streams when alone; default gpu.mem_bw"
    )
    mem_bw: Annotated[float, Field(ge=1e3, le=1e15, allow_inf_nan=False)] | None = Field(
        None,
        description="bytes/s the host's memory serves to all running threads together; "
        "default: no shared bound",
    )
    comm_cores: Annotated[float, Field(ge=0, le=64, allow_inf_nan=False)] | None = Field(
        None,
        description="cores a rank's collective keeps busy while it moves bytes (gloo over TCP "
        "loopback); its beta grows once the ranks want more than the cores; default 0.6",
    )
    all_to_all: Literal["gloo", "fit"] | None = Field(
        None,
        description="a fitted all-to-all at another group size: gloo (as gloo::alltoall runs "
        "it: a local copy, then a chunk to and from each of the n - 1 peers and a wait for "
        "each) or fit (the nearest fit, interpolated in log2(ranks)); default gloo",
    )
