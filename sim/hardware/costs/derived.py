"""Alpha-beta fits derived from a cluster's own models, for where no fit was given.

PipeMoE (Sec. IV-A, Fig. 6) fits t = alpha + beta * size to measurements of GEMMs and
all-to-alls on its cluster. The collective-level network model (`costs.network: collective`)
and PipeMoE's Theorem 1 selector need such fits; a topology with measured fits carries them
(`collectives:` and `gpu.alpha_beta`, e.g. pipemoe-2080ti). For any other topology they are
derived here the same way PipeMoE derives them, with the simulator's models standing in for
the hardware:

- a collective of `ranks` members: the members are ranks 0..ranks-1 (consecutive, as an
  expert-parallel group is laid out), the default algorithm's phases are timed at two payloads
  under max-min sharing of the topology's links (every flow at the rate the solver gives it
  with all of the phase's flows present, each phase as slow as its slowest flow, plus local
  copies at the compute model's time), and alpha, beta are the line through the two points;
- a GEMM: least squares over the given shapes, with relative residuals (small and large
  GEMMs fit alike), of the compute model's times against the work m*n*k*batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.core.graph import Task
from sim.hardware import collectives as coll
from sim.hardware.network.layouts import pair_mask, per_flow
from sim.hardware.network.maxmin import max_min_rates
from sim.hardware.topology import Topology

PROBE_BYTES = (2.0**20, 2.0**28)  # payloads per rank of the two timed points: 1 MiB, 256 MiB
DERIVABLE = (
    "all_to_all",
    "all_to_allv",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "broadcast",
    "send",
)


def collective_fit(
    topo: Topology, alpha: float, compute: Any, kind: str, ranks: int
) -> tuple[float, float]:
    """(alpha, beta) of `kind` over ranks 0..ranks-1 (module doc); `alpha` is the per-message
    start-up of the flow model, `compute` the model local copies are timed with."""
    ranks = max(2, min(int(ranks), topo.world_size))
    t1, t2 = (_time(topo, alpha, compute, kind, ranks, b) for b in PROBE_BYTES)
    beta = (t2 - t1) / (PROBE_BYTES[1] - PROBE_BYTES[0])
    return max(t1 - beta * PROBE_BYTES[0], 0.0), beta


def _time(topo: Topology, alpha: float, compute: Any, kind: str, n: int, nbytes: float) -> float:
    if kind == "send":  # rank 0 to rank 1, as a point-to-point task is costed (2 members)
        phase = coll.ExplicitPhase(np.array([0]), np.array([1]), np.array([nbytes]))
        return _phase_time(topo, alpha, compute, phase)
    kind = "all_to_all" if kind == "all_to_allv" else kind  # the uniform exchange stands in
    group = list(range(n))
    tasks = [
        Task(f"probe{r}", r, "comm", kind, bytes=nbytes, group=group, coll="probe") for r in group
    ]
    return sum(_phase_time(topo, alpha, compute, p) for p in coll.phases(tasks, topo))


def _phase_time(topo: Topology, alpha: float, compute: Any, phase: Any) -> float:
    if isinstance(phase, coll.LocalPhase):  # a copy reads and writes its bytes
        return float(
            compute.duration(Task("probe/d2d", 0, "copy", "d2d", bytes=2.0 * phase.nbytes))
        )
    if isinstance(phase, coll.UniformPhase):
        mem = phase.members
        src, dst = np.repeat(mem, len(mem)), np.tile(mem, len(mem))
        keep = pair_mask(topo, src, dst, phase.pairs)
        nb = np.full(int(keep.sum()), float(phase.per_pair))
        batch = per_flow(topo, src[keep], dst[keep], nb, alpha, phase.relay)
    else:
        batch = per_flow(topo, phase.src, phase.dst, phase.nbytes, alpha, phase.relay)
    if len(batch) == 0:
        return 0.0
    links, compact = np.unique(batch.inc_l, return_inverse=True)
    rate = max_min_rates(len(batch), batch.inc_b, compact, batch.inc_m, topo.link_cap[links])
    return float(np.max(batch.latency + batch.nbytes / rate))


def gemm_fit(compute: Any, shapes: list[dict[str, int]], dtype: str) -> tuple[float, float]:
    """(alpha, beta) of t = alpha + beta * work over `shapes` ({batch, m, n, k}), timed by
    the compute model; with one distinct work size, the line through the origin."""
    works, times = [], []
    for s in shapes:
        b, m, n, k = (int(s.get("batch", 1)), int(s["m"]), int(s["n"]), int(s["k"]))
        if min(b, m, n, k) < 1:
            continue
        work = float(b) * m * n * k
        task = Task(
            "probe/gemm",
            0,
            "compute",
            "gemm",
            flops=2.0 * work,
            shape=dict(s),
            tags={"dtype": dtype},
        )
        works.append(work)
        times.append(float(compute.duration(task)))
    x, t = np.array(works), np.array(times)
    if len(set(works)) < 2:
        return 0.0, float(t.mean() / x.mean()) if len(x) else 0.0
    # relative residuals: rows scaled by 1/t, so each point weighs by its relative error
    a = np.stack([1.0 / t, x / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:  # a start-up below zero is no start-up: refit the slope alone
        alpha, beta = 0.0, float(np.sum(x * t / t**2) / np.sum(x * x / t**2))
    return float(alpha), float(beta)
