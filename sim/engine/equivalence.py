"""When are ranks equivalent? Cheap, conservative checks behind `sim.engine.symmetry`.

Two kinds of permutations are used, both of whole nodes with every GPU keeping its local
index (so routes inside a node are unchanged) and with the fabric's leaf groups (fat-tree
leaves, rail scalable units) kept (so a route's leaves, hence its trunks, map onto a route's
leaves; trunk capacities are equal):

- replicas (`place`): the replicas of one graph (e.g. data-parallel copies) are disjoint sets
  of whole nodes in the same node order. Either the fabric has no trunks, or every replica
  sits inside one leaf group and every group used holds as many replicas (swapping replica
  blocks inside a group, and whole groups, are automorphisms), or every replica is a union of
  whole leaf groups of one size. Anything else (a replica straddling part of a group) is
  refused: its copies would not see the same links.
- node classes inside a replica (`node_classes`): every node of the replica does what the
  first does. Checked on the graph: for each local index, the ranks of every node have the
  same task signature (stream, position, kind, sizes, algorithm, buffers, tags, dependencies
  by stream position on the same rank or node); every collective lies inside one node, or
  spans all the replica's nodes with the same local ranks on each and an algorithm that
  depends only on the member set (uniform all-to-all: linear, 2dh, rail_relay); p2p pairs and
  dependencies stay inside a node. A ring or a broadcast root spanning nodes, an all-to-allv's
  per-peer sizes (skewed routing), or a cross-node dependency is refused, with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.graph import Task, TaskGraph
from sim.core.kinds import COLLECTIVE_KINDS, P2P_KINDS
from sim.hardware.collectives import DEFAULT_ALGO
from sim.hardware.topology import Topology

# Collective algorithms whose flows depend only on the member set (uniform phases).
SET_ALGORITHMS = {("all_to_all", "linear"), ("all_to_all", "2dh"), ("all_to_all", "rail_relay")}


@dataclass(frozen=True)
class Placement:
    """Where the replicas sit: nodes[d, j] is replica d's j-th node."""

    nodes: np.ndarray
    units: str  # "none" (no trunks), "within" (inside one leaf group each) or "whole"
    unit_size: int  # nodes per leaf group (0 for "none")


def place(topo: Topology, ranks: np.ndarray) -> Placement | str:
    """The replicas' placement, or why it is not symmetric. ranks[d, i]: global rank of
    replica d's local rank i."""
    G = topo.gpus_per_node
    D, mp = ranks.shape
    if mp % G:
        return f"a replica of {mp} ranks is not whole nodes of {G} GPUs"
    if ranks.min() < 0 or ranks.max() >= topo.world_size:
        return f"replica ranks outside the topology's {topo.world_size} GPUs"
    r = ranks.reshape(D, mp // G, G)
    nodes = r[:, :, 0] // G
    if not ((r // G == nodes[:, :, None]).all() and (r % G == np.arange(G)).all()):
        return "replica ranks are not whole nodes in local GPU order"
    if len(np.unique(nodes)) != nodes.size:
        return "replicas share nodes"
    if not (np.argsort(nodes, axis=1) == np.argsort(nodes[0])).all():
        return "replicas list their nodes in different orders"
    if topo.num_trunks == 0:
        return Placement(nodes, "none", 0)
    f = topo.fabric
    assert f is not None
    g = f.group
    unit = nodes // g
    size = np.minimum(g, topo.nodes - np.arange(-(-topo.nodes // g)) * g)
    if (unit == unit[:, :1]).all():
        used, count = np.unique(unit[:, 0], return_counts=True)
        if np.ptp(count) or np.ptp(size[used]):
            return (
                f"leaf groups of {g} nodes hold different numbers of replicas "
                f"({sorted(set(count.tolist()))})"
            )
        return Placement(nodes, "within", g)
    for d in range(D):
        used, count = np.unique(unit[d], return_counts=True)
        if not (count == size[used]).all():
            return f"replica {d} covers part of a leaf group of {g} nodes"
    if np.ptp(size[np.unique(unit)]):
        return "replicas' leaf groups differ in size"
    return Placement(nodes, "whole", g)


class _Refused(Exception):
    pass


def node_classes(graph: TaskGraph, gpus_per_node: int) -> str | None:
    """None if every node of `graph` (ranks 0..world-1, whole nodes) does what node 0 does,
    local rank by local rank (see the module docstring); else the reason it does not."""
    G = gpus_per_node
    world = graph.world_size
    if world % G or world // G < 2:
        return "a single node"
    streams = graph.streams()
    pos: dict[str, tuple[int, str, int]] = {}
    for (r, s), seq in streams.items():
        for k, t in enumerate(seq):
            pos[t.id] = (r, s, k)
    # keyed by t.coll as it is (looked up for comm tasks, whose coll graph_checks requires)
    by_coll: dict[str | None, dict[int, str]] = defaultdict(dict)
    for t in graph:
        if t.coll is not None:
            by_coll[t.coll][t.rank] = t.id
    # (id(group), kind, algo) -> "node" or the local ranks spanned. Builders share one group
    # list between collectives of different kinds and algorithms, and whether a group spanning
    # nodes can be folded depends on both: keyed by the group alone, DeepEP's per-peer-sized
    # all_to_allv inherited the verdict of the uniform count exchange before it.
    spans: dict[tuple[int, str, str | None], Any] = {}
    nodes = world // G
    try:
        sigs: list[tuple[Any, ...]] = [() for _ in range(world)]
        for (r, s), seq in sorted(streams.items(), key=lambda kv: kv[0][1]):
            sigs[r] += ((s, tuple(_sig(t, G, nodes, pos, by_coll, spans) for t in seq)),)
    except _Refused as e:
        return str(e)
    for a in range(G):
        first = sigs[a]
        for j in range(1, nodes):
            if sigs[j * G + a] != first:
                diff = _first_difference(first, sigs[j * G + a])
                return f"rank {j * G + a} does not do what rank {a} does ({diff})"
    return None


def _sig(
    t: Task,
    G: int,
    nodes: int,
    pos: dict[str, tuple[int, str, int]],
    by_coll: dict[str | None, dict[int, str]],
    spans: dict[tuple[int, str, str | None], Any],
) -> tuple[Any, ...]:
    node = t.rank // G
    deps: list[tuple[int | str, ...]] = []
    for d in t.deps:
        r, s, k = pos[d]
        if r == t.rank:
            deps.append((s, k))
        elif r // G == node:
            deps.append((r % G, s, k))
        else:
            raise _Refused(f"task {t.id!r} depends on {d!r} on another node")
    comm: tuple[Any, ...] = ()
    if t.kind in COLLECTIVE_KINDS:
        group = t.group or []
        key = (id(group), t.kind, t.algo)
        span = spans.get(key)
        if span is None:
            span = spans[key] = _span(t, G, nodes)
        if span == "node":
            members = by_coll[t.coll]
            comm = ("node", tuple((x % G,) + pos[members[x]][1:] for x in group))
        else:
            comm = ("all", t.coll, span)
    elif t.kind in P2P_KINDS:
        assert t.peer is not None
        if t.peer // G != node:
            raise _Refused(f"{t.kind} {t.id!r} goes to another node")
        other = next(x for r, x in by_coll[t.coll].items() if r == t.peer)
        comm = ("p2p", t.peer % G) + pos[other][1:]
    # Compared, never hashed: dict items in insertion order (builders fill them in one
    # order; another order only refuses a symmetry that might have held).
    return (
        t.kind,
        t.flops,
        t.bytes,
        tuple(t.shape.items()) if t.shape else None,
        t.algo,
        t.split,
        t.recv_split,
        tuple(t.allocs.items()),
        t.frees,
        tuple(t.tags.items()),
        deps,
        comm,
    )


def _span(t: Task, G: int, nodes: int) -> Any:
    g = np.asarray(t.group, dtype=np.int64)
    gn = np.unique(g // G)
    if len(gn) == 1:
        return "node"
    locs = np.unique(g % G)
    algo = t.algo or DEFAULT_ALGO[t.kind]
    if len(gn) != nodes or len(g) != nodes * len(locs):
        raise _Refused(f"{t.kind} {t.coll!r} spans some nodes but not all")
    if t.kind == "all_to_allv":
        # per-peer sizes (skewed routing, DeepEP's node-deduplicated exchange): its flows
        # depend on every member's sizes, which the representatives alone do not carry
        raise _Refused(f"all_to_allv {t.coll!r} spans nodes with per-peer sizes")
    if (t.kind, algo) not in SET_ALGORITHMS:
        raise _Refused(
            f"{t.kind} ({algo}) {t.coll!r} spans nodes and depends on its members' order"
        )
    return tuple(locs.tolist())


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    for (sa, ta), (sb, tb) in zip(a, b):
        if sa != sb:
            return f"streams {sa!r} / {sb!r}"
        if len(ta) != len(tb):
            return f"{len(ta)} / {len(tb)} tasks on {sa!r}"
        for k, (x, y) in enumerate(zip(ta, tb)):
            if x != y:
                names: tuple[str, ...] = ("kind", "flops", "bytes", "shape", "algo", "split")
                names += ("recv_split", "allocs", "frees", "tags", "deps", "communicator")
                what = next(n for n, u, v in zip(names, x, y) if u != v)
                return f"task {k} on {sa!r} differs in {what}"
    return f"{len(a)} / {len(b)} streams"
