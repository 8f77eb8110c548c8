"""What a Chrome trace shows besides the tasks: dependency arrows and counter tracks.

Flows. An arrow for every dependency between two tasks on different (rank, stream): the
graph's `deps` across streams, a send to its recv, and, for a collective whose members
launched at different times, the last member to launch to each member that waited for it.
They are v1 flow events (`ph` "s" then "f" with `bp: "e"`, matched by `id` and `cat`), which
chrome://tracing and Perfetto both read, each placed strictly inside its slice (1 ns in from
the edge) so that both tools bind it to that slice and to no neighbour; a slice shorter than
2 ns cannot hold one and gets no arrow. Arrows are capped at MAX_FLOWS per trace (a viewer
slows down past that): cross-rank ones first, then the earliest; the trace's
`otherData.moesim` says how many were left out.

Counters. Memory in use per rank (MiB), from the graph's buffer allocations (at a task's
start) and frees (at its end), as the engine accounts them. Link utilisation per link class
(%), in a "network" process: "<class> all links" (bytes/s over capacity, all links of the
class together) and "<class> busiest link", exactly as the engine's rates changed
(`FlowNetwork.record`, taken when a trace is asked for; a run with the collective network
model has no flows and no such counters). One counter per series: chrome://tracing draws the
series of one counter stacked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.analysis.trace.columns import col_list, col_strings
from sim.analysis.trace.ns import to_ns, us
from sim.core.graph import TaskGraph
from sim.core.kinds import COLLECTIVE_KINDS
from sim.engine.result import SimResult

if TYPE_CHECKING:
    import pandas as pd

    from sim.analysis.chrome.document import Layout
    from sim.analysis.trace.columns import TraceTable

MAX_FLOWS = 20_000
MIB = float(2**20)


@dataclass
class Tracks:
    """What the engine knows beyond the trace table."""

    gpus_per_node: int | None = None
    links: dict[str, Any] | None = None  # sim.hardware.network.timeline.ClassTimeline.as_dict

    @classmethod
    def of(cls, res: SimResult) -> Tracks:
        return cls(res.topology.gpus_per_node, res.link_timeline)


@dataclass
class Flows:
    """The Chrome trace's flow arrows, as many as its limit allows."""

    events: list[dict[str, Any]] = field(default_factory=list)
    written: int = 0
    omitted: int = 0  # past the limit
    limit: int = MAX_FLOWS
    too_short: int = 0  # an end on a slice under 2 ns long


def _candidates(df: pd.DataFrame | TraceTable, lay: Layout, graph: TaskGraph) -> list[tuple]:
    """(cross-rank?, source ts, dest ts, source row, dest row, category) per arrow."""
    row = {tid: j for j, tid in enumerate(col_list(df, "id"))}
    rank, stream = lay.pid, col_strings(df, "stream").tolist()
    start, end = lay.start, lay.end
    out = []
    coll: dict[str, list[int]] = defaultdict(list)
    p2p: dict[str, dict[str, int]] = defaultdict(dict)
    for t in graph:
        j = row.get(t.id)
        if j is None:
            continue
        for d in t.deps:
            i = row.get(d)
            if i is not None and (rank[i] != rank[j] or stream[i] != stream[j]):
                out.append((rank[i] != rank[j], end[i] - 1, start[j] + 1, i, j, "dependency"))
        if t.coll is not None and t.kind in ("send", "recv"):
            p2p[t.coll][t.kind] = j
        elif t.coll is not None and t.kind in COLLECTIVE_KINDS:
            coll[t.coll].append(j)
    for pair in p2p.values():  # the data leaves with the send and has arrived at the recv's end
        if "send" in pair and "recv" in pair:
            i, j = pair["send"], pair["recv"]
            out.append((rank[i] != rank[j], start[i] + 1, end[j] - 1, i, j, "send/recv"))
    for members in coll.values():  # who the early members waited for
        last = max(members, key=lambda m: start[m])
        for m in members:
            if start[m] < start[last]:
                t0 = start[last] + 1
                out.append((rank[m] != rank[last], t0, t0 + 1, last, m, "waited for"))
    return out


def flow_events(
    df: pd.DataFrame | TraceTable, lay: Layout, graph: TaskGraph | None, limit: int = MAX_FLOWS
) -> Flows:
    """Arrows for the dependencies of `graph` between the rows of `df` (module docstring)."""
    if graph is None or not len(df):
        return Flows(limit=limit)
    start, end = lay.start, lay.end
    every = _candidates(df, lay, graph)
    ok = [
        c
        for c in every
        if start[c[3]] < c[1] < end[c[3]] and start[c[4]] < c[2] < end[c[4]] and c[1] < c[2]
    ]
    ok.sort(key=lambda c: (not c[0], c[1], c[2]))
    kept = ok[:limit]
    kept.sort(key=lambda c: (c[1], c[2]))
    ts = us(np.array([[c[1], c[2]] for c in kept], dtype=np.int64).reshape(-1, 2))
    pid, tid = lay.pid.tolist(), lay.tid.tolist()
    events = []
    for n, (c, (t_s, t_f)) in enumerate(zip(kept, ts)):
        i, j, cat = c[3], c[4], c[5]
        base = {"name": cat, "cat": cat, "id": n}
        events.append(base | {"ph": "s", "pid": pid[i], "tid": tid[i], "ts": t_s})
        events.append(base | {"ph": "f", "bp": "e", "pid": pid[j], "tid": tid[j], "ts": t_f})
    return Flows(events, len(kept), len(ok) - len(kept), limit, len(every) - len(ok))


def memory_series(
    df: pd.DataFrame | TraceTable, lay: Layout, graph: TaskGraph
) -> dict[int, list[tuple[int, float]]]:
    """Per rank, (ns, bytes in use) from its first task on, at every change."""
    row = {tid: j for j, tid in enumerate(col_list(df, "id"))}
    start, end, rank = lay.start.tolist(), lay.end.tolist(), lay.pid.tolist()
    # (ns, order at that instant, row, buffer, bytes or None for a free)
    changes: list[tuple[int, int, int, str, float | None]] = []
    for t in graph:
        j = row.get(t.id)
        if j is None or not (t.allocs or t.frees):
            continue
        for name, nbytes in t.allocs.items():
            changes.append((start[j], 1, j, name, float(nbytes)))
        # frees at an instant go before allocations there, except a zero-length task's own
        for name in t.frees:
            changes.append((end[j], 0 if end[j] > start[j] else 2, j, name, None))
    if not changes:
        return {}
    changes.sort(key=lambda c: c[:3])
    ranks, where = np.unique(lay.pid, return_inverse=True)
    lowest = np.full(len(ranks), np.iinfo(np.int64).max)
    np.minimum.at(lowest, where.reshape(-1), lay.start)
    first = dict(zip(ranks.tolist(), lowest.tolist()))  # each rank's first start
    live: dict[tuple[int, str], float] = {}
    used: dict[int, float] = defaultdict(float)
    series: dict[int, list[tuple[int, float]]] = {}
    for ns, _, j, name, size in changes:
        r = rank[j]
        if size is not None:
            used[r] += size - live.get((r, name), 0.0)
            live[(r, name)] = size
        elif (r, name) in live:
            used[r] -= live.pop((r, name))
        else:
            continue  # freed but never allocated in the rows shown
        pts = series.setdefault(r, [(min(int(first[r]), ns), 0.0)])
        if pts[-1][0] == ns:
            pts[-1] = (ns, used[r])
        else:
            pts.append((ns, used[r]))
    return series


def counter_events(
    df: pd.DataFrame | TraceTable, lay: Layout, graph: TaskGraph | None, tracks: Tracks
) -> list[dict[str, Any]]:
    """Memory per rank (with the graph) and link utilisation per class (with `tracks`)."""
    events: list[dict[str, Any]] = []
    if graph is not None and len(df):
        for r, pts in sorted(memory_series(df, lay, graph).items()):
            ts = us(np.array([p[0] for p in pts], dtype=np.int64))
            for t, (_, v) in zip(ts, pts):
                events.append(
                    {"ph": "C", "name": "memory", "pid": r, "ts": t, "args": {"MiB": v / MIB}}
                )
    links = tracks.links
    if links is None or not len(links["t"]):
        return events
    net = int(lay.pid.max()) + 1 if len(lay.pid) else 0
    events.append({"ph": "M", "name": "process_name", "pid": net, "args": {"name": "network"}})
    events.append(
        {"ph": "M", "name": "process_sort_index", "pid": net, "args": {"sort_index": net}}
    )
    ts = us(to_ns(links["t"]))
    mean = np.round(np.asarray(links["mean"]) * 100.0, 6)
    top = np.round(np.asarray(links["max"]) * 100.0, 6)
    for c, name in enumerate(links["classes"]):
        for series, values in (("all links", mean[:, c]), ("busiest link", top[:, c])):
            samples: list[tuple[float, float]] = []
            for t, v in zip(ts, values.tolist()):
                if samples and samples[-1][0] == t:  # closer than 1 ns: the last one holds
                    samples[-1] = (t, v)
                elif not samples or samples[-1][1] != v:
                    samples.append((t, v))
            # one counter per series: chrome://tracing would stack two series of one counter
            for t, v in samples:
                events.append(
                    {"ph": "C", "name": f"{name} {series}", "pid": net, "ts": t, "args": {"%": v}}
                )
    return events
