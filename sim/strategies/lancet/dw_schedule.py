"""Lancet's weight-gradient schedule pass (Sec. 4, Alg. 1) over a task graph.

Per rank: the weight-gradient tasks (tag `role: dW`) whose only consumers are gradient
reductions can run at any time after their inputs. For each all-to-all of the backward (in
issue order), the set of such tasks with no dependency path to or from it is found
(labelling, Sec. 4.1); then, greedily, the unused one whose time best matches the window's
still uncovered time is assigned to it until the window is covered (Sec. 4.2). A task is
moved on its compute stream to right after the last compute task the all-to-all waits for,
so it runs while the all-to-all is in flight.

Two guards keep a move safe, where the paper's compiler IR has them by construction: a task
is only moved to a point after all its own inputs (so stream order never waits on the
future), and only into the uncovered part of a window (best fit among the tasks that fit:
a task longer than what is left would push the computation after the all-to-all back).
Generic: it reads roles, kinds and dependencies, nothing of MoE.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sim.core.graph import Task, TaskGraph

A2A_KINDS = ("all_to_all", "all_to_allv")
REDUCTIONS = ("all_reduce", "reduce_scatter")


def schedule_dw(graph: TaskGraph, duration: Callable[[Task], float]) -> dict[str, str]:
    """Reorder `graph`'s compute streams in place; returns {dW task id: all-to-all id}."""
    consumers: dict[str, list[Task]] = defaultdict(list)
    for t in graph:
        for d in t.deps:
            consumers[d].append(t)
    assigned: dict[str, str] = {}
    for (rank, stream), seq in graph.streams().items():
        if not stream.startswith("compute"):
            continue
        assigned |= _schedule_rank(graph, rank, seq, consumers, duration)
    return assigned


def _schedule_rank(
    graph: TaskGraph,
    rank: int,
    seq: list[Task],
    consumers: dict[str, list[Task]],
    duration: Callable[[Task], float],
) -> dict[str, str]:
    pos = {t.id: i for i, t in enumerate(seq)}
    a2as = [
        t for t in graph if t.rank == rank and t.kind in A2A_KINDS and t.tags.get("phase") == "bwd"
    ]
    movable = [
        t
        for t in seq
        if t.tags.get("role") == "dW" and all(c.kind in REDUCTIONS for c in consumers.get(t.id, []))
    ]
    if not a2as or not movable:
        return {}
    mine = {t.id: t for t in graph if t.rank == rank}
    order = list(seq)
    used: set[str] = set()
    out: dict[str, str] = {}
    t_w = {t.id: duration(t) for t in movable}
    for a in a2as:
        anc = _reach(mine, a, lambda t: t.deps)
        desc = _reach(mine, a, lambda t: [c.id for c in consumers.get(t.id, [])])
        launch = max((pos[x] for x in anc if x in pos), default=-1)
        if launch < 0:
            continue
        free = [
            w
            for w in movable
            if w.id not in used
            and w.id not in anc
            and w.id not in desc
            and max((pos[d] for d in w.deps if d in pos), default=-1) <= launch
        ]
        left = duration(a)
        chosen: list[Task] = []
        while left > 0:
            fits = [w for w in free if w.id not in used and t_w[w.id] <= left]
            if not fits:
                break
            best = min(fits, key=lambda w: abs(left - t_w[w.id]))
            used.add(best.id)
            chosen.append(best)
            out[best.id] = a.id
            left -= t_w[best.id]
        if chosen:
            anchor = seq[launch]
            order = [t for t in order if t.id not in {w.id for w in chosen}]
            at = order.index(anchor) + 1
            while at < len(order) and out.get(order[at].id) is not None:
                at += 1  # after the tasks already placed in this launch's windows
            order[at:at] = chosen
    if out:
        _reorder(graph, rank, seq, order)
    return out


def _reach(mine: dict[str, Task], root: Task, edges: Callable[[Task], list[str]]) -> set[str]:
    """Ids reachable from `root` along `edges` among the rank's own tasks (paths through
    other ranks do not order this rank's tasks)."""
    seen: set[str] = set()
    stack = [root]
    while stack:
        for x in edges(stack.pop()):
            if x in mine and x not in seen:
                seen.add(x)
                stack.append(mine[x])
    return seen


def _reorder(graph: TaskGraph, rank: int, old: list[Task], new: list[Task]) -> None:
    """Put the rank's compute stream in `new` order (program order is insertion order)."""
    stream = old[0].stream
    tasks = list(graph.tasks.values())
    slots = [i for i, t in enumerate(tasks) if t.rank == rank and t.stream == stream]
    for i, t in zip(slots, new, strict=True):
        tasks[i] = t
    graph.tasks = {t.id: t for t in tasks}
