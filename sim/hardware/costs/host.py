"""Ranks sharing one CPU host: its cores, its memory bandwidth, and gloo's all-to-all on it.

On a CPU topology (`shared_cpu:` in the topology, e.g. `localhost-cpu`) every rank is a
process of one machine, as the executor's gloo ranks are. R ranks of T torch threads on C
cores: the OS time-slices the R x T threads over the C cores, so a rank's kernels get
min(T, C / R) cores' worth of time. A compute figure was measured under some such share (a
calibration at 2 ranks of 1 thread on 2 cores: one core per rank), so a run under another
takes its kernels' times x (share measured / share now): at 4 ranks of 1 thread on those 2
cores, half a core each, 2x.

- Compute-bound kernels (GEMMs) scale with the cores alone (linearly in the threads a rank
  has: assumed, as a roofline would).
- Memory-bound kernels (elementwise and its stand-ins, copies) also share the host's memory
  bandwidth among the threads running at once, min(R x T, C): each streams at most
  `thread_mem_bw`, and all together at most `mem_bw`.
- A collective moves its bytes with the CPU too (gloo over TCP loopback), but a transfer
  keeps only part of a core busy (`comm_cores`, measured), so its beta grows only once the
  ranks' transfers want more than the cores: x max(1, R x comm_cores / C) against the
  calibration's. Its alpha (wake-ups of the waiting thread) is left as measured: at 4 ranks
  on 2 cores gloo's per-peer waits account for it (measured: sim.hardware.costs.gloo). Its
  growth with the group size is gloo's algorithm (sim.hardware.costs.gloo).
- Dispatch gaps (a woken thread's wait for a core) scale as the kernels do (assumed).

The reference share is the calibration's (its meta: nprocs, threads_per_rank and cores, which
`moesim calibrate` records) where one is used; otherwise the topology's own figures, which
are per core (one core per rank). A calibration that does not say its host is not scaled.
The model is static: it takes the ranks to run the same phase together (compute together,
exchange together), as a step bound by its collectives makes them do; a phase one rank runs
while the others wait in a collective is costed as if they all ran it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.core.kinds import COMPUTE_KINDS, COPY_KINDS
from sim.hardware.costs import gloo
from sim.hardware.costs.measured import _Delegate
from sim.hardware.costs.network import interpolate

MEMORY_BOUND = (COMPUTE_KINDS - {"gemm"}) | COPY_KINDS  # what the CPU executor streams


def this_host_cores() -> int:
    """Cores this process may run on: its CPU affinity, else the CPU count (as the executor
    counts them: exec.runtime.launch.host_cores)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_threads(cores: int, ranks: int) -> int:
    """Torch threads per rank as the executor sets them: the cores shared out, at least one
    (exec.runtime.launch.rank_threads)."""
    return max(1, cores // max(ranks, 1))


@dataclass(frozen=True)
class HostUse:
    """R ranks of T threads each on C cores."""

    ranks: int
    threads: int
    cores: int

    @property
    def cores_per_rank(self) -> float:
        return min(float(self.threads), self.cores / self.ranks)

    @property
    def running(self) -> float:
        """Threads on a core at any one time."""
        return float(min(self.ranks * self.threads, self.cores))

    @property
    def oversubscribed(self) -> bool:
        return self.ranks * self.threads > self.cores

    def mem_rate(self, thread_bw: float, host_bw: float | None) -> float:
        """Bytes/s one rank's memory-bound kernel streams."""
        each = thread_bw if host_bw is None else min(thread_bw, host_bw / self.running)
        return self.cores_per_rank * each

    def comm_load(self, comm_cores: float) -> float:
        """How many times over the ranks' transfers want the cores (at least 1)."""
        return max(1.0, self.ranks * comm_cores / self.cores)

    def describe(self) -> str:
        def n(k: int, what: str) -> str:
            return f"{k} {what}{'s' if k != 1 else ''}"

        return (
            f"{n(self.ranks, 'rank')} x {n(self.threads, 'thread')} on "
            f"{n(self.cores, 'core')} ({self.cores_per_rank:.3g} core per rank)"
        )


ONE_CORE = HostUse(1, 1, 1)  # what a topology's per-core figures were taken under


def calibrated_use(meta: dict[str, Any] | None) -> HostUse | None:
    """The host a calibration measured on (its meta), or None where it does not say."""
    if not meta or meta.get("device_type") not in (None, "cpu"):
        return None
    load = meta.get("load")
    load = load if isinstance(load, dict) else {}
    ranks = meta.get("nprocs")
    cores = meta.get("cores") or load.get("cores") or meta.get("cpus")
    if not ranks or not cores:
        return None
    threads = meta.get("threads_per_rank") or auto_threads(int(cores), int(ranks))
    return HostUse(int(ranks), int(threads), int(cores))


@dataclass(frozen=True)
class SharedCpu:
    """Ranks sharing one CPU host: the run's and the measured figures' shares."""

    run: HostUse  # the simulated run's host
    ref: HostUse  # what the cost figures were measured under
    ref_source: str
    thread_mem_bw: float
    mem_bw: float | None = None
    comm_cores: float = 0.6
    all_to_all: str = "gloo"

    @classmethod
    def build(
        cls,
        topo: Any,
        override: dict[str, Any] | bool | None,
        meta: dict[str, Any] | None = None,
        calibrated: bool = False,
    ) -> SharedCpu | None:
        """The host model of `topo` (its `shared_cpu`, fields replaced by `override`; None
        for a topology without one, or `override` false); `meta` is the calibration's."""
        spec = topo.spec.get("shared_cpu")
        if override is False or (spec is None and not override):
            return None  # a GPU topology: every rank has a device of its own
        if override is not None and not isinstance(override, dict):
            raise ConfigError(f"costs.shared_cpu: expected a mapping or false, got {override!r}")
        s = {**(spec or {}), **(override or {})}
        cores = s.get("cores") or "auto"
        cores = this_host_cores() if cores == "auto" else int(cores)
        ranks = int(topo.world_size)
        threads = s.get("threads_per_rank") or "auto"
        threads = auto_threads(cores, ranks) if threads == "auto" else int(threads)
        run = HostUse(ranks, threads, cores)
        ref, source = ONE_CORE, f"topology {topo.name}'s figures (one core per rank)"
        if calibrated:
            got = calibrated_use(meta)
            ref, source = (got, "the calibration's host") if got else (run, "not recorded")
        bw = s.get("thread_mem_bw") or topo.gpu.get("mem_bw")
        return cls(
            run,
            ref,
            source,
            float(bw),
            None if s.get("mem_bw") is None else float(s["mem_bw"]),
            float(s.get("comm_cores", 0.6)),
            str(s.get("all_to_all") or "gloo"),
        )

    # -- the factors (x the measured time) ---------------------------------------------------
    @property
    def compute_factor(self) -> float:
        return self.ref.cores_per_rank / self.run.cores_per_rank

    @property
    def memory_factor(self) -> float:
        bw, host = self.thread_mem_bw, self.mem_bw
        return self.ref.mem_rate(bw, host) / self.run.mem_rate(bw, host)

    @property
    def comm_factor(self) -> float:
        return self.run.comm_load(self.comm_cores) / self.ref.comm_load(self.comm_cores)

    def factor(self, kind: str) -> float:
        if kind == "gemm":
            return self.compute_factor
        return self.memory_factor if kind in MEMORY_BOUND else 1.0

    def collective_params(
        self, kind: str, ranks: int, rows: list[tuple[int, float, float]]
    ) -> tuple[float, float]:
        """(alpha, beta) of `kind` at `ranks` from fits by group size (CollectiveAlphaBeta's
        `adjust`): an all-to-all carried from the nearest measured group size as gloo runs
        it, others as the fits interpolate; beta x the collectives' factor (bytes through the
        shared cores). Fits for every group size (ranks 1) are taken as they are."""
        if self.all_to_all == "gloo" and kind in gloo.GLOO_KINDS and rows[0][0] >= 2:
            n0, a0, b0 = min(rows, key=lambda r: (abs(math.log2(r[0] / ranks)), r[0]))
            a, b = gloo.extrapolate(n0, a0, b0, ranks, 2.0 / self.thread_mem_bw)
        else:
            a, b = interpolate(rows, ranks)
        return a, b * self.comm_factor

    def warning(self, network: str = "collective") -> str | None:
        """When the run's threads outnumber the cores: what the model makes of it."""
        if not self.run.oversubscribed:
            return None
        r = self.run
        coll = (
            f" and collectives' bytes {self.comm_factor:.2f}x"
            if network == "collective"
            else " (flows: the topology's links, not scaled)"
        )
        return (
            f"{r.ranks} ranks x {r.threads} threads per rank = {r.ranks * r.threads} threads "
            f"on {r.cores} cores: the ranks share cores; kernels and dispatch gaps modelled "
            f"{self.compute_factor:.2f}x, memory-bound kernels {self.memory_factor:.2f}x"
            f"{coll} their measured times"
        )

    def describe(self, network: str = "collective") -> dict[str, Any]:
        """For the run's cost sources (CostModel.cost_sources); `network` the run's mode: in
        flow mode the collectives are the topology's links, not scaled here."""
        return {
            "run": self.run.describe(),
            "reference": f"{self.ref.describe()}: {self.ref_source}",
            "compute_factor": self.compute_factor,
            "memory_factor": self.memory_factor,
            "collective_factor": self.comm_factor if network == "collective" else None,
            "all_to_all": self.all_to_all,
            "warning": self.warning(network),
        }


@dataclass
class HostCompute(_Delegate):
    """The compute model's times x the host's factor for the task's kind (SharedCpu)."""

    inner: Any
    host: SharedCpu

    def duration(self, task: Task) -> float:
        return float(self.inner.duration(task)) * self.host.factor(task.kind)

    def fit_for(self, kind: str, dtype: str | None) -> tuple[float, float] | None:
        """The inner model's (alpha, beta) at this host (what PipeMoE's selector reads)."""
        fit = getattr(self.inner, "fit_for", None)
        p = fit(kind, dtype) if fit is not None else None
        if p is None:
            return None
        f = self.host.factor(kind)
        return p[0] * f, p[1] * f
