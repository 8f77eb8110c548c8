"""Load-time checks of a task graph: what would otherwise surface as a hang in either engine.

Unknown dependencies, dependencies on another rank's tasks, cycles (including cycles that only
appear once stream order and collective rendezvous are taken into account), collectives
missing on a member, and members or send/recv pairs that disagree on sizes are rejected with a
message naming the tasks. Ranks, groups and peers are checked against the world and kinds and
streams against the vocabulary here, for every graph; the fields of a graph read from a file
(types, finite sizes in range, what each kind needs) are checked before, by its schema
(`sim.core.graph_schema`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sim.core.errors import GraphError
from sim.core.kinds import (
    ALL_KINDS,
    COLLECTIVE_KINDS,
    COMM_KINDS,
    P2P_KINDS,
    STREAM_KINDS,
)

if TYPE_CHECKING:
    from sim.core.graph import Task, TaskGraph


def validate_graph(g: TaskGraph) -> None:
    """Raise GraphError for the first problem found in `g`."""
    checked_groups: set[int] = set()  # builders share one group list across tasks
    for t in g.tasks.values():
        _check_task(t, g.world_size, checked_groups)
    for t in g.tasks.values():
        for d in t.deps:
            dep = g.tasks.get(d)
            if dep is None:
                raise GraphError(f"task {t.id!r}: depends on unknown task {d!r}")
            if dep.rank != t.rank:  # neither engine could honour it: no data moves
                raise GraphError(
                    f"task {t.id!r} on rank {t.rank} depends on {d!r} of rank {dep.rank}: "
                    "a task waits only for tasks of its own rank; data crosses ranks through "
                    "communication (send/recv or a collective)"
                )
    _check_collectives(g.tasks.values())
    _check_p2p(g.tasks.values())
    _check_acyclic(g)


def _check_task(t: Task, world: int, checked_groups: set[int]) -> None:
    where = f"task {t.id!r}"
    if not isinstance(t.rank, int) or not 0 <= t.rank < world:
        raise GraphError(f"{where}: rank {t.rank!r} outside 0..{world - 1}")
    if t.stream_kind not in STREAM_KINDS:
        raise GraphError(f"{where}: stream {t.stream!r} must start with one of {STREAM_KINDS}")
    if t.kind not in ALL_KINDS:
        raise GraphError(f"{where}: unknown kind {t.kind!r} (known: {sorted(ALL_KINDS)})")
    if t.kind in COLLECTIVE_KINDS:
        if not t.group or not t.coll:
            raise GraphError(f"{where}: collective {t.kind} needs 'group' and 'coll'")
        if id(t.group) not in checked_groups:
            if len(set(t.group)) != len(t.group) or any(not 0 <= r < world for r in t.group):
                raise GraphError(f"{where}: group {t.group} has repeated or out-of-range ranks")
            checked_groups.add(id(t.group))
        if t.kind == "all_to_allv":
            if t.split is None or len(t.split) != len(t.group):
                raise GraphError(f"{where}: all_to_allv needs 'split' with one entry per member")
            if t.recv_split is not None and len(t.recv_split) != len(t.group):
                raise GraphError(f"{where}: 'recv_split' needs one entry per member")
    if t.kind in P2P_KINDS:
        if t.peer is None or not 0 <= t.peer < world or t.peer == t.rank:
            raise GraphError(f"{where}: {t.kind} needs a 'peer' rank other than its own")
        if not t.coll:
            raise GraphError(f"{where}: {t.kind} needs 'coll' (the id its matching task shares)")
    if t.kind in COMM_KINDS and t.stream_kind != "comm":
        raise GraphError(f"{where}: {t.kind} must run on a comm stream, not {t.stream!r}")


def _check_collectives(tasks: Iterable[Task]) -> None:
    by_coll: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        if t.kind in COLLECTIVE_KINDS:  # coll is set: _check_task refused a collective without
            by_coll[t.coll].append(t)  # type: ignore[index]
    for cid, members in by_coll.items():
        first = members[0]
        ranks = [m.rank for m in members]
        if len(set(ranks)) != len(ranks):
            raise GraphError(f"collective {cid!r}: a rank has it twice ({sorted(ranks)})")
        for m in members[1:]:
            if m.kind != first.kind:
                raise GraphError(
                    f"collective {cid!r}: task {m.id!r} is {m.kind} but {first.id!r} is "
                    f"{first.kind}"
                )
            if m.group is not first.group and m.group != first.group:
                raise GraphError(
                    f"collective {cid!r}: task {m.id!r} has group {m.group}, "
                    f"{first.id!r} has {first.group}"
                )
            if m.algo != first.algo:
                raise GraphError(
                    f"collective {cid!r}: task {m.id!r} uses algo {m.algo!r}, "
                    f"{first.id!r} uses {first.algo!r}"
                )
        group = set(first.group or ())
        if len(members) != len(group) or not set(ranks) <= group:
            strays = sorted(set(ranks) - group)
            if strays:
                raise GraphError(
                    f"collective {cid!r}: rank(s) {strays} launch it but are not in its group "
                    f"{first.group}"
                )
            raise GraphError(
                f"collective {cid!r} ({first.kind}): no task on member rank(s) "
                f"{sorted(group - set(ranks))}; present on {sorted(ranks)}: it could never "
                f"complete"
            )
        if first.kind == "all_to_allv":
            _check_splits(cid, members, first.group or [])
        elif first.kind in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce"):
            for m in members[1:]:
                if abs(m.bytes - first.bytes) > 1e-9 * max(1.0, first.bytes):
                    raise GraphError(
                        f"collective {cid!r}: task {m.id!r} has {m.bytes} bytes but "
                        f"{first.id!r} has {first.bytes}; {first.kind} needs equal sizes"
                    )


def _check_splits(cid: str, members: list[Task], group: list[int]) -> None:
    """What each member expects to receive (recv_split) is what its sources send to it.
    One array comparison per collective: at thousands of ranks a loop over the P^2 pairs
    would cost seconds."""
    import numpy as np

    by_rank = {m.rank: m for m in members}
    pos = {r: i for i, r in enumerate(group)}
    receivers = [m for m in members if m.recv_split is not None]
    if not receivers:
        return
    sent = np.array([by_rank[src].split for src in group], dtype=float)  # [src, dst]
    want = np.array([m.recv_split for m in receivers], dtype=float)  # [receiver, src]
    got = sent[:, [pos[m.rank] for m in receivers]].T  # [receiver, src]
    bad = np.abs(got - want) > 1e-9 * np.maximum(1.0, np.abs(got))
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        m, src = receivers[i], group[j]
        raise GraphError(
            f"collective {cid!r}: task {m.id!r} expects {want[i, j]:g} bytes from rank "
            f"{src}, whose task {by_rank[src].id!r} sends {got[i, j]:g}"
        )


def _check_p2p(tasks: Iterable[Task]) -> None:
    sends: dict[str, Task] = {}
    recvs: dict[str, Task] = {}
    collectives: dict[str, Task] = {}  # one member per id: the engine groups comm tasks by id
    for t in tasks:
        if t.kind in COLLECTIVE_KINDS and t.coll is not None:
            collectives.setdefault(t.coll, t)
        if t.kind in P2P_KINDS:
            table = sends if t.kind == "send" else recvs
            if t.coll in table:
                raise GraphError(f"task {t.id!r}: {t.kind} id {t.coll!r} used twice")
            table[t.coll] = t  # type: ignore[index]  # set: _check_task refused a p2p without
    for cid, t in [*sends.items(), *recvs.items()]:
        # the engine would merge the pair into the collective's rendezvous (no cost for it)
        c = collectives.get(cid)
        if c is not None:
            raise GraphError(
                f"task {t.id!r}: {t.kind} id {cid!r} is also the id of {c.kind} task {c.id!r}; "
                "a send/recv pair needs an id of its own"
            )
    for cid, s in sends.items():
        r = recvs.pop(cid, None)
        if r is None:
            raise GraphError(f"task {s.id!r}: send {cid!r} to rank {s.peer} has no matching recv")
        if r.rank != s.peer or r.peer != s.rank:
            raise GraphError(
                f"task {s.id!r}: send {cid!r} {s.rank}->{s.peer} is matched by recv {r.id!r} "
                f"on rank {r.rank} from {r.peer}"
            )
        if abs(r.bytes - s.bytes) > 1e-9 * max(1.0, s.bytes):
            raise GraphError(
                f"task {s.id!r}: sends {s.bytes} bytes but recv {r.id!r} expects {r.bytes}"
            )
    for cid, r in recvs.items():
        raise GraphError(f"task {r.id!r}: recv {cid!r} from rank {r.peer} has no matching send")


def _check_acyclic(g: TaskGraph) -> None:
    """Kahn's algorithm over tasks, with stream order and collective rendezvous as edges.

    The members of one collective (or a send/recv pair) are merged into a single node: they
    start together, so a member that (transitively) waits for another member's completion
    is a deadlock, and so are two collectives launched in opposite orders on two ranks.
    """
    node_of: dict[str, str] = {}
    for t in g.tasks.values():
        node_of[t.id] = f"coll:{t.coll}" if t.kind in COMM_KINDS else t.id
    succ: dict[str, set[str]] = defaultdict(set)
    nodes = set(node_of.values())
    indeg: dict[str, int] = dict.fromkeys(nodes, 0)

    def edge(a: str, b: str) -> None:
        if a == b:
            return
        if b not in succ[a]:
            succ[a].add(b)
            indeg[b] += 1

    for t in g.tasks.values():
        for d in t.deps:
            if node_of[d] == node_of[t.id]:
                raise GraphError(f"task {t.id!r}: depends on {d!r}, a member of its own collective")
            edge(node_of[d], node_of[t.id])
    for seq in g.streams().values():
        for a, b in zip(seq, seq[1:]):
            edge(node_of[a.id], node_of[b.id])

    ready = [n for n, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ.get(n, ()):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if seen == len(nodes):
        return
    stuck = {n for n, k in indeg.items() if k > 0}
    cycle = _find_cycle(stuck, succ)
    members: dict[str, list[str]] = defaultdict(list)
    for tid, n in node_of.items():
        members[n].append(tid)
    shown = " -> ".join(
        n
        if not n.startswith("coll:")
        else f"{n[5:]!r} on ({', '.join(members[n][:4])}"
        + (", ..." if len(members[n]) > 4 else "")
        + ")"
        for n in cycle + cycle[:1]
    )
    blocked = sum(len(members[n]) for n in stuck)
    raise GraphError(
        f"graph has a cycle through deps, stream order or collective rendezvous: {shown}; "
        f"{blocked} task(s) could never start"
    )


def _find_cycle(stuck: set[str], succ: dict[str, set[str]]) -> list[str]:
    """One cycle among nodes Kahn's algorithm could not schedule (every such node has a
    stuck predecessor, so walking predecessors must revisit a node)."""
    pred: dict[str, str] = {}
    for a in stuck:
        for b in succ.get(a, ()):
            if b in stuck:
                pred.setdefault(b, a)
    n = min(stuck)
    order: dict[str, int] = {}
    while n not in order:
        order[n] = len(order)
        n = pred[n]
    path = sorted(order, key=order.__getitem__)[order[n] :]
    return list(reversed(path))
