"""The task graph: the contract between strategy builders, the simulator and the executor.

A graph is plain data. Each task belongs to one rank and one stream; tasks on a stream run in
the order they were added (program order, as CUDA streams do); `deps` adds cross-stream and
cross-rank-free data dependencies. Communication tasks name a communicator `group` and a
collective id `coll` that is the same on every member, so both engines can pair them up.

`TaskGraph.validate()` runs on load and on `build()`; it rejects what would otherwise surface
as a hang: unknown dependencies, cycles (including cycles that only appear once stream order
and collective rendezvous are taken into account), collectives missing on a member, and
members or send/recv pairs that disagree on sizes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from sim.core.errors import GraphError

SCHEMA_VERSION = 1

# Stream kinds; a stream name is a kind optionally followed by ".<n>" (e.g. "comm.1").
STREAM_KINDS = ("compute", "comm", "copy")

COMPUTE_KINDS = frozenset(
    {"gemm", "elementwise", "gate", "encode", "decode", "softmax", "layernorm", "attention"}
)
COPY_KINDS = frozenset({"d2h", "h2d", "d2d"})
COLLECTIVE_KINDS = frozenset(
    {"all_to_all", "all_to_allv", "all_gather", "reduce_scatter", "all_reduce", "broadcast"}
)
P2P_KINDS = frozenset({"send", "recv"})
COMM_KINDS = COLLECTIVE_KINDS | P2P_KINDS
ALL_KINDS = COMPUTE_KINDS | COPY_KINDS | COMM_KINDS


def stream_kind(stream: str) -> str:
    return stream.split(".", 1)[0]


@dataclass
class Task:
    """One operation on one rank.

    Sizes: `flops` and `bytes` (memory traffic) for compute; `shape` for GEMMs
    (`{"m","n","k"}` plus optional `"batch"` for grouped expert GEMMs, work = batch*m*n*k as in
    PipeMoE Eq. 13); `bytes` is the payload this rank sends for collectives and copies; `split`
    the per-member send bytes of an all-to-allv (indexed like `group`); `recv_split` what it
    expects to receive from each member.
    """

    id: str
    rank: int
    stream: str
    kind: str
    deps: list[str] = field(default_factory=list)
    flops: float = 0.0
    bytes: float = 0.0
    shape: dict[str, int] | None = None
    group: list[int] | None = None
    coll: str | None = None
    split: list[float] | None = None
    recv_split: list[float] | None = None
    peer: int | None = None
    algo: str | None = None
    allocs: dict[str, float] = field(default_factory=dict)
    frees: list[str] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)

    @property
    def stream_kind(self) -> str:
        return stream_kind(self.stream)

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    def work(self) -> float:
        """Work for alpha-beta compute models: m*n*k (times batch) for GEMMs, bytes otherwise."""
        if self.shape and {"m", "n", "k"} <= self.shape.keys():
            s = self.shape
            return float(s.get("batch", 1) * s["m"] * s["n"] * s["k"])
        return float(self.bytes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # Drop fields left at their defaults: graphs of 10^5 tasks stay readable and small.
        return {k: v for k, v in d.items() if k in _REQUIRED or not _is_default(k, v)}


_REQUIRED = ("id", "rank", "stream", "kind")
_FIELDS = {f for f in Task.__dataclass_fields__}


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


_DEFAULTS = {f.name: _default(f) for f in fields(Task)}


def _is_default(name: str, value: Any) -> bool:
    default = _DEFAULTS[name]
    # `type` too: peer=0 must not pass for the default None, nor 0 for 0.0 in the wrong field
    return type(value) is type(default) and value == default


class TaskGraph:
    """Tasks of all ranks, in program order per (rank, stream)."""

    def __init__(self, world_size: int, meta: dict[str, Any] | None = None):
        if world_size < 1:
            raise GraphError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.meta: dict[str, Any] = dict(meta or {})
        self.tasks: dict[str, Task] = {}

    # -- building -------------------------------------------------------------------------
    def add(self, task: Task) -> Task:
        if task.id in self.tasks:
            raise GraphError(f"task {task.id!r}: duplicate task id")
        self.tasks[task.id] = task
        return task

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks.values())

    def streams(self) -> dict[tuple[int, str], list[Task]]:
        """(rank, stream) -> tasks in program order."""
        out: dict[tuple[int, str], list[Task]] = defaultdict(list)
        for t in self.tasks.values():
            out[(t.rank, t.stream)].append(t)
        return dict(out)

    # -- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "world_size": self.world_size,
            "meta": self.meta,
            "tasks": [t.to_dict() for t in self.tasks.values()],
        }

    @classmethod
    def from_dict(cls, data: Any, validate: bool = True) -> TaskGraph:
        if not isinstance(data, dict):
            raise GraphError("graph: expected a JSON object with 'schema_version' and 'tasks'")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise GraphError(
                f"graph: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
            )
        ws = data.get("world_size")
        if not isinstance(ws, int) or ws < 1:
            raise GraphError(f"graph: world_size must be a positive integer, got {ws!r}")
        g = cls(ws, data.get("meta") or {})
        tasks = data.get("tasks")
        if not isinstance(tasks, list):
            raise GraphError("graph: 'tasks' must be a list")
        for i, raw in enumerate(tasks):
            g.add(_task_from_dict(raw, i))
        if validate:
            g.validate()
        return g

    def to_json(self, path: str | Path) -> None:
        from sim.core.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def from_json(cls, path: str | Path, validate: bool = True) -> TaskGraph:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError as e:
            raise GraphError(f"graph file {path}: not found") from e
        except json.JSONDecodeError as e:
            raise GraphError(f"graph file {path}: not valid JSON ({e})") from e
        return cls.from_dict(data, validate=validate)

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        checked_groups: set[int] = set()  # builders share one group list across tasks
        for t in self.tasks.values():
            _check_task(t, self.world_size, checked_groups)
        for t in self.tasks.values():
            for d in t.deps:
                if d not in self.tasks:
                    raise GraphError(f"task {t.id!r}: depends on unknown task {d!r}")
        _check_collectives(self.tasks.values())
        _check_p2p(self.tasks.values())
        _check_acyclic(self)


def _task_from_dict(raw: Any, index: int) -> Task:
    if not isinstance(raw, dict):
        raise GraphError(f"tasks[{index}]: expected an object")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise GraphError(f"tasks[{index}] ({raw.get('id', '?')}): missing field(s) {missing}")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise GraphError(f"task {raw['id']!r}: unknown field(s) {sorted(unknown)}")
    try:
        return Task(**raw)
    except TypeError as e:
        raise GraphError(f"task {raw['id']!r}: {e}") from e


def _check_task(t: Task, world: int, checked_groups: set[int]) -> None:
    where = f"task {t.id!r}"
    if not isinstance(t.rank, int) or not 0 <= t.rank < world:
        raise GraphError(f"{where}: rank {t.rank!r} outside 0..{world - 1}")
    if t.stream_kind not in STREAM_KINDS:
        raise GraphError(f"{where}: stream {t.stream!r} must start with one of {STREAM_KINDS}")
    if t.kind not in ALL_KINDS:
        raise GraphError(f"{where}: unknown kind {t.kind!r} (known: {sorted(ALL_KINDS)})")
    for name in ("flops", "bytes"):
        v = getattr(t, name)
        if not isinstance(v, (int, float)) or v < 0:
            raise GraphError(f"{where}: {name} must be a non-negative number, got {v!r}")
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
            if any(v < 0 for v in t.split):
                raise GraphError(f"{where}: negative entry in 'split'")
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
        if t.kind in COLLECTIVE_KINDS:
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
            by_rank = {m.rank: m for m in members}
            group = first.group or []
            pos = {r: i for i, r in enumerate(group)}
            for m in members:
                if m.recv_split is None:
                    continue
                for src in group:
                    sent = by_rank[src].split[pos[m.rank]]  # type: ignore[index]
                    want = m.recv_split[pos[src]]
                    if abs(sent - want) > 1e-9 * max(1.0, abs(sent)):
                        raise GraphError(
                            f"collective {cid!r}: task {m.id!r} expects {want} bytes from rank "
                            f"{src}, whose task {by_rank[src].id!r} sends {sent}"
                        )
        elif first.kind in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce"):
            for m in members[1:]:
                if abs(m.bytes - first.bytes) > 1e-9 * max(1.0, first.bytes):
                    raise GraphError(
                        f"collective {cid!r}: task {m.id!r} has {m.bytes} bytes but "
                        f"{first.id!r} has {first.bytes}; {first.kind} needs equal sizes"
                    )


def _check_p2p(tasks: Iterable[Task]) -> None:
    sends: dict[str, Task] = {}
    recvs: dict[str, Task] = {}
    for t in tasks:
        if t.kind in P2P_KINDS:
            table = sends if t.kind == "send" else recvs
            if t.coll in table:
                raise GraphError(f"task {t.id!r}: {t.kind} id {t.coll!r} used twice")
            table[t.coll] = t  # type: ignore[index]
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
    path = sorted(order, key=order.get)[order[n] :]
    return list(reversed(path))
