"""Parm's choice between S1 and S2 (Sec. V, Algorithm 1) from per-group alpha-beta fits.

Each collective a schedule runs on its own group has the cost t(x) = alpha + beta * x (Eq.
12; x the bytes of a rank's buffer), with alpha and beta of that group: the EP&ESP-AlltoAll
over the replica's P ranks, the MP-AllGather over an MP group, and for S2 with SAA the
overlapped AlltoAll + AllGather measured as one operation (Eq. 14's "overlapped" terms).
Parm measures them on the cluster at several sizes and fits them by least squares (Sec.
V-B, Fig. 6); here the cluster is the simulated one: each group's collective is timed alone
on the model (the engine on a graph of that one collective; a measurement, not the
strategy's graph), at sizes from 256 KiB to 128 MiB per rank, and fitted the same way.

Over a training iteration (forward and backward, which run the same collectives):
    t_S1 = 2 (2 t_a2a(N_ESP |D1|) + t_ag(T M / N_MP))                       (Eq. 13)
    t_S2 = 2 (t_a2a(N_ESP |D2|) + t_saa(N_ESP |D2|))      with SAA          (Eq. 14)
    t_S2 = 2 (2 t_a2a(N_ESP |D2|) + t_ag(|D2|))           without
Beyond the paper, each side also adds its schedule's computation on one rank (the cluster's
compute model on the schedule's own compute tasks, forward and backward): S2 gates and
decodes all T tokens on every MP rank where S1 handles T/N_MP, which decides the near-ties
where both move about the same bytes (on `pipemoe-2080ti` the paper's communication-only
comparison picked the slower of two schedules 0.1% apart in 11% of a grid sample). The
schedule with the smaller time is chosen (ties: S1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.parm.volumes import Degrees, Volumes, volumes
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout

FIT_BYTES = (256 * 1024, 2 * 1024**2, 16 * 1024**2, 128 * 1024**2)
_CACHE: dict[tuple, tuple[Any, Any, Fit]] = {}


@dataclass(frozen=True)
class Fit:
    alpha: float
    beta: float

    def __call__(self, x: float) -> float:
        return self.alpha + self.beta * x


@dataclass(frozen=True)
class Choice:
    schedule: str  # "s1" or "s2"
    t_s1: float
    t_s2: float
    fits: dict[str, Fit]

    def as_meta(self) -> dict[str, Any]:
        fits = {k: {"alpha": f.alpha, "beta": f.beta} for k, f in self.fits.items()}
        return {"chosen": self.schedule, "t_s1": self.t_s1, "t_s2": self.t_s2, "fits": fits}


def predict(v1: Volumes, v2: Volumes, fits: dict[str, Fit], saa: bool) -> tuple[float, float]:
    """(t_S1, t_S2) of one iteration, Eq. 13 and 14."""
    if v1.deg.mp == 1:  # no MP group: S1 and S2 are the same EP&ESP exchanges
        return 4 * fits["a2a"](v1.a2a), 4 * fits["a2a"](v2.a2a)
    t1 = 2 * (2 * fits["a2a"](v1.a2a) + fits["ag"](v1.mp_gather))
    if saa:
        t2 = 2 * (fits["a2a"](v2.a2a) + fits["saa"](v2.a2a))
    else:
        t2 = 2 * (2 * fits["a2a"](v2.a2a) + fits["ag"](v2.mp_gather))
    return t1, t2


def choose(layer: MoELayer, deg: Degrees, cluster: Any, saa: bool, algo: str | None) -> Choice:
    """Algorithm 1: fit the groups' collectives on `cluster`, predict both, pick the faster."""
    if cluster is None:
        raise ConfigError(
            "strategy parm: schedule 'auto' needs the cluster to fit its collectives "
            "(give strategy.schedule: s1 or s2, or run through moesim simulate)"
        )
    v1, v2 = volumes(layer, deg, "s1"), volumes(layer, deg, "s2")
    fits = group_fits(layer, deg, cluster, saa, algo)
    t1, t2 = predict(v1, v2, fits, saa)
    t1 += compute_time(layer, v1, cluster, False, algo)
    t2 += compute_time(layer, v2, cluster, saa, algo)
    return Choice("s1" if t1 <= t2 else "s2", t1, t2, fits)


def compute_time(layer: MoELayer, vol: Volumes, cluster: Any, saa: bool, algo: str | None) -> float:
    """Seconds of one rank's compute tasks in the schedule (forward and backward), by the
    cluster's compute model (every rank runs the same ones), less SAA's rounds."""
    from sim.strategies.parm.schedules import _Rank

    lay = ParallelLayout(ep=vol.deg.ep, esp=vol.deg.esp, tp=vol.deg.mp, tp_overlay=True)
    b = _Rank(layer, vol, lay, 0, {}, saa and vol.schedule == "s2", algo)
    b.pass_("bwd", b.pass_("fwd", None))
    duration = cluster.costs.compute.duration
    # SAA's per-round local combines are inside the fitted overlapped time already
    return float(sum(duration(t) for t in b.tasks if not t.is_comm and "chunk" not in t.tags))


def group_fits(
    layer: MoELayer, deg: Degrees, cluster: Any, saa: bool, algo: str | None
) -> dict[str, Fit]:
    """alpha-beta of the EP&ESP-AlltoAll, the MP-AllGather and (with SAA) the overlapped
    pair, each fitted on timings of that collective alone."""
    # keyed by the objects' ids; the entry holds the objects, so no id is reused meanwhile
    key_base = (id(cluster.topology), id(cluster.costs), deg, algo, layer.dtype)
    out = {}
    kinds = ["a2a"] + (["ag"] if deg.mp > 1 else []) + (["saa"] if saa and deg.mp > 1 else [])
    for kind in kinds:
        key = (
            (*key_base, kind, layer.experts, layer.model_dim)
            if kind == "saa"
            else (*key_base, kind)
        )
        if key not in _CACHE:
            xs = np.asarray(FIT_BYTES, dtype=float)
            ts = np.asarray([_time(kind, x, layer, deg, cluster, algo) for x in xs])
            beta, alpha = np.polyfit(xs, ts, 1)
            fit = Fit(max(float(alpha), 0.0), max(float(beta), 0.0))
            _CACHE[key] = (cluster.topology, cluster.costs, fit)
        out[kind] = _CACHE[key][2]
    return out


def _time(
    kind: str, x: float, layer: MoELayer, deg: Degrees, cluster: Any, algo: str | None
) -> float:
    """Simulated seconds of one collective (or the SAA pair) of x bytes per rank alone."""
    from sim.engine.engine import simulate  # the model cluster is the measuring bench

    lay = ParallelLayout(ep=deg.ep, esp=deg.esp, tp=deg.mp, tp_overlay=True)
    g = TaskGraph(deg.world, meta={"strategy": "parm-fit", "kind": kind})
    if kind == "saa":
        _saa_graph(g, x, layer, deg, lay, algo)
    else:
        group_of = lay.moe_group if kind == "a2a" else lay.tp_group
        shared: dict[int, list[int]] = {}
        for r in range(deg.world):
            members = group_of(r)
            members = shared.setdefault(members[0], members)
            g.add(
                Task(
                    f"r{r}/{kind}",
                    r,
                    "comm",
                    "all_to_all" if kind == "a2a" else "all_gather",
                    bytes=float(x),
                    group=members,
                    coll=f"{kind}@{members[0]}",
                    algo=algo if kind == "a2a" else None,
                    tags={"dtype": layer.dtype},
                )
            )
    g.validate()
    return float(simulate(g, cluster.topology, cluster.costs).makespan)


def _saa_graph(
    g: TaskGraph, x: float, layer: MoELayer, deg: Degrees, lay: ParallelLayout, algo: str | None
) -> None:
    """S2's returning rounds with their combines and MP-AllGathers, for a buffer whose
    all-to-all moves x bytes per rank."""
    from sim.strategies.parm.schedules import _Rank

    row = deg.esp * layer.experts * layer.model_dim * layer.elem  # bytes per capacity slot
    cap = max(1, round(x / row))
    base = volumes(layer, deg, "s2")
    vol = dataclasses.replace(base, capacity=cap, buf=float(row // deg.esp * cap))
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(deg.world):
        b = _Rank(layer, vol, lay, r, groups, True, algo)
        b._return("fwd", "combine", "mp_gather", None)
        for t in b.tasks:
            g.add(t)
