"""Seconds of a training step's collectives, simulated by the engine on the cluster's
topology with every group of their dimension running at once.

In a step, a collective of one kind runs on all of its groups together (every EP group
dispatches in the same layer, every DP group reduces its gradients at the end), so their flows
share NICs, rails and spines. `CommTimer.seconds` builds that one collective on every group
(a graph of the whole world, one task per rank), runs it through `sim.engine` with the
topology's network model and caches the result by (kind, dimension, bytes): a step asks for a
few dozen distinct collectives, each simulated once. The results are also kept per process
(`_SHARED`, by the topology, its cost model, the groups' layout and the collective), so
that steps of one layout (a plan's candidates that differ in micro-batches, recomputation or
overlap; a sweep's rows) simulate each collective once between them; `simulations` counts the
collectives a step asked for, wherever the answer came from, so it does not depend on what
the process ran before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.training.layout import Layout

BYTES_QUANTUM = 4096  # collectives within 4 KiB of each other share one simulation
SHARED_MAX = 1 << 16  # collectives kept per process before the shared cache starts over
KEPT_MAX = 64  # topologies and cost models it may hold alive before it starts over
# (id of the topology, id of its cost model) -> (per_domain, layout, *collective) -> seconds
_SHARED: dict[tuple[int, int], dict[tuple, float]] = {}
_KEPT: dict[int, object] = {}  # the topologies and cost models keyed by id in _SHARED, kept
# alive so that their ids are not reused while their entries exist


class Timer(Protocol):
    """What a step model asks of its collective timer (`CommTimer`, or a stand-in that
    answers 0 s for a bound)."""

    simulations: int
    per_domain: int  # GPUs the job uses of each NVLink domain

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float: ...

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float: ...

    def place(self, rank: int) -> int: ...


class CommTimer:
    """`per_domain`: GPUs the job uses of each node (NVLink domain), None: all of them; rank
    r runs on GPU `place(r)`."""

    def __init__(
        self, topo: Topology, costs: CostModel, layout: Layout, per_domain: int | None = None
    ):
        self.topo, self.costs, self.layout = topo, costs, layout
        self.per_domain = per_domain or topo.gpus_per_node
        self._cache: dict[tuple, float] = {}
        self.simulations = 0
        # what the groups of every dimension depend on (Layout.groups), with the machine: the
        # key of this timer's collectives in the per-process cache
        lay = layout
        if len(_KEPT) >= KEPT_MAX and (id(topo) not in _KEPT or id(costs) not in _KEPT):
            _SHARED.clear()
            _KEPT.clear()
        _KEPT.setdefault(id(topo), topo)
        _KEPT.setdefault(id(costs), costs)
        self._machine = (id(topo), id(costs))
        self._shared_key = (self.per_domain, (lay.gpus, lay.tp, lay.cp, lay.pp, lay.ep, lay.etp))

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        """One collective of `kind` over every `dim` group, `nbytes` per GPU (all-gather: the
        shard; reduce-scatter and all-to-all: the whole buffer; send: to the next member of
        the group's ring)."""
        n = self.layout.size(dim) if dim != "pp" else 2
        if n <= 1 or nbytes <= 0:
            return 0.0
        return self._cached((kind, dim, algo), nbytes, lambda b: self._simulate(kind, dim, b, algo))

    def _cached(self, what: tuple, nbytes: float, run: Callable[[float], float]) -> float:
        """`run(bytes)` once per `what` and byte count (rounded to BYTES_QUANTUM)."""
        q = max(1, int(round(nbytes / BYTES_QUANTUM)))
        key = (*what, q)
        if key not in self._cache:
            shared = (*self._shared_key, *key)
            known = self.shared()
            got = known.get(shared)
            if got is None:
                got = run(q * BYTES_QUANTUM)
                if len(known) >= SHARED_MAX:
                    known.clear()
                known[shared] = got
            self._cache[key] = got
            self.simulations += 1
        return self._cache[key]

    def shared(self) -> dict[tuple, float]:
        """The collectives this process simulated on this timer's machine (topology and cost
        model), by (per_domain, the layout's group sizes, the collective, its bytes): a
        caller may read them out and seed another process's with them (`moesim plan`'s
        workers share theirs so)."""
        return _SHARED.setdefault(self._machine, {})

    def layout_key(self) -> tuple:
        """What this timer's entries in `shared()` start with."""
        return self._shared_key

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        """DeepEP's normal dispatch (or combine) over every EP group at once, through the
        collectives' `deepep` algorithm. `nbytes` per GPU of routed token copies (one per
        (token, expert), as the all-to-all dispatcher moves them); DeepEP's kernels move one
        row per (token, GPU) instead, to every GPU of the group holding one of the token's
        experts (over NVLink, or forwarded there), and one per (token, node) over RDMA to the
        GPU of the same local index on every other node holding one (DeepEP's
        `is_token_in_rank`, `num_tokens_per_rdma_rank`; the receiver expands the rows per
        expert). A token's chance of touching a GPU or node of `e` of the `experts` with
        top-k routing spread evenly: 1 - C(experts - e, k) / C(experts, k)."""
        if self.layout.ep <= 1 or nbytes <= 0:
            return 0.0
        what = ("deepep", "combine" if combine else "dispatch", sms, top_k, experts)
        return self._cached(what, nbytes, lambda b: self._deepep(b, top_k, experts, combine, sms))

    def _deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        g = TaskGraph(self.topo.world_size, meta={"collective": "deepep", "dim": "ep"})
        for t in self.deepep_tasks(nbytes, top_k, experts, combine, sms):
            g.add(t)
        g.validate()
        return simulate(g, self.topo, self.costs).makespan

    def deepep_tasks(
        self,
        nbytes: float,
        top_k: int,
        experts: int,
        combine: bool,
        sms: int,
        groups: list[int] | None = None,
    ) -> list[Task]:
        """The tasks of `deepep`'s collective on the EP groups numbered `groups` (all: None):
        what `_deepep` simulates, and what `sim.training.comm_floor` bounds group by group."""
        lay = self.layout
        G = self.topo.gpus_per_node
        out: list[Task] = []
        for gi, logical in _chosen(lay.groups("ep"), groups):
            members = [self.place(r) for r in logical]
            nodes = sorted({m // G for m in members})
            per_node = [sum(1 for m in members if m // G == nd) for nd in nodes]
            token_bytes = nbytes / max(1, top_k)  # one row per token, not per copy
            # one row per (token, GPU) it touches, its own GPU included (the rows stay there)
            to_gpu = token_bytes * _touch(experts, top_k, experts // len(members))
            split = [to_gpu] * len(members)
            for r in members:
                node_bytes = [
                    0.0
                    if nd == r // G
                    else token_bytes * _touch(experts, top_k, experts * c // len(members))
                    for nd, c in zip(nodes, per_node)
                ]
                out.append(
                    Task(
                        f"d{r}",
                        r,
                        "comm",
                        "all_to_allv",
                        bytes=to_gpu * len(members),
                        group=members,
                        coll=f"d{gi}",
                        algo="deepep",
                        split=split,
                        sms=sms,
                        tags={
                            "dtype": "bf16",
                            "deepep": "combine" if combine else "dispatch",
                            "node_bytes": node_bytes,
                        },
                    )
                )
        return out

    def place(self, rank: int) -> int:
        return (rank // self.per_domain) * self.topo.gpus_per_node + rank % self.per_domain

    def _simulate(self, kind: str, dim: str, nbytes: float, algo: str | None) -> float:
        g = TaskGraph(self.topo.world_size, meta={"collective": kind, "dim": dim})
        for t in self.tasks(kind, dim, nbytes, algo):
            g.add(t)
        g.validate()
        return simulate(g, self.topo, self.costs).makespan

    def tasks(
        self, kind: str, dim: str, nbytes: float, algo: str | None, groups: list[int] | None = None
    ) -> list[Task]:
        """The tasks of `seconds`' collective on the `dim` groups numbered `groups` (all:
        None): what `_simulate` simulates, and what `sim.training.comm_floor` bounds group by
        group."""
        out: list[Task] = []
        for gi, logical in _chosen(self.layout.groups(dim), groups):
            members = [self.place(r) for r in logical]
            if kind == "send":
                ring = members if dim != "pp" else members[:2]
                for j, r in enumerate(ring):
                    if dim == "pp" and j == 1:
                        break
                    nxt, prev = ring[(j + 1) % len(ring)], ring[j - 1]
                    out.append(
                        Task(f"s{r}", r, "comm", "send", peer=nxt, bytes=nbytes, coll=f"p{gi}.{r}")
                    )
                    out.append(
                        Task(
                            f"r{r}",
                            nxt if dim == "pp" else r,
                            "comm.1",
                            "recv",
                            peer=r if dim == "pp" else prev,
                            bytes=nbytes,
                            coll=f"p{gi}.{r if dim == 'pp' else prev}",
                        )
                    )
                continue
            for r in members:
                out.append(
                    Task(
                        f"c{r}",
                        r,
                        "comm",
                        kind,
                        bytes=float(nbytes),
                        group=members,
                        coll=f"c{gi}",
                        algo=algo,
                        tags={"dtype": "bf16"},
                    )
                )
        return out


def flex_dispatch(
    timer: Timer,
    nbytes: float,
    top_k: int,
    experts: int,
    combine: bool,
    sms: int,
    link_share: float = 0.0,
) -> float:
    """Megatron-Core's flex dispatcher's dispatch (or combine) of `nbytes` per GPU of routed
    copies: DeepEP's kernels, paced by the SMs they hold (`sms`), or HybridEP's where its
    `link_share` is known (> 0): TMA copies that reach that share of the links' rate whatever
    SMs they hold (the same rows: one per (token, GPU), one per (token, domain) over RDMA)."""
    if link_share > 0:
        return timer.deepep(nbytes / link_share, top_k, experts, combine, 0)
    return timer.deepep(nbytes, top_k, experts, combine, sms)


def _chosen(groups: list[list[int]], which: list[int] | None) -> list[tuple[int, list[int]]]:
    """(number, ranks) of the groups numbered `which` (negative: from the end), or of all."""
    if which is None:
        return list(enumerate(groups))
    return [(i % len(groups), groups[i]) for i in dict.fromkeys(i % len(groups) for i in which)]


@functools.lru_cache(maxsize=1 << 12)  # asked once per member and node of every EP group
def _touch(experts: int, top_k: int, on_node: int) -> float:
    """Chance that a token's top-k experts (drawn evenly) include one of `on_node` experts."""
    from math import comb

    if on_node <= 0:
        return 0.0
    if experts - on_node < top_k:
        return 1.0
    return 1.0 - comb(experts - on_node, top_k) / comb(experts, top_k)
