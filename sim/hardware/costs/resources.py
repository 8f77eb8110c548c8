"""GPU-internal resources: streaming multiprocessors, HBM bandwidth, copy engines, hardware queues.

A kernel may reserve SMs (`Task.sms`: a communication kernel such as DeepEP's, or a copy kernel
launched on a fixed grid of one block per SM). While kernels holding k SMs in total run on a
GPU of S SMs, every other kernel on that GPU (compute kinds and device copies; not
communication, whose kernels hold their own SMs, nor host copies) runs at

    speed = sm_speed(k) * mem_factor(u)

SMs (fitted to `sm_spin.csv`, shared/reference/measurements/h100-sxm-2026-11-23): an Amdahl
split of the kernel's time,

    sm_speed(k) = sm_penalty / ((1 - sm_share) + sm_share * S / (S - k))      (k > 0)

`sm_share` of the time scales with the SMs left (the tensor-core main loop); the rest does not
(it is bound by what the reservation does not take: L2 and HBM bandwidth, and a power-capped
clock that rises when fewer SMs draw power). `sm_penalty` is the constant step a GEMM loses as
soon as any SM is taken: its tile grid, sized for all S SMs, no longer fills the waves evenly
(0.94 at k = 1 and 4 on an H100). With `sm_share = sm_penalty = 1` it is the ideal (S - k)/S,
the closed form the tests pin. k is capped at S - 1: the block scheduler always lets the other
kernel's blocks in somewhere.

Memory bandwidth (fitted to `sm_contention.csv`): a reserving kernel that moves bytes takes a
share u of the GPU's HBM bandwidth (its bytes over its duration, over `gpu.mem_bw`, summed over
the streaming kernels running, at most 1). Beyond a knee the other kernels' operands start
waiting on HBM:

    mem_factor(u) = max(0.05, 1 - mem_slope * max(0, u - mem_knee))

Below the knee (`mem_knee`, the bandwidth a GEMM leaves idle because its tiles are served from
L2 and shared memory) a streaming neighbour costs nothing beyond its SMs. A streaming kernel is
itself bounded by the SMs it holds: `sm_bw` bytes/s per SM (a copy kernel of k blocks reaches
about k x 90 GB/s on an H100 up to the HBM limit), so its duration is at least bytes/(k sm_bw).
Communication kernels that reserve SMs count only their SMs unless their task gives the
share of HBM bandwidth their kernel takes (tag `hbm_share`, summed with the streaming
kernels'). That share is not below the fitted knee in general: an NCCL ring all-gather on 8
H100s receives ~370 GB/s per GPU over NVLink and moves ~3 bytes of HBM per byte received
(the peer's write into its FIFO, its read, the write to the output), ~0.33 of the HBM, and
on Blackwell ~0.3 (`sim.training.contention` states it for the step model's collectives).
`comm_sms` gives every communication task that names no SMs of its own that many: NCCL runs a
collective as one thread block per channel, each on an SM, for as long as the kernel is
resident (shared/reference/overlap-strategies.md, "pitfalls"), so compute beside it loses them.
Its default is 0, where communication is costed by the interference table alone, as before.
`coll_sms` / `coll_sms_net` are the SMs (CTAs, one per NCCL channel) that NCCL's ring
all-gather or reduce-scatter of a large buffer holds inside one NVLink domain / across
domains: the training step model (`sim.training.contention`) slows the compute that runs
beside such an overlapped collective by `speed(k, u)`. The engine does not read them. Default
0: overlapped collectives cost the compute beside them nothing, as before.
`comm_sm_bw` bounds what a communication kernel holding k SMs can send: a rank's part of a
collective ends no sooner than its bytes / (k comm_sm_bw) after the collective started, even
where its links would carry them faster (a roofline on the kernel; the flows themselves are
not slowed, so links the kernel leaves idle are not handed to others). Unset (None), SMs
bound nothing, as before. DeepEP's normal kernels are SM-bound on NVLink at about 14 GB/s
per SM: 24 SMs reach 337 GB/s on an H20 whose links carry more, and the maintainers advise
more SMs for more bandwidth (DeepEP issue #16); 20 SMs reach 287-329 GB/s (combine,
dispatch) on 8 H100 (tile-ai/tilescale PR #40). Only kernels that reserve SMs of their own
(`Task.sms`: DeepEP's) are bounded; NCCL's `comm_sms` take SMs from the compute beside them,
but no measurement here gives their send rate per SM.
`comm_sm_efficiency` is the share of its links' rate such a kernel (one that holds SMs of its
own) reaches when its SMs do not bind: its flows take 1 / efficiency of the link time per
byte (flow mode: the bytes it puts on each link are scaled; collective mode: its duration).
It stands for what a kernel that copies through SMs loses beside the line rate (chunked ring
buffers, signalling, per-token metadata). Default 1: as before. The Hopper presets set 0.865,
fitted to DeepEP's published H800 figures (benchmarks/deepep_h800.py: intranode EP8
153 / 158 GB/s, internode EP16 / 32 / 64 43 / 58 / 51 GB/s RDMA, against the line-rate sim).
Scaling bytes, not capping rates, keeps the max-min solver as it is; the difference shows only
where another flow shares the link with such a kernel's, and then it errs against the kernel.

Copy engines: d2h and h2d copies take no SMs and no share of the SMs' speed (finding 4: a GEMM
and a concurrent pinned d2h run at speed 1.0 both ways); the schema refuses `sms` on them.

Hardware queues (`max_connections`, CUDA_DEVICE_MAX_CONNECTIONS; CUDA C++ Programming Guide,
"CUDA Environment Variables": 1 to 32, default 8): see `sim.engine.queues`.

Host launch thread (`launch_s`, seconds of host time per task launched; `sim.engine.launch`):
default 0 (launches free, as before). `LAUNCH_S` below (5 us) is the value the benchmarks
use: assumed, the order of the host-side cost of one CUDA kernel launch commonly reported for
recent GPUs and drivers (4-6 us for an empty kernel through the runtime API); not measured on
our machine (shared/reference/measurements has no launch measurement). It is the host's time,
not the GPU's: `gpu.gemm.launch_s` is the device-side gap a GEMM kernel adds to its own run.

How this composes with the interference table (`costs.interference`): the two multiply. The
table stays the fallback for kernels that do not say what they hold (a stream kind's measured
slowdown); the resources act only where a task reserves SMs. A table calibrated on a run whose
communication kernels reserved SMs already contains their loss: give the SMs in one place.
Every preset's table is 1.0, so presets never count both.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sim.core.errors import ConfigError

DEFAULT_MAX_CONNECTIONS = 8  # CUDA C++ Programming Guide, CUDA_DEVICE_MAX_CONNECTIONS default
MAX_CONNECTIONS = 32  # the same guide: the variable takes 1 to 32
MAX_COMM_SMS = 1024  # above any GPU's SM count; the engine checks it against the GPU's
LAUNCH_S = 5e-6  # assumed: a CUDA kernel launch's host cost (see the module docstring)
MIN_MEM_FACTOR = 0.05  # a kernel never stalls completely: the HBM arbiter serves every client


@dataclass(frozen=True)
class Resources:
    """The GPU's SM count and the fitted resource model (see the module docstring).

    `sms` is None when the topology names no SM count; then no task may reserve SMs.
    """

    sms: int | None = None
    mem_bw: float = 0.0  # bytes/s, the GPU's HBM bandwidth (gpu.mem_bw)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    comm_sms: int = 0  # SMs a communication kernel holds unless its task names its own
    sm_penalty: float = 1.0
    sm_share: float = 1.0
    sm_bw: float | None = None
    mem_knee: float = 0.0
    mem_slope: float = 0.0
    launch_s: float = 0.0  # host seconds to launch one task (sim.engine.launch); 0: free
    comm_sm_bw: float | None = None  # bytes/s a communication kernel sends per SM it holds
    comm_sm_efficiency: float = 1.0  # share of its links' rate such a kernel reaches
    coll_sms: int = 0  # SMs an NCCL ring all-gather / reduce-scatter holds in an NVLink domain
    coll_sms_net: int = 0  # the same across NVLink domains (over the network)

    @classmethod
    def build(cls, gpu: dict[str, Any], spec: Any) -> Resources:
        """From the topology's `gpu.sms`, `gpu.resources` and the run's `costs.resources`
        (which overrides field by field)."""
        sms = gpu.get("sms")
        if sms is None:
            sms = (gpu.get("gemm") or {}).get("sms")
        vals: dict[str, Any] = {}
        for where, raw in (("gpu.resources", gpu.get("resources")), ("costs.resources", spec)):
            if raw is None:
                continue
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
            for k, v in raw.items():
                vals[k] = _check(where, k, v)
        mem_bw = float(gpu.get("mem_bw") or 0.0)
        return cls(None if sms is None else int(sms), mem_bw, **vals)

    # -- SMs and bandwidth ------------------------------------------------------------------
    def sm_speed(self, k: int) -> float:
        """Speed of a kernel beside reservations of k SMs in total (1 at k = 0)."""
        if k <= 0 or self.sms is None:
            return 1.0
        S = self.sms
        k = min(k, S - 1)
        return self.sm_penalty / ((1.0 - self.sm_share) + self.sm_share * S / (S - k))

    def mem_factor(self, u: float) -> float:
        """Speed factor of a kernel while streaming kernels take a share u of HBM bandwidth."""
        if u <= self.mem_knee or self.mem_slope == 0:
            return 1.0
        return max(MIN_MEM_FACTOR, 1.0 - self.mem_slope * (min(u, 1.0) - self.mem_knee))

    def speed(self, k: int, u: float) -> float:
        return self.sm_speed(k) * self.mem_factor(u)

    def stream_duration(self, sms: int, nbytes: float, duration: float) -> float:
        """A kernel on `sms` SMs moving `nbytes`: no faster than its SMs' load/store rate."""
        if self.sm_bw is None or sms <= 0 or nbytes <= 0:
            return duration
        return max(duration, nbytes / (sms * self.sm_bw))

    def comm_floor(self, sms: int, nbytes: float) -> float:
        """Seconds a communication kernel on `sms` SMs needs at least to send `nbytes`."""
        if self.comm_sm_bw is None or sms <= 0 or nbytes <= 0:
            return 0.0
        return nbytes / (sms * self.comm_sm_bw)

    def wire_factor(self, sms: int) -> float:
        """Link time per byte of a communication kernel on `sms` SMs of its own, relative to
        the links' rate (1 / `comm_sm_efficiency`; 1 for kernels that hold none)."""
        return 1.0 / self.comm_sm_efficiency if sms > 0 else 1.0

    def mem_share(self, nbytes: float, duration: float) -> float:
        """The share of HBM bandwidth a kernel moving `nbytes` in `duration` takes."""
        if nbytes <= 0 or self.mem_bw <= 0:
            return 0.0
        if duration <= 0:
            return 1.0
        return min(1.0, nbytes / duration / self.mem_bw)


_FIELDS = {f.name for f in fields(Resources)} - {"sms", "mem_bw"}


def _check(where: str, key: str, v: Any) -> Any:
    if key not in _FIELDS:
        raise ConfigError(f"{where}: unknown field {key!r} (known: {sorted(_FIELDS)})")
    num = not isinstance(v, bool) and isinstance(v, (int, float))
    if key == "max_connections":
        if not (num and isinstance(v, int) and 1 <= v <= MAX_CONNECTIONS):
            raise ConfigError(
                f"{where}.max_connections: expected an integer in [1, {MAX_CONNECTIONS}] "
                f"(CUDA_DEVICE_MAX_CONNECTIONS), got {v!r}"
            )
        return v
    if key in ("comm_sms", "coll_sms", "coll_sms_net"):
        if not (num and isinstance(v, int) and 0 <= v <= MAX_COMM_SMS):
            raise ConfigError(
                f"{where}.{key}: expected an integer in [0, {MAX_COMM_SMS}] (SMs a "
                f"communication kernel holds), got {v!r}"
            )
        return v
    ranges = {
        "sm_penalty": (0.0, 1.0, "a speed in (0, 1]"),
        "sm_share": (0.0, 1.0, "a share of the time in (0, 1]"),
        "mem_knee": (-1.0, 1.0, "a bandwidth share in [0, 1]"),
        "mem_slope": (-1.0, 100.0, "a slope in [0, 100]"),
        "sm_bw": (0.0, 1e15, "bytes/s per SM in (0, 1e15]"),
        "comm_sm_bw": (0.0, 1e15, "bytes/s a communication kernel sends per SM, in (0, 1e15]"),
        "launch_s": (-1.0, 1.0, "host seconds per task launch in [0, 1]"),
        "comm_sm_efficiency": (0.0, 1.0, "a share of the links' rate in (0, 1]"),
    }
    lo, hi, what = ranges[key]
    lo_ok = num and (v > lo if lo >= 0 else v >= 0)
    if not (lo_ok and v <= hi):
        raise ConfigError(f"{where}.{key}: expected {what}, got {v!r}")
    return float(v)
