"""The parallel layout shared by every strategy: `parallel: {ep, dp, tp, esp, pp}`.

The world is cut into `dp` data-parallel replicas of `pp` pipeline devices each (one stage
or, for DualPipe, a pair of stages per device), a device being `mp = ep * tp * esp`
consecutive ranks. Inside a device's group, rank `((e * esp) + s) * tp + t` holds
expert-parallel index e, expert slice s and tensor-parallel index t:

- TP innermost: a TP group is `tp` consecutive ranks, inside a node (Megatron's placement).
- ESP next: an expert sliced over `esp` GPUs (Tutel P1/P2, Parm's ESP) lives on consecutive
  ranks of one node, so slicing traffic stays on NVLink.
- EP groups packed by node: the ranks of a replica sharing (s, t) form its EP group, and a
  replica fills whole consecutive nodes (or shares one node with others when smaller), so a
  member sits at the same local index, hence on the same rail of a rail-optimised fabric, as
  the members it exchanges with at that index in the other nodes (NCCL's rail-local pairs).
- PP next: a replica's pipeline device p is ranks [p * mp, (p + 1) * mp) of the replica, a
  whole EP group (only pipeline strategies, `dualpipe`, take pp > 1).
- DP outermost: replica d is ranks [d * R, (d + 1) * R), R = pp * mp (`replica`). Its EP
  groups run the same collectives as replica 0's at the same time, so on a shared fabric
  they contend for the same spines and rails; the engine simulates that traffic (nothing
  assumes groups are independent).

Strategies build the graph of one replica (an MoE layer over `mp` ranks, or a pipeline of pp
such groups); `replicate` lays it over every replica. A config without `parallel:` keeps its
old meaning: one EP group of the whole world (`tp` from TED's `strategy.tp`, `esp` = W/E
where experts are sliced).

Parm's placement (Sec. II-B, Fig. 2; `tp_overlay=True`): the MoE layer runs on the ep x esp
ranks of a replica (ESP innermost, as above), and the dense part's model-parallel (MP = tp)
groups are laid *over* those same ranks, `tp` consecutive ranks each, instead of being a
factor of their own: a replica is ep * esp ranks and tp divides it. Parm's evaluation needs
this form: its grid runs N_MP = N_ESP = 4 on 8 GPUs (Table IV), which a product
ep * tp * esp cannot hold. With tp = esp the MP group is the ESP group (Fig. 2); tp < esp
cuts an ESP group into MP groups; tp > esp makes an MP group span tp/esp ESP groups.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph

SIZES = ("ep", "dp", "tp", "esp", "pp")


@dataclass(frozen=True)
class ParallelLayout:
    """How GPUs divide into expert, data, tensor and pipeline parallel groups."""

    ep: int
    dp: int = 1
    tp: int = 1
    esp: int = 1
    gpus_per_node: int | None = None  # None: placement inside nodes is not checked
    tp_overlay: bool = False  # Parm: MP groups laid over the ep x esp ranks (module docstring)
    pp: int = 1  # pipeline devices of a replica, each an EP group of mp ranks

    def __post_init__(self) -> None:
        for name in SIZES:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"parallel.{name}: expected a positive integer, got {v!r}")
        if self.tp_overlay and (self.ep * self.esp) % self.tp:
            raise ConfigError(
                f"parallel.tp: MP groups of {self.tp} GPUs laid over a replica of ep {self.ep} "
                f"x esp {self.esp} = {self.ep * self.esp} GPUs need tp to divide it"
            )
        G = self.gpus_per_node
        if G is not None:
            if self.tp > 1 and G % self.tp:
                raise ConfigError(
                    f"parallel.tp: TP groups of {self.tp} GPUs must lie inside a node of {G} "
                    f"(expected a divisor of {G})"
                )
            if self.esp > 1 and G % (self._tp_factor * self.esp):
                raise ConfigError(
                    f"parallel.esp: expert slices over {self.esp} GPUs (x tp {self._tp_factor}) "
                    f"must lie inside a node of {G} (expected tp * esp to divide {G})"
                )

    @property
    def _tp_factor(self) -> int:
        """tp's share of a replica's rank index: 1 where MP groups overlay the MoE ranks."""
        return 1 if self.tp_overlay else self.tp

    @property
    def mp(self) -> int:
        """Ranks of one pipeline device's group (the MoE layer's world; with pp = 1, of one
        data-parallel replica)."""
        return self.ep * self._tp_factor * self.esp

    @property
    def replica(self) -> int:
        """Ranks of one data-parallel replica: its pipeline devices' groups."""
        return self.pp * self.mp

    @property
    def world(self) -> int:
        return self.replica * self.dp

    def as_dict(self) -> dict[str, int]:
        """The sizes; pp only where there are pipeline stages (results without any keep the
        mapping they always had)."""
        return {name: getattr(self, name) for name in SIZES if name != "pp" or self.pp > 1}

    # -- placement -------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """(dp, ep, esp, tp) indices of a global rank (layouts without pipeline stages: the
        groups below are those of the layer strategies, which take pp = 1)."""
        if self.pp > 1:
            raise ConfigError("parallel.pp: the rank groups of a pipeline's stages are its own")
        d, local = divmod(rank, self.mp)
        if self.tp_overlay:  # tp index: position inside the MP group of consecutive ranks
            e, s = divmod(local, self.esp)
            return {"dp": d, "ep": e, "esp": s, "tp": local % self.tp}
        rest, t = divmod(local, self.tp)
        e, s = divmod(rest, self.esp)
        return {"dp": d, "ep": e, "esp": s, "tp": t}

    def rank(self, dp: int = 0, ep: int = 0, esp: int = 0, tp: int = 0) -> int:
        """Global rank of the coordinates (with tp_overlay, tp follows from ep and esp and is
        ignored)."""
        if self.tp_overlay:
            return dp * self.mp + ep * self.esp + esp
        return dp * self.mp + (ep * self.esp + esp) * self.tp + tp

    def replica_ranks(self, d: int) -> np.ndarray:
        """Global rank of each local rank 0..replica-1 of replica d."""
        return np.arange(d * self.replica, (d + 1) * self.replica)

    # -- rank groups -----------------------------------------------------------------------
    def ep_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(c["dp"], e, c["esp"], c["tp"]) for e in range(self.ep)]

    def tp_group(self, rank: int) -> list[int]:
        if self.tp_overlay:  # tp consecutive ranks of the replica
            start = rank - rank % self.tp
            return list(range(start, start + self.tp))
        c = self.coords(rank)
        return [self.rank(c["dp"], c["ep"], c["esp"], t) for t in range(self.tp)]

    def esp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(c["dp"], c["ep"], s, c["tp"]) for s in range(self.esp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(d, c["ep"], c["esp"], c["tp"]) for d in range(self.dp)]

    def moe_group(self, rank: int) -> list[int]:
        """The ep x esp ranks of the rank's replica: Parm's EP&ESP-AlltoAll group."""
        d = self.coords(rank)["dp"]
        return [self.rank(d, e, s) for e in range(self.ep) for s in range(self.esp)]

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of one kind ("ep", "dp", "tp", "esp", "moe"), each once, by lowest
        rank."""
        pick = {"ep": self.ep_group, "dp": self.dp_group, "tp": self.tp_group}
        pick |= {"esp": self.esp_group, "moe": self.moe_group}
        if kind not in pick:
            raise ConfigError(f"parallel: no group kind {kind!r} (known: {list(pick)})")
        seen: dict[int, list[int]] = {}
        for r in range(self.world):
            g = pick[kind](r)
            seen.setdefault(g[0], g)
        return [seen[k] for k in sorted(seen)]


def from_spec(
    spec: Any,
    world: int,
    gpus_per_node: int | None,
    *,
    source: str = "parallel",
    tp_default: int = 1,
    esp_default: int = 1,
    tp_overlay: bool = False,
) -> ParallelLayout:
    """The layout a config's `parallel:` mapping asks for on `world` GPUs. Missing sizes are
    derived: tp, esp and pp default to 1 (or what the strategy implies), dp to 1, and ep to
    what is left, so `{ep: 64}` on 16,384 GPUs means 256 replicas. With `tp_overlay` (Parm)
    tp is no factor of the world: ep x dp x esp is."""
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{source}: expected a mapping with sizes from {list(SIZES)}")
    unknown = sorted(set(spec) - set(SIZES))
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {unknown} (known: {list(SIZES)})")
    for name, v in spec.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{source}.{name}: expected a positive integer, got {v!r}")
    tp = spec.get("tp", tp_default)
    esp = spec.get("esp", esp_default)
    pp = spec.get("pp", 1)
    ep, dp = spec.get("ep"), spec.get("dp")
    if tp_overlay:  # tp is laid over the ranks: it takes no share of the world
        if pp > 1:
            raise ConfigError(f"{source}.pp: Parm's layout has no pipeline stages; use pp: 1")
        return _overlaid(source, world, tp, esp, ep, dp, gpus_per_node)
    xpp = f" x pp {pp}" if pp > 1 else ""
    if ep is None:
        if dp is None:
            dp = 1
        ep, rem = divmod(world, dp * tp * esp * pp)
        if rem or ep < 1:
            raise ConfigError(
                f"{source}: dp {dp} x tp {tp} x esp {esp}{xpp} does not divide the {world} GPUs"
            )
    elif dp is None:
        dp, rem = divmod(world, ep * tp * esp * pp)
        if rem or dp < 1:
            raise ConfigError(
                f"{source}: ep {ep} x tp {tp} x esp {esp}{xpp} does not divide the {world} GPUs"
            )
    if ep * dp * tp * esp * pp != world:
        raise ConfigError(
            f"{source}: ep {ep} x dp {dp} x tp {tp} x esp {esp}{xpp} = "
            f"{ep * dp * tp * esp * pp}, but the cluster has {world} GPUs (the product must "
            "be the world)"
        )
    return ParallelLayout(ep, dp, tp, esp, gpus_per_node, pp=pp)


def check_replica(graph: TaskGraph, layout: ParallelLayout) -> None:
    """ConfigError unless the strategy's graph is one replica of the layout: pp pipeline
    devices of ep x tp x esp ranks each."""
    if graph.world_size != layout.replica:
        raise ConfigError(
            f"parallel: the strategy {graph.meta.get('strategy', '')!r} built a graph of "
            f"{graph.world_size} ranks for replicas of {layout.replica} (pp x ep x tp x esp); "
            "a pipeline strategy's devices are parallel.pp"
        )


def replicate(graph: TaskGraph, layout: ParallelLayout) -> TaskGraph:
    """One replica's graph (ranks 0..R-1, R = pp x mp) laid over every data-parallel replica.

    Replica d's copy of a task runs on rank d*R + rank; its id, dependencies and collective id
    get the prefix `dp{d}/`, and its communicator group is the replica's ranks. With dp = 1
    the graph is returned as it is."""
    check_replica(graph, layout)
    if layout.dp == 1:
        return graph
    out = TaskGraph(layout.world, meta=dict(graph.meta) | {"layout": layout.as_dict()})
    tasks = list(graph)
    for d in range(layout.dp):
        off, pre = d * layout.replica, f"dp{d}/"
        groups: dict[int, list[int]] = {}  # shared member lists, as the builders share them
        for t in tasks:
            group = None
            if t.group is not None:
                key = id(t.group)
                if key not in groups:
                    groups[key] = [r + off for r in t.group]
                group = groups[key]
            out.add(
                replace(
                    t,
                    id=pre + t.id,
                    rank=t.rank + off,
                    deps=[pre + x for x in t.deps],
                    group=group,
                    coll=pre + t.coll if t.coll else None,
                    peer=None if t.peer is None else t.peer + off,
                    allocs=dict(t.allocs),
                    frees=list(t.frees),
                    tags=dict(t.tags),
                )
            )
    out.validate()
    return out


def _cofactor(source: str, world: int, esp: int, name: str, known: int) -> int:
    """The size that `known` (the ep or dp given) x esp leaves of the world."""
    other, rem = divmod(world, known * esp)
    if rem or other < 1:
        raise ConfigError(f"{source}: {name} {known} x esp {esp} does not divide the {world} GPUs")
    return other


def _overlaid(
    source: str, world: int, tp: int, esp: int, ep: int | None, dp: int | None, G: int | None
) -> ParallelLayout:
    """from_spec for Parm's placement: ep x dp x esp = world, MP groups of tp laid over."""
    if ep is None:
        dp = 1 if dp is None else dp
        ep = _cofactor(source, world, esp, "dp", dp)
    elif dp is None:
        dp = _cofactor(source, world, esp, "ep", ep)
    if ep * dp * esp != world:
        raise ConfigError(
            f"{source}: ep {ep} x dp {dp} x esp {esp} = {ep * dp * esp}, but the cluster has "
            f"{world} GPUs (with MP groups laid over the MoE ranks, tp is no factor)"
        )
    return ParallelLayout(ep, dp, tp, esp, G, tp_overlay=True)
