"""Measured operations to a task graph: program order, inferred waits, matched collectives.

Every importer turns its format into `Op`s (one measured operation: rank, stream, kind, start,
end, sizes, and for communication a `match` key that is equal on the members of one
collective) and hands them to `to_graph`, which recovers the structure the trace does not
spell out:

- **program order**: ops of one stream run in start order; where one physical thread or device
  stream (`lane`) carries ops of several graph streams (a CUDA stream with NCCL and compute
  kernels), consecutive ops of the lane are chained by a dependency;
- **cross-stream waits**: an op that starts later than its lane predecessor and its known
  dependencies allow (by more than `WAIT_MIN_S`) waited for something: the op of another lane
  of its rank that ended last before it started becomes its dependency (an event wait, a
  `work.wait()`, a thread hand-off; the executor's and CUDA's semantics alike). Where the
  importer knows which side an op ran on (`Op.side`: the host's threads or the device's
  streams), a wait is inferred only within a side: a host op waits on device work only
  where the trace shows a synchronisation (`Op.syncs`: the part of a host op after a
  synchronising CUDA call), and a device op on the host only through its launch, which the
  importer links itself;
- **collectives**: members are the ops sharing a `match` key, one per rank; the group is the
  ranks present (a trace of some ranks of a larger group replays those ranks).

Every dependency it adds ended before its dependent started in the measurement, so the graph
is acyclic and the replay can reproduce the measured times (sim.analysis.replay).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sim.core import limits
from sim.core.errors import ConfigError, GraphError
from sim.core.graph import Task, TaskGraph
from sim.core.kinds import COLLECTIVE_KINDS, COMM_KINDS, P2P_KINDS

WAIT_MIN_S = 2e-6  # a later start than this after the op could go counts as a wait
ORDER_TOL_S = 1e-7  # clock noise allowed when checking that a dependency ended first
# the widest span of one trace's times: a profile lasts seconds to minutes; a time far
# outside this is a broken clock or a made-up value, and would become the measured makespan
MAX_SPAN_S = 86_400.0


@dataclass
class Op:
    """One measured operation, as an importer read it."""

    id: str
    rank: int
    stream: str  # graph stream: "compute", "comm.g1", "copy.s7", ...
    kind: str
    start: float  # seconds, one clock for every rank
    end: float
    lane: str | None = None  # physical thread / device stream, if it carries several streams
    bytes: float = 0.0
    flops: float = 0.0
    shape: dict[str, int] | None = None
    split: list[float] | None = None  # all_to_allv: bytes sent to each member
    match: Any = None  # communication: the key its collective's members share
    peer: int | None = None  # send / recv
    # ranks the collective must have a member on, where the importer knows them: a member
    # missing from the trace would otherwise shrink the group and replay the others alone
    members: list[int] | None = None
    deps: list[str] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)
    side: str | None = None  # "host" or "device" where the importer knows it
    syncs: bool = False  # a host op that starts where a synchronisation with the device ended


def to_graph(
    ops: list[Op], world: int, source: str, meta: dict[str, Any] | None = None
) -> tuple[TaskGraph, dict[str, tuple[float, float]]]:
    """The task graph of `ops` and each task's measured (start, end)."""
    if not ops:
        raise ConfigError(f"{source}: no operations to replay")
    limits.active().check("max_tasks", len(ops), f"{source}: operations to replay")
    for o in ops:  # every importer checks its own input; this is the backstop for all
        if not (math.isfinite(o.start) and math.isfinite(o.end) and o.start <= o.end):
            raise ConfigError(f"{source}: operation {o.id!r}: expected finite start <= end")
    ops = sorted(ops, key=lambda o: (o.start, o.end))
    if max(o.end for o in ops) - ops[0].start > MAX_SPAN_S:
        raise ConfigError(
            f"{source}: operations span more than {MAX_SPAN_S:g} s; expected one measurement"
        )
    by_id: dict[str, Op] = {}
    for o in ops:
        if o.id in by_id:
            raise ConfigError(f"{source}: operation id {o.id!r} appears twice")
        by_id[o.id] = o
    _drop_late_deps(ops, by_id)
    _chain_lanes(ops)
    coll = _match_collectives(ops, source)
    inferred = _infer_waits(ops, by_id)
    g = TaskGraph(world, {**(meta or {}), "inferred_waits": inferred})
    for o in ops:
        g.add(
            Task(
                o.id,
                o.rank,
                o.stream,
                o.kind,
                deps=list(dict.fromkeys(o.deps)),
                flops=float(o.flops),
                bytes=float(o.bytes),
                shape=o.shape,
                group=coll.get(o.id, (None, None))[1],
                coll=coll.get(o.id, (None, None))[0],
                split=o.split,
                peer=o.peer,
                tags=dict(o.tags),
            )
        )
    try:
        g.validate()
    except GraphError as e:
        raise ConfigError(f"{source}: the trace does not form a valid task graph: {e}") from None
    return g, {o.id: (o.start, o.end) for o in ops}


def _lane(o: Op) -> tuple[int, str]:
    return (o.rank, o.lane or o.stream)


def _drop_late_deps(ops: list[Op], by_id: dict[str, Op]) -> None:
    """Known dependencies that ended after their dependent started (clock noise, or an
    importer's guess) are dropped: a replay must not wait for them."""
    for o in ops:
        o.deps = [
            d for d in o.deps if d in by_id and by_id[d].end <= o.start + ORDER_TOL_S and d != o.id
        ]


def _chain_lanes(ops: list[Op]) -> None:
    last: dict[tuple[int, str], Op] = {}
    for o in ops:  # in start order
        prev = last.get(_lane(o))
        if prev is not None and prev.stream != o.stream:
            o.deps.append(prev.id)
        last[_lane(o)] = o


def _match_collectives(ops: list[Op], source: str) -> dict[str, tuple[str, list[int]]]:
    """op id -> (collective id, group) for every communication op."""
    members: dict[Any, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind not in COMM_KINDS:
            continue
        if o.stream.split(".", 1)[0] != "comm":
            raise ConfigError(f"{source}: {o.kind} {o.id!r} is on stream {o.stream!r}, not comm")
        members[("local", o.id) if o.match is None else o.match].append(o)
    out: dict[str, tuple[str, list[int]]] = {}
    for n, (key, ms) in enumerate(members.items()):
        cid = f"c{n}"
        if ms[0].kind in P2P_KINDS:
            pair = _p2p_pair(ms)
            if pair is not None:
                for o in pair:
                    out[o.id] = (cid, sorted({pair[0].rank, pair[1].rank}))
                continue
            for o in ms:  # a send or recv whose peer is not in the trace: local
                _as_local(o)
                out[o.id] = (f"{cid}.{o.rank}", [o.rank])
            continue
        ranks = [o.rank for o in ms]
        if len(set(ranks)) != len(ranks):
            raise ConfigError(
                f"{source}: collective {key!r} is launched twice on one rank ({sorted(ranks)}); "
                "the trace's collectives could not be told apart"
            )
        group = sorted(ranks)
        expected = sorted({r for o in ms for r in (o.members or ())})
        if expected and group != expected:
            missing = sorted(set(expected) - set(group))
            step = ms[0].tags.get("step")  # the event's own name, where the format has one
            raise ConfigError(
                f"{source}: collective {ms[0].kind} {ms[0].id!r}"
                f"{f' ({step})' if step and step not in ms[0].id else ''} has no member on rank(s) "
                f"{missing}; expected one on each of ranks {expected} (a rank's file cut "
                "short or its collectives dropped?)"
            )
        _harmonise(ms, group)
        for o in ms:
            out[o.id] = (cid, group)
    return out


def _p2p_pair(ms: list[Op]) -> tuple[Op, Op] | None:
    sends = [o for o in ms if o.kind == "send"]
    recvs = [o for o in ms if o.kind == "recv"]
    if len(sends) != 1 or len(recvs) != 1:
        return None
    s, r = sends[0], recvs[0]
    if s.peer != r.rank or r.peer != s.rank or s.rank == r.rank:
        return None
    r.bytes = s.bytes = max(s.bytes, r.bytes)
    return s, r


def _as_local(o: Op) -> None:
    o.tags.setdefault("measured_kind", o.kind)
    o.kind, o.peer = "broadcast", None


def _harmonise(ms: list[Op], group: list[int]) -> None:
    """Members of one collective agree on kind and sizes, as the graph requires; what the
    trace recorded otherwise stays in the tags."""
    kinds = {o.kind for o in ms}
    if kinds <= {"all_to_all", "all_to_allv"} and len(kinds) == 2:
        kinds = {"all_to_allv"}
    kind = min(kinds) if len(kinds) == 1 else "all_reduce"
    for o in ms:
        if o.kind != kind:
            o.tags.setdefault("measured_kind", o.kind)
            o.kind = kind
        if kind == "all_to_allv" and (o.split is None or len(o.split) != len(group)):
            o.split = [o.bytes / len(group)] * len(group)
        if kind != "all_to_allv":
            o.split = None
    if kind in COLLECTIVE_KINDS and kind not in ("all_to_allv", "broadcast"):
        size = max(o.bytes for o in ms)
        for o in ms:
            if o.bytes != size:
                o.tags.setdefault("measured_bytes", o.bytes)
                o.bytes = size


def _infer_waits(ops: list[Op], by_id: dict[str, Op]) -> int:
    """Add, to every op that started late, the op of another lane that ended last before
    it; returns how many were added."""
    ends: dict[int, list[tuple[float, int]]] = defaultdict(list)  # rank -> (end, index)
    for i, o in enumerate(ops):
        ends[o.rank].append((o.end, i))
    for v in ends.values():
        v.sort()
    origin = min(o.start for o in ops)
    last_in_lane: dict[tuple[int, str], Op] = {}
    added = 0
    for o in ops:
        lane = _lane(o)
        prev = last_in_lane.get(lane)
        last_in_lane[lane] = o
        ready = max([origin, prev.end if prev else origin] + [by_id[d].end for d in o.deps])
        if o.start - ready <= WAIT_MIN_S:
            continue
        seq = ends[o.rank]
        k = bisect.bisect_right(seq, (o.start + ORDER_TOL_S, len(ops)))
        while k > 0:
            k -= 1
            end, j = seq[k]
            if end <= ready:
                break
            cand = ops[j]
            if _lane(cand) != lane and cand.id != o.id and _may_wait(o, cand):
                o.deps.append(cand.id)
                added += 1
                break
    return added


def _may_wait(o: Op, on: Op) -> bool:
    """Whether wait inference may make `o` wait for `on`: within a side, or a host op on
    device work where the trace has the synchronisation (not known: any)."""
    if o.syncs:
        return on.side == "device"
    return o.side is None or on.side is None or o.side == on.side
