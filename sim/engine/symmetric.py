"""Simulating a replicated graph on its representatives (see `sim.engine.symmetry`).

`simulate_replicas(graph, topo, costs, replicas)` takes the graph of ONE replica (local ranks
0..mp-1) and the global ranks of every replica (`replicas[d, i]`), and never builds the
others: it checks that the replicas and, inside the first, the nodes are equivalent
(`sim.engine.equivalence`), runs the representatives' tasks with the others' flows folded
onto the network, and returns the result over the first replica's tasks (every one of its
ranks, each with its representative's times) with link bytes and peak memory of the whole
cluster. Where symmetry does not hold it says why and, given `full` (a function building
the whole graph), simulates that instead.

`costs.symmetry`: `auto` uses it from SYMMETRY_MIN_RANKS represented ranks, `on` at any size,
`off` never.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.graph import Task, TaskGraph
from sim.engine.engine import Engine, simulate
from sim.engine.result import SimResult
from sim.engine.symmetry import Symmetry
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.workload import dp_span

if TYPE_CHECKING:
    from sim.engine.equivalence import Placement

SYMMETRY_MIN_RANKS = 64  # `auto`: below this a full run is cheap and symmetry buys nothing
_NOT_TRIED = ("off (costs.symmetry)", "auto: fewer than")


@dataclass
class Plan:
    """What a symmetric run simulates: the representatives' graph and map."""

    graph: TaskGraph  # the representatives' tasks, global ranks
    symmetry: Symmetry
    whole: TaskGraph  # the first replica's tasks, global ranks, world of all replicas
    rep_task: np.ndarray  # per task of `whole`: its representative's index in `graph`


def plan(
    graph: TaskGraph,
    topo: Topology,
    costs: CostModel,
    replicas: np.ndarray | None = None,
    prefix: str = "",
    meta: dict[str, Any] | None = None,
) -> Plan | str:
    """The reduced run, or why there is none (a sentence). `prefix` and `meta` name the
    first replica's tasks as the full graph does (ids, dependencies and collective ids get
    the prefix; meta is merged into the graph's)."""
    ranks = _replica_ranks(graph, replicas)
    D, mp = ranks.shape
    if costs.symmetry == "off":
        return _NOT_TRIED[0]
    if costs.jitter is not None:
        return "jitter draws noise per task, so equivalent ranks would differ"
    if costs.symmetry == "auto" and D * mp < SYMMETRY_MIN_RANKS:
        return f"{_NOT_TRIED[1]} {SYMMETRY_MIN_RANKS} ranks"
    # imported here: a run that never tries symmetry (small, or off) skips the module
    from sim.engine.equivalence import node_classes, place

    where = place(topo, ranks)
    if isinstance(where, str):
        return where
    G = topo.gpus_per_node
    why_not_nodes = node_classes(graph, G)
    classes = why_not_nodes is None
    if D == 1 and not classes:
        return f"nodes differ: {why_not_nodes}"
    reps = np.arange(G) if classes else np.arange(mp)  # local ranks simulated
    rep_local = np.arange(mp) % G if classes else np.arange(mp)
    sym = _symmetry(topo, ranks, where, classes, rep_local)
    sym.info = {
        "ranks": int(D * mp),
        "ranks_simulated": len(reps),
        "replicas": int(D),
        "replica_placement": where.units,
        "node_classes": f"{mp // G} nodes as one" if classes else f"off: {why_not_nodes}",
    }
    whole, reduced, rep_task = _graphs(graph, ranks, reps, rep_local, prefix, meta or {})
    return Plan(reduced, sym, whole, rep_task)


def simulate_replicas(
    graph: TaskGraph,
    topo: Topology,
    costs: CostModel,
    replicas: np.ndarray | None = None,
    full: Callable[[], TaskGraph] | None = None,
    prefix: str = "",
    meta: dict[str, Any] | None = None,
    record_links: bool = False,
) -> SimResult:
    """One replica's graph simulated for all replicas (module docstring; `prefix` and `meta`
    as in `plan`; `record_links` as in `simulate`)."""
    p = plan(graph, topo, costs, replicas, prefix, meta)
    if isinstance(p, str):
        D = 1 if replicas is None else len(replicas)
        if D > 1 and full is None:
            raise ValueError(f"symmetry does not hold ({p}) and no full graph was given")
        whole = full() if D > 1 and full is not None else graph  # (given where D > 1)
        res = simulate(whole, topo, costs, record_links)
        if not p.startswith(_NOT_TRIED):  # small or switched off: the plain run, as before
            res.stats["symmetry"] = {"used": False, "reason": p}
        return res
    red = Engine(p.graph, topo, costs, p.symmetry, record_links).run()
    sym = p.symmetry
    idx = p.rep_task
    stats = dict(red.stats)
    stats["tasks_simulated"] = stats.pop("tasks")
    stats["tasks"] = len(p.whole)
    stats["symmetry"] = {"used": True, **sym.info}
    return SimResult(
        p.whole,
        topo,
        costs,
        red.start[idx],
        red.end[idx],
        red.sync_wait[idx],
        sym.expand_links(red.link_bytes),
        red.mem_peak[sym.rep_of[: p.whole.world_size]],
        red.mem_timeline,
        stats=stats,
        link_timeline=red.link_timeline,
    )


def _replica_ranks(graph: TaskGraph, replicas: np.ndarray | None) -> np.ndarray:
    if replicas is None:
        return np.arange(graph.world_size)[None, :]
    ranks = np.asarray(replicas, dtype=np.int64)
    if ranks.ndim != 2 or ranks.shape[1] != graph.world_size:
        raise ValueError(
            f"replicas: expected [replicas, {graph.world_size}] global ranks, got {ranks.shape}"
        )
    return ranks


def _symmetry(
    topo: Topology, ranks: np.ndarray, where: Placement, classes: bool, rep_local: np.ndarray
) -> Symmetry:
    D, mp = ranks.shape
    rep_of = np.arange(topo.world_size)
    rep_of[ranks] = ranks[0][rep_local][None, :]
    weight = np.ones(topo.world_size)
    weight[ranks[0]] = D * (mp // topo.gpus_per_node if classes else 1)
    # node links: every replica's j-th node stands for itself (or, with classes, for all)
    nodes = where.nodes
    node_rep = np.arange(topo.nodes)
    node_rep[nodes] = nodes[0][0] if classes else nodes[0][None, :]
    L = topo.links_per_node
    link_rep = (node_rep[:, None] * L + np.arange(L)[None, :]).ravel()
    if topo.num_trunks:
        link_rep = np.concatenate([link_rep, _trunk_rep(topo, where, classes)])
    return Symmetry(rep_of, weight, link_rep)


def _trunk_rep(topo: Topology, where: Placement, classes: bool) -> np.ndarray:
    """Representative trunk of every leaf-spine trunk: leaves of equivalent leaf groups on
    the same rail are equivalent."""
    f = topo.fabric
    assert f is not None
    g = where.unit_size
    units = -(-topo.nodes // g)
    unit_rep = np.arange(units)
    unit = where.nodes // g  # [D, J]
    if where.units == "within":
        unit_rep[unit[:, 0]] = unit[0, 0]
    else:  # whole groups: p-th group of every replica (any of them, with node classes)
        per = np.sort(np.unique(unit[0]))
        for d in range(len(unit)):
            mine = np.sort(np.unique(unit[d]))
            unit_rep[mine] = per[0] if classes else per
    rails = len(f.attach) if f.type == "rail" else 1
    leaf_rep = (unit_rep[:, None] * rails + np.arange(rails)[None, :]).ravel()
    leaf_rep = leaf_rep[: f.leaves(topo.nodes)]
    return (topo.trunk_base + 2 * leaf_rep[:, None] + np.arange(2)[None, :]).ravel()


def _graphs(
    graph: TaskGraph,
    ranks: np.ndarray,
    reps: np.ndarray,
    rep_local: np.ndarray,
    prefix: str,
    meta: dict[str, Any],
) -> tuple[TaskGraph, TaskGraph, np.ndarray]:
    """(the first replica's tasks on global ranks over the whole world, the representatives'
    tasks, and for each task of the first the index of its representative's)."""
    world = int(ranks.max()) + 1
    to_global = ranks[0]
    same = np.array_equal(to_global, np.arange(len(to_global))) and not prefix
    whole = TaskGraph(world, dict(graph.meta) | meta)
    groups: dict[tuple[int, bool], list[int]] = {}
    for t in graph:
        whole.add(t if same else _relabel(t, ranks, groups, prefix))
    is_rep = np.zeros(len(to_global), dtype=bool)
    is_rep[reps] = True
    reduced = TaskGraph(world, dict(whole.meta))
    where: dict[tuple[int, str, int], int] = {}
    count: dict[tuple[int, str], int] = {}
    keys = []
    for t in graph:
        k = count.get((t.rank, t.stream), 0)
        count[(t.rank, t.stream)] = k + 1
        keys.append((int(rep_local[t.rank]), t.stream, k))
        if is_rep[t.rank]:
            where[(t.rank, t.stream, k)] = len(reduced)
            reduced.add(whole.tasks[prefix + t.id])
    return whole, reduced, np.fromiter((where[k] for k in keys), dtype=np.int64, count=len(keys))


def _relabel(t: Task, ranks: np.ndarray, groups: dict[tuple[int, bool], Any], prefix: str) -> Task:
    to_global = ranks[0]
    group = None
    if t.group is not None:
        key = (id(t.group), dp_span.spans(t))
        group = groups.get(key)
        if group is None:
            # a gradient reduction's members are its members in every replica (dp_span)
            group = groups[key] = (
                dp_span.global_group(t.group, ranks)
                if key[1]
                else [int(to_global[x]) for x in t.group]
            )
    return replace(
        t,
        id=prefix + t.id,
        rank=int(to_global[t.rank]),
        deps=[prefix + d for d in t.deps],
        group=group,
        coll=None if t.coll is None else prefix + t.coll,
        peer=None if t.peer is None else int(to_global[t.peer]),
    )
