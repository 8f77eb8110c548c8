"""Host issue order: the order in which each rank's host thread launches its tasks.

A graph's insertion order, per rank, is that rank's host issue order (`sim.core.graph`): the
order its launch thread issues tasks in (`sim.engine.launch`) and its hardware queues take
them in (`sim.engine.queues`). On one hardware queue per rank
(`costs.resources.max_connections: 1`) a kernel starts only after every kernel issued before
it on the rank has started (a compute kernel of many waves: ended), so an issue order that
puts a task before one it waits for, or that has two ranks wait on each other's queues,
deadlocks. No real program has such
an order: a host thread issues a kernel after the kernels it consumes, and SPMD ranks issue
their collectives in one order.

`stuck` finds the tasks that could never run under the strictest setting (one queue per rank,
every compute kernel holding its queue to its end, host syncs waiting); it needs no times,
since every condition of the engine is "this waits for that to start / to end". A graph
without stuck tasks runs with any number of queues: a queue then holds a subsequence of the
rank's order, and its conditions follow from those of one queue.

`in_issue_order` keeps a builder's order where it is launchable (the order is then the
builder's modelling choice, e.g. a pipeline schedule written with its host syncs in mind)
and otherwise issues each rank's tasks the way a host thread running the builder's program
would: a task after every task of its rank it depends on and after its stream's previous
task (stream order is program order and never changes), communication as soon as its inputs
are issued and compute in the builder's order (see `issue_order` for why), and collectives
in one order on every rank (one topological order of the whole graph, each collective a
single node, as every SPMD rank walks the same program).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from sim.core.graph import Task, TaskGraph
from sim.core.kinds import COMM_KINDS, COMPUTE_KINDS


def _holds(t: Task) -> bool:
    """Whether t may keep a shared queue until it ends (`sim.engine.queues`): any compute
    kernel that reserves no SMs; a one-wave GEMM frees it earlier, which only helps."""
    return t.kind in COMPUTE_KINDS and t.sms == 0


def stuck(tasks: Sequence[Task]) -> list[int]:
    """Indices of the tasks that can never finish when each rank has one hardware queue fed
    in this order (empty: the order is launchable with any `max_connections`).

    Events: S(i) task i starts, F(i) it ends, A(c) every member of collective c has started.
    S(i) needs F(its stream's previous task), F(each dep), S(the rank's previous task) or its
    F where that task holds the queue, and F(the rank's last host sync before i); F(i) needs
    S(i) and, for a collective or send/recv, A(its id). Whatever no chain of met conditions
    reaches is stuck (a least fixed point: the engine's conditions are all conjunctions).
    """
    n = len(tasks)
    index = {t.id: i for i, t in enumerate(tasks)}
    colls: dict[str, int] = {}
    for t in tasks:
        if t.kind in COMM_KINDS and t.coll is not None and t.coll not in colls:
            colls[t.coll] = 2 * n + len(colls)
    src: list[int] = []  # edges: event dst needs event src
    dst: list[int] = []
    last_on_stream: dict[tuple[int, str], int] = {}
    last_on_rank: dict[int, int] = {}
    last_sync: dict[int, int] = {}
    for i, t in enumerate(tasks):
        s = (t.rank, t.stream)
        before = [n + index[d] for d in t.deps if d in index]
        if s in last_on_stream:
            before.append(n + last_on_stream[s])
        last_on_stream[s] = i
        p = last_on_rank.get(t.rank)
        if p is not None:
            before.append(n + p if _holds(tasks[p]) else p)
        h = last_sync.get(t.rank)
        if h is not None:  # the host issues nothing after a sync until it has ended
            before.append(n + h)
        last_on_rank[t.rank] = i
        if t.host_sync:
            last_sync[t.rank] = i
        src += before
        dst += [i] * len(before)
        src.append(i)
        dst.append(n + i)
        c = colls.get(t.coll) if t.coll is not None else None
        if c is not None:
            src += (i, c)
            dst += (c, n + i)
    waits = _unreached(2 * n + len(colls), src, dst)
    return [i for i in range(n) if waits[n + i]]


def _sorted_edges(m: int, src: list[int], dst: list[int]) -> tuple[list[int], list[int]]:
    """Edges by source as flat lists (CSR): the targets of node a are
    targets[starts[a]:starts[a + 1]]. A list per node would be 10^5 small objects, and the
    garbage collector's passes over them cost more than the walk itself."""
    a = np.asarray(src, dtype=np.int64)
    by_src = np.argsort(a, kind="stable")
    starts = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(a, minlength=m), out=starts[1:])
    return starts.tolist(), np.asarray(dst, dtype=np.int64)[by_src].tolist()


def _unreached(m: int, src: list[int], dst: list[int]) -> list[bool]:
    """Per node of a graph of m nodes: whether it waits, through its edges, on a cycle
    (Kahn's algorithm: what is never freed of every predecessor)."""
    starts, targets = _sorted_edges(m, src, dst)
    need = np.bincount(np.asarray(dst, dtype=np.int64), minlength=m).tolist()
    ready = [e for e in range(m) if need[e] == 0]
    for e in ready:  # grows as it goes: a worklist
        for k in range(starts[e], starts[e + 1]):
            b = targets[k]
            need[b] -= 1
            if need[b] == 0:
                ready.append(b)
    return [k > 0 for k in need]


def issue_order(tasks: Sequence[Task]) -> list[Task]:
    """The tasks, rank after rank, each rank's in the order its host issues them.

    One topological order of the whole graph over its dependencies and stream orders, with
    a collective (or a send/recv pair) one node: every rank meets its collectives in the same
    order, so no two ranks wait on each other. Among the tasks that may be issued next,
    communication goes first (a communication kernel fits one wave and frees the queue as it
    starts, so it costs the compute behind it nothing, while a compute kernel ahead of it
    holds it back to its end; programs written for one queue issue that way, as
    CUDA_DEVICE_MAX_CONNECTIONS=1 asks of them), then the earliest in the rank's builder
    order. A chunked exchange then goes out as far as its stream allows and each chunk's
    compute is issued as the exchange after it needs it: send 0, send 1, ..., compute 0,
    return 0, compute 1, return 1, ... Ties across ranks go to the same place in each
    rank's program, then the lower rank.
    """
    n = len(tasks)
    index = {t.id: i for i, t in enumerate(tasks)}
    pos = [0] * n  # place in its rank's builder order
    count: dict[int, int] = {}
    for i, t in enumerate(tasks):
        pos[i] = count.get(t.rank, 0)
        count[t.rank] = pos[i] + 1
    node = list(range(n))  # task -> node: a collective's members share their first's node
    members: dict[int, list[int]] = {}  # collective node -> its tasks
    first: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.kind in COMM_KINDS and t.coll is not None:
            node[i] = first.setdefault(t.coll, i)
            members.setdefault(node[i], []).append(i)
    # a node's priority as one int (communication first, its place in the rank's program,
    # its rank, itself): a heap of ints, not of 10^5 tuples
    R, N = max(count, default=0) + 1, n + 1
    P = max(pos, default=0) + 1
    key = [
        ((int(t.kind in COMPUTE_KINDS) * P + pos[i]) * R + t.rank) * N + i
        for i, t in enumerate(tasks)
    ]
    for nd, ms in members.items():
        key[nd] = ((min(pos[i] for i in ms) * R) + min(tasks[i].rank for i in ms)) * N + nd
    src: list[int] = []
    dst: list[int] = []
    prev: dict[tuple[int, str], int] = {}
    for i, t in enumerate(tasks):
        s = (t.rank, t.stream)
        before = [node[index[d]] for d in t.deps if d in index]
        if s in prev:
            before.append(node[prev[s]])
        prev[s] = i
        b = node[i]
        for a in before:
            if a != b:
                src.append(a)
                dst.append(b)
    starts, targets = _sorted_edges(n, src, dst)
    indeg = np.bincount(np.asarray(dst, dtype=np.int64), minlength=n).tolist()
    heap = [key[nd] for nd in range(n) if node[nd] == nd and indeg[nd] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        nd = heapq.heappop(heap) % N
        order.extend(members.get(nd, (nd,)))
        for k in range(starts[nd], starts[nd + 1]):
            b = targets[k]
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(heap, key[b])
    if len(order) < n:  # a cycle of dependencies: validation names it; keep the graph
        return list(tasks)
    by_rank: dict[int, list[Task]] = {t.rank: [] for t in tasks}  # ranks as the builder had
    for i in order:
        by_rank[tasks[i].rank].append(tasks[i])
    return [t for seq in by_rank.values() for t in seq]


def in_issue_order(graph: TaskGraph) -> TaskGraph:
    """`graph` itself where its order is launchable on one queue per rank (`stuck` finds
    nothing), else a graph of the same tasks in `issue_order`."""
    tasks = list(graph)
    if not stuck(tasks):
        return graph
    out = TaskGraph(graph.world_size, graph.meta)
    for t in issue_order(tasks):
        out.add(t)
    return out
