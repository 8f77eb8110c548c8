"""The task graph: the contract between strategy builders, the simulator and the executor.

A graph is plain data. Each task belongs to one rank and one stream; tasks on a stream run in
the order they were added (program order, as CUDA streams do); `deps` adds cross-stream and
cross-rank-free data dependencies. The order in which a rank's tasks were added, over all its
streams, is that rank's host issue order: the order a single host thread launches them in.
It matters where streams share a hardware queue (`costs.resources.max_connections`,
`sim.engine.queues`): there a kernel cannot start before every kernel issued earlier on its
queue has started, so each rank's tasks must be in an order its host could issue them (a task
after the tasks it depends on, collectives in one order on every rank; `sim.core.issue`, which
`sim.strategies.build` applies to every strategy's graph). Communication tasks name a
communicator `group` and a collective id `coll` that is the same on every member, so both
engines can pair them up.

A graph file is read safely (`sim.core.safeload`) and checked field by field against its
schema (`sim.core.graph_schema`, `moesim schema graph`); `TaskGraph.validate()` runs on load and
on `build()`: the checks between tasks (what would otherwise surface as a hang) are in
`sim.core.graph_checks`, the kinds of tasks and streams in `sim.core.kinds`. A graph never grows
past `limits.max_tasks` tasks (`sim.core.limits`), built or loaded.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from sim.core import limits
from sim.core.errors import ConfigError, GraphError
from sim.core.graph_checks import validate_graph
from sim.core.kinds import COMM_KINDS, SCHEMA_VERSION, stream_kind


@dataclass
class Task:
    """One operation on one rank.

    Sizes: `flops` and `bytes` (memory traffic) for compute; `shape` for GEMMs
    (`{"m","n","k"}` plus optional `"batch"` for grouped expert GEMMs, work = batch*m*n*k as in
    PipeMoE Eq. 13); `bytes` is the payload this rank sends for collectives and copies; `split`
    the per-member send bytes of an all-to-allv (indexed like `group`); `recv_split` what it
    expects to receive from each member. `sms`: streaming multiprocessors the kernel holds
    from launch to end (0: it reserves none and shares the GPU; see
    `sim.hardware.costs.resources` for what a reservation costs the kernels beside it).
    `host_sync`: the host waits for this task to finish before it launches anything after it
    on the rank (a d2h of split sizes and a stream synchronize; `sim.engine.launch`).
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
    sms: int = 0
    host_sync: bool = False

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
        # read once: a builder adds 10^5 tasks and the bound must not cost a lookup each
        self._max_tasks = limits.active().max_tasks
        # all-to-allv splits hold members x peers numbers per collective, the bulk of a large
        # graph's memory (tens of bytes each): bounded like any input-sized array
        self._split_entries = 0
        self._max_split_entries = limits.active().max_matrix

    # -- building -------------------------------------------------------------------------
    def add(self, task: Task) -> Task:
        if task.id in self.tasks:
            raise GraphError(f"task {task.id!r}: duplicate task id")
        if len(self.tasks) >= self._max_tasks:
            limits.active().check("max_tasks", len(self.tasks) + 1, "task graph: tasks")
        if task.split is not None:
            self._split_entries += len(task.split) + len(task.recv_split or ())
            if self._split_entries > self._max_split_entries:
                what = "task graph: all-to-allv split entries (members x peers, summed)"
                limits.active().check("max_matrix", self._split_entries, what)
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
    def from_dict(cls, data: Any, validate: bool = True, source: str = "graph") -> TaskGraph:
        """A graph from its JSON form, checked against the schema (every field, per kind)
        and then, unless `validate` is false, between tasks."""
        from sim.core import graph_schema
        from sim.core.schema import check

        lim = limits.active()
        tasks = data.get("tasks") if isinstance(data, dict) else None
        if isinstance(tasks, list):  # before validating 10^7 of them
            lim.check("max_tasks", len(tasks), f"{source}: tasks")
        doc = check(
            graph_schema.adapter(),
            data,
            source,
            error=GraphError,
            locate=graph_schema.locate(data),
            known=graph_schema.known_keys,
        )
        lim.check("max_ranks", doc["world_size"], f"{source}: world_size")
        g = cls(doc["world_size"], doc.get("meta") or {})
        for raw in doc["tasks"]:
            g.add(Task(**raw))
        if validate:
            g.validate()
        return g

    def to_json(self, path: str | Path) -> None:
        from sim.core.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def from_json(cls, path: str | Path, validate: bool = True) -> TaskGraph:
        """A graph file, read safely: a regular UTF-8 file within the input size limit,
        finite numbers only (`sim.core.safeload`)."""
        from sim.core.safeload import load_json

        try:
            data = load_json(path, "graph file")
        except ConfigError as e:
            raise GraphError(str(e)) from None
        return cls.from_dict(data, validate=validate, source=f"graph file {path}")

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise GraphError for the first problem found (see `sim.core.graph_checks`)."""
        validate_graph(self)
