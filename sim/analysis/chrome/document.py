"""Chrome trace JSON from a trace table, read exactly by ui.perfetto.dev and chrome://tracing.

Times. Every start and end is rounded once to integer nanoseconds and a slice's duration is
the difference of those integers, so a task that starts when the previous one on its stream
ends is never seen to overlap it (converting `ts` and `dur` separately did: 1e-12 us of
overlap made Perfetto drop the slice as badly nested). The integers are written as
microseconds that Perfetto reads back exactly (`sim.analysis.trace.ns`). No
`displayTimeUnit`: some Perfetto versions take "ns" there as the unit of `ts`.

Layout. A process per rank, "rank 07 (node 0)": zero-padded because Perfetto's UI orders
processes of equal slice counts by name (it ignores `process_sort_index`, which
chrome://tracing honours and is written too), node from the topology when known. A thread
per stream, compute before communication before copies (`thread_sort_index`, and thread ids
in that order, which Perfetto sorts by); thread ids never equal a process id (Perfetto
would take the thread for the process's main thread and list it first). Tasks on one stream
run one after another in both engines, so a thread never holds two slices at once; should a
measured trace still overlap on a stream, the later task goes onto a sub-track
"<stream> (overlap k)" rather than be nested under a task it is not part of. (A task of zero
length at the instant the next one starts is shown by Perfetto inside that one: it orders
slices of one timestamp longest first.)

Flows and counters (dependency arrows, link utilisation, memory) are in
`sim.analysis.chrome.tracks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.analysis.chrome.tracks import Tracks, counter_events, flow_events
from sim.analysis.trace.columns import col_array, col_list, col_strings, take_rows
from sim.analysis.trace.ns import to_ns, us
from sim.core.arrays import distinct, distinct_rows
from sim.core.graph import TaskGraph
from sim.core.io import atomic_write_text
from sim.core.kinds import STREAM_KINDS
from sim.engine.result import SimResult

if TYPE_CHECKING:
    import pandas as pd

    from sim.analysis.trace.columns import TraceTable

__all__ = ["Tracks", "chrome_trace", "to_ns", "us", "write_chrome_trace"]


@dataclass
class Layout:
    """Where each row of the table goes: its process, thread and integer times."""

    pid: np.ndarray
    tid: np.ndarray
    start: np.ndarray  # ns
    end: np.ndarray  # ns
    threads: list[tuple[str, int]]  # (stream, lane) per thread slot, in display order
    tid_base: int  # tid of slot k is tid_base + k
    slot: np.ndarray  # per row: its thread slot


def _stream_key(stream: str) -> tuple:
    kind, _, suffix = stream.partition(".")
    order = STREAM_KINDS.index(kind) if kind in STREAM_KINDS else len(STREAM_KINDS)
    return (order, kind, int(suffix) if suffix.isdigit() else -1, suffix)


def _lanes(rank: np.ndarray, stream: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Per row the sub-track it needs on its (rank, stream): 0 unless it overlaps a task
    before it there (greedy interval colouring, run only on the streams that overlap)."""
    lane = np.zeros(len(rank), dtype=np.int64)
    if not len(rank):
        return lane
    names, code = np.unique(stream, return_inverse=True)
    key = rank * len(names) + code.reshape(-1)
    order = np.lexsort((end, start, key))
    k, s, e = key[order], start[order], end[order]
    reach = _cummax_per_key(k, e)  # latest end so far on the stream
    overlap = (k[1:] == k[:-1]) & (s[1:] < reach[:-1])
    for g in distinct(k[1:][overlap]):
        ends: list[int] = []  # last end on each lane
        for i in order[k == g]:
            j = next((j for j, last in enumerate(ends) if last <= start[i]), len(ends))
            if j == len(ends):
                ends.append(0)
            ends[j] = int(end[i])
            lane[i] = j
    return lane


def _cummax_per_key(key: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The running maximum of integers `x` within each run of equal `key` (sorted): one
    cumulative maximum over the runs lifted apart, where that fits in int64."""
    if not len(x):
        return x
    run = np.concatenate([[0], np.cumsum(key[1:] != key[:-1])])
    lo, span = int(x.min()), int(x.max()) - int(x.min()) + 1
    if int(run[-1]) * span < 2**62:
        lift = run * span - lo
        return np.maximum.accumulate(x + lift) - lift
    out = x.copy()
    for idx in np.split(np.arange(len(x)), np.flatnonzero(np.diff(run)) + 1):
        out[idx] = np.maximum.accumulate(x[idx])
    return out


def layout(df: pd.DataFrame | TraceTable) -> Layout:
    """Processes, threads and integer times for the rows of `df`."""
    rank = col_array(df, "rank", np.int64)
    stream = col_strings(df, "stream")
    start = to_ns(col_array(df, "start"))
    end = np.maximum(to_ns(col_array(df, "end")), start)
    lane = _lanes(rank, stream, start, end)
    threads = sorted(
        set(zip(stream.tolist(), lane.tolist())), key=lambda t: (_stream_key(t[0]), t[1])
    )
    index = {t: k for k, t in enumerate(threads)}
    slot = np.fromiter((index[t] for t in zip(stream.tolist(), lane.tolist())), np.int64, len(rank))
    tid_base = (int(rank.max()) + 2) if len(rank) else 1  # above every pid (network's too)
    return Layout(rank, tid_base + slot, start, end, threads, tid_base, slot)


def _metadata(lay: Layout, gpus_per_node: int | None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    if not len(lay.pid):
        return events
    width = len(str(int(lay.pid.max())))
    pairs = distinct_rows(np.stack([lay.pid, lay.slot], axis=1))
    for r in distinct(lay.pid).tolist():
        name = f"rank {r:0{width}d}"
        if gpus_per_node:
            name += f" (node {r // gpus_per_node})"
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": name}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}}
        )
    for r, k in pairs.tolist():
        stream, ln = lay.threads[k]
        name = stream if ln == 0 else f"{stream} (overlap {ln})"
        tid = lay.tid_base + k
        events.append(
            {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": r,
                "tid": tid,
                "args": {"sort_index": k},
            }
        )
    return events


def _slices(df: pd.DataFrame | TraceTable, lay: Layout) -> list[dict[str, Any]]:
    ts, dur = us(lay.start), us(lay.end - lay.start)
    pid, tid = lay.pid.tolist(), lay.tid.tolist()
    col = {k: col_list(df, k) for k in ("id", "kind", "bytes", "flops", "sync_wait", "step")}
    tags = {k: col_list(df, k) for k in ("layer", "phase", "chunk")}
    events = []
    for j in range(len(df)):
        kind, step = col["kind"][j], col["step"][j]  # step: NaN where a CSV left it empty
        args: dict[str, Any] = {"id": col["id"][j], "kind": kind, "bytes": col["bytes"][j]}
        args["flops"] = col["flops"][j]
        if col["sync_wait"][j] > 0:
            args["sync_wait_us"] = col["sync_wait"][j] * 1e6
        for k, values in tags.items():
            v = values[j]
            if v is not None and v == v:  # not None, not NaN (a tag missing from a CSV)
                args[k] = v
        events.append(
            {
                "ph": "X",
                "name": step if isinstance(step, str) and step else kind,
                "cat": kind,
                "pid": pid[j],
                "tid": tid[j],
                "ts": ts[j],
                "dur": dur[j],
                "args": args,
            }
        )
    return events


def chrome_trace(
    df: pd.DataFrame | TraceTable,
    max_ranks: int | None = None,
    graph: TaskGraph | None = None,
    res: SimResult | None = None,
) -> dict[str, Any]:
    """The trace as a Chrome trace document. With the task `graph`: flow arrows for
    dependencies across streams and ranks, and memory counters per rank; with the simulation
    result `res`: node names, and link utilisation per link class where it was recorded
    (`simulate(..., record_links=True)`)."""
    if max_ranks is not None:
        df = take_rows(df, col_array(df, "rank") < max_ranks)
    tracks = Tracks() if res is None else Tracks.of(res)
    lay = layout(df)
    events = _metadata(lay, tracks.gpus_per_node) + _slices(df, lay)
    flows = flow_events(df, lay, graph)
    events += flows.events
    events += counter_events(df, lay, graph, tracks)
    other = {"moesim": {"time": "us, exact to the ns", "flows": flows.written}}
    if flows.omitted:
        other["moesim"]["flows_omitted"] = flows.omitted
        other["moesim"]["flows_limit"] = flows.limit
    if flows.too_short:
        other["moesim"]["flows_on_slices_under_2ns"] = flows.too_short
    return {"traceEvents": events, "otherData": other}


def write_chrome_trace(
    df: pd.DataFrame | TraceTable,
    path: str | Path,
    max_ranks: int | None = None,
    graph: TaskGraph | None = None,
    res: SimResult | None = None,
) -> Path:
    """`chrome_trace`, written atomically to `path`."""
    atomic_write_text(path, json.dumps(chrome_trace(df, max_ranks, graph, res)))
    return Path(path)
