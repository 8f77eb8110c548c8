"""Tutel (paper 002): adaptive pipelining, a degree x all-to-all algorithm per iteration.

The graph is the pipelined layer in Tutel's queue order (all dispatch rounds on the one
communication stream before any combine) with a chosen degree d in {1, 2, 4, 8} and
algorithm in {linear, 2dh}. The choice adapts to the capacity factor f, which changes from
iteration to iteration (Tutel Fig. 1), through the online search of Algorithm 2
(`OnlineSearch`): capacity factors are grouped into buckets of width `bucket_len`; within a
bucket the strategies are tried one per iteration until each has run once, and from then on
the best is used (measured times normalised to the bucket's lowest f, since an MoE step's
time grows about linearly with f). A capacity factor that has itself tried every strategy
uses its own best. `sim.search.simulated.tutel_online` drives it with simulated times.

Switchable parallelism (Tutel Sec. 3.2, Fig. 11-13), for fewer experts E than GPUs W, each
expert sliced over n = W/E GPUs (`parallel`):

- `p1` (EP + DP): each GPU keeps a ZeRO-style 1/n slice of its expert's parameters and
  all-gathers the whole expert (on its own communication stream, from the layer's start, so
  it overlaps gating and the dispatch); tokens go through one global all-to-all of E*C*M per
  GPU, each replica taking C/n of every GPU's slots; backward reduce-scatters the expert's
  gradient back to the slices.
- `p2` (EP + MP): tokens are repeated n times before the all-to-all (n*E*C*M per GPU); each
  GPU runs its expert's slice (H/n hidden units) on all C slots of every GPU; after the
  combine the n partial outputs are summed locally.
- `auto`: the inline router (`route_parallel`), an O(1) comparison of the bytes each choice
  sends, since both compute the same GEMM work (Sec. 3.2, "Inline Parallelism Router").
- `ep`: plain expert parallelism (E >= W); p1 and p2 are the same layer there (n = 1).

Every path moves Tutel's padded [E, C, M] buffers whatever the routing (`MoELayer.padded`;
P1 and P2: sim.workload.slicing), so its graphs do not depend on the routing model beyond the
capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.base import Strategy as StrategyObject
from sim.strategies.layer import build_layer
from sim.strategies.resolved import Resolved
from sim.strategies.steps import task_id
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout
from sim.workload.slicing import (
    aligned,
    by_step,
    ep_view,
    expert_param_bytes,
    fix_gates,
    layer_meta,
)

NAME = "tutel"


PARALLEL = ("auto", "p1", "p2", "ep")
CANDIDATES: tuple[tuple[int, str], ...] = tuple(
    (d, a) for d in (1, 2, 4, 8) for a in ("linear", "2dh")
)

Strategy = tuple[int, str]


def resolve(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> Resolved:
    """The parameters the graph is built with: `parallel: auto` by the inline router."""
    if params["parallel"] != "auto":
        return Resolved(dict(params))
    chosen = route_parallel(layer)
    info = {"router": "inline", **comm_bytes(layer)} if layer.expert_shards > 1 else {}
    return Resolved({**params, "parallel": chosen}, {"parallel": chosen}, info)


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    if params["algo"] not in ("linear", "2dh"):
        raise ConfigError(f"strategy.algo: Tutel uses 'linear' or '2dh', got {params['algo']!r}")
    parallel = params["parallel"]
    if parallel not in PARALLEL:
        raise ConfigError(f"strategy.parallel: expected one of {PARALLEL}, got {parallel!r}")
    chosen = resolve(layer, params, passes, cluster).params["parallel"]
    if layer.expert_shards == 1 or chosen == "ep":
        # n = 1: P1 and P2 are plain EP (Fig. 13); the graph is the EP layer's, with Tutel's
        # padded [E, C, M] buffers whatever the routing (its all-to-all moves the capacity,
        # not the kept tokens: skewed routing that drops choices sends no fewer bytes)
        return build_layer(
            layer.padded(),
            degree=params["degree"],
            order="tutel",
            passes=passes,
            strategy=NAME,
            algo=params["algo"],
        )
    return _build_sliced(layer, chosen, params, passes, parallel == "auto")


# -- switchable parallelism (Sec. 3.2) ----------------------------------------------------------


def comm_bytes(layer: MoELayer) -> dict[str, float]:
    """Bytes one GPU sends per pass (forward or backward alike) under P1 and P2.

    An all-to-all of a B-byte buffer over W GPUs sends (W-1)/W of it (the own share stays);
    a ring all-gather (reduce-scatter) of n slices sends (n-1)/n of the whole.
    P1: dispatch + combine of the E*C1*M buffer (C1: C aligned to n) + the expert's
    parameters gathered (forward) or its gradient reduce-scattered (backward);
    P2: dispatch + combine of the n-times repeated E*C*M buffer.
    """
    E, W, n = layer.experts, layer.world, layer.expert_shards
    M, e, C = layer.model_dim, layer.elem, layer.capacity
    sent = (W - 1) / W
    p1 = 2 * sent * E * aligned(C, n) * M * e + expert_param_bytes(layer) * (n - 1) / n
    p2 = 2 * sent * n * E * C * M * e
    return {"p1": p1, "p2": p2}


def route_parallel(layer: MoELayer) -> str:
    """Tutel's inline parallelism router: O(1) in the layer's sizes. P1 and P2 do the same
    expert GEMM work per GPU, so the one with fewer bytes to send wins (ties go to P1, which
    keeps the all-to-all small); 'ep' when no expert is sliced."""
    if layer.expert_shards == 1:
        return "ep"
    b = comm_bytes(layer)
    return "p2" if b["p2"] < b["p1"] else "p1"


def _build_sliced(
    layer: MoELayer, chosen: str, params: dict[str, Any], passes: tuple[str, ...], auto: bool
) -> TaskGraph:
    W, n, C, H = layer.world, layer.expert_shards, layer.capacity, layer.hidden_dim
    if chosen == "p1":
        view = ep_view(layer, experts=W, world=W, capacity=aligned(C, n) // n, hidden=H)
    else:
        if H % n:
            raise ConfigError(
                f"model.hidden_dim: P2 slices each expert's {H} hidden units over {n} GPUs "
                f"(need a multiple of {n})"
            )
        view = ep_view(layer, experts=W, world=W, capacity=C, hidden=H // n)
    g = build_layer(
        view,
        degree=params["degree"],
        order="tutel",
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
    )
    fix_gates(g, layer)
    if chosen == "p1":
        _add_param_exchange(g, layer, passes)
    g.meta["layer"] = layer_meta(layer)
    g.meta["parallel"] = chosen
    g.meta["expert_shards"] = n
    if auto:
        g.meta["selector"] = {"router": "inline", **comm_bytes(layer)}
    g.validate()
    return g


def _add_param_exchange(g: TaskGraph, layer: MoELayer, passes: tuple[str, ...]) -> None:
    """P1's ZeRO traffic on stream comm.1: all-gather of the expert's slices before its first
    forward GEMM, reduce-scatter of its gradient after its last weight-gradient GEMM. The
    gathered copy stays until then (autograd keeps it for the backward GEMMs)."""
    n, full = layer.expert_shards, expert_param_bytes(layer)
    steps = by_step(g)
    lay = ParallelLayout(ep=layer.experts, esp=n)  # expert e sliced over its ESP group
    for rank in range(layer.world):
        e = lay.coords(rank)["ep"]
        group = lay.esp_group(rank)
        tags = {"layer": 0, "dtype": layer.dtype}
        if "fwd" in passes:
            gather = g.add(
                Task(
                    task_id(rank, 0, "fwd", "expert_gather"),
                    rank,
                    "comm.1",
                    "all_gather",
                    bytes=full / n,  # this rank's slice
                    group=group,
                    coll=f"L0/fwd/expert_gather.e{e}",
                    allocs={"expert_full": full},
                    tags=tags | {"phase": "fwd", "step": "expert_gather"},
                )
            )
            for t in steps[(rank, "fwd", "fc1")]:
                t.deps.append(gather.id)
            if "bwd" not in passes:
                steps[(rank, "fwd", "fc2")][-1].frees.append("expert_full")
        if "bwd" in passes:
            g.add(
                Task(
                    task_id(rank, 0, "bwd", "expert_grad_scatter"),
                    rank,
                    "comm.1",
                    "reduce_scatter",
                    deps=[steps[(rank, "bwd", "fc1_wgrad")][-1].id],
                    bytes=full,  # the whole gradient in, this rank's slice out
                    group=group,
                    coll=f"L0/bwd/expert_grad_scatter.e{e}",
                    frees=["expert_full"] if "fwd" in passes else [],
                    tags=tags | {"phase": "bwd", "step": "expert_grad_scatter"},
                )
            )


@dataclass
class _Bucket:
    lo: float
    fs: list[float] = field(default_factory=list)
    tried: dict[Strategy, float] = field(default_factory=dict)  # normalised mean time


class OnlineSearch:
    """Tutel Algorithm 2: GetStrategy(f) and OptimizeStrategy(f, s, t)."""

    def __init__(self, candidates: tuple[Strategy, ...] = CANDIDATES, bucket_len: float = 0.5):
        if not candidates:
            raise ConfigError("tutel search: no candidate strategies")
        if not bucket_len > 0:
            raise ConfigError(f"tutel search: bucket length must be > 0, got {bucket_len}")
        self.candidates = tuple(candidates)
        self.bucket_len = bucket_len
        self.by_f: dict[float, dict[Strategy, float]] = {}
        self.buckets: list[_Bucket] = []

    def get(self, f: float) -> Strategy:
        if f not in self.by_f:
            self.by_f[f] = {}
            self._recompute()
        own = self.by_f[f]
        if len(own) == len(self.candidates):
            return min(self.candidates, key=lambda s: own[s])
        b = self.bucket(f)
        if len(b.tried) == len(self.candidates):
            return min(self.candidates, key=lambda s: b.tried[s])
        return next(s for s in self.candidates if s not in b.tried)

    def optimize(self, f: float, s: Strategy, t: float) -> None:
        self.by_f.setdefault(f, {})[s] = t
        self._recompute()

    def bucket(self, f: float) -> _Bucket:
        return next(b for b in self.buckets if f in b.fs)

    def _recompute(self) -> None:
        """Greedy buckets over the sorted known fs: a bucket spans at most bucket_len."""
        self.buckets = []
        for f in sorted(self.by_f):
            if not self.buckets or f - self.buckets[-1].lo > self.bucket_len:
                self.buckets.append(_Bucket(lo=f))
            self.buckets[-1].fs.append(f)
        for b in self.buckets:
            sums: dict[Strategy, list[float]] = {}
            for f in b.fs:
                for s, t in self.by_f[f].items():
                    sums.setdefault(s, []).append(t * b.lo / f)
            b.tried = {s: sum(v) / len(v) for s, v in sums.items()}


STRATEGY = StrategyObject(
    name=NAME,
    Params="sim.strategies.params:TutelParams",
    build=build,
    real_layer="sliced",
    resolve=resolve,
)
