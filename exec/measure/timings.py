"""A measured trace as calibration rows (`sim.hardware.costs.calibration.COLUMNS`: op,
ranks, x, t, stream, others).

- x: work as the cost models see it: m*n*k (times batch) for GEMMs, bytes otherwise, and for
  communication the per-rank payload of sim.hardware.collectives.payload;
- t: the duration, less sync_wait for communication (the time before the last member
  launched is waiting, not transfer);
- others: '+'-joined stream kinds of this rank's tasks on *other* streams that overlap the
  task for more than `overlap` of its duration ('' = it ran alone);
- shape: 'batch,m,n,k' of a GEMM ('' otherwise), for the exact-shape table;
- dtype: the task's dtype tag (microbenchmarks tag what really ran: exec.runtime.ops.run_dtype);
- layout: a GEMM's operand layout (sim.hardware.costs.gemm.LAYOUTS; '' otherwise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.core.graph import TaskGraph
from sim.core.kinds import COMM_KINDS, stream_kind
from sim.hardware.collectives import payload
from sim.hardware.costs.compute import shape_key
from sim.hardware.costs.gemm import gemm_layout


def measurements(graph: TaskGraph, trace: pd.DataFrame, overlap: float = 0.1) -> pd.DataFrame:
    rows = []
    for rank, g in trace.groupby("rank"):
        starts, ends = g["start"].to_numpy(), g["end"].to_numpy()
        streams = g["stream"].to_numpy()
        for i, r in enumerate(g.itertuples(index=False)):
            t = graph.tasks[r.id]
            dur = float(r.duration)
            shared = np.minimum(ends, r.end) - np.maximum(starts, r.start)
            busy = (shared > overlap * max(dur, 1e-12)) & (streams != r.stream)
            busy[i] = False
            others = "+".join(sorted({stream_kind(s) for s in streams[busy]}))
            shape = layout = ""
            if t.kind == "gemm" and t.shape:
                shape = ",".join(str(v) for v in shape_key(t.shape))
                layout = gemm_layout(t.shape)
            if t.kind in COMM_KINDS:
                ranks = len(t.group) if t.group else 2
                x, time_s = payload(t), max(dur - float(r.sync_wait), 0.0)
            else:
                ranks, x, time_s = 1, t.work(), dur
            rows.append(
                {
                    "op": t.kind,
                    "ranks": ranks,
                    "x": float(x),
                    "t": time_s,
                    "stream": stream_kind(r.stream),
                    "others": others,
                    "rank": int(rank),
                    "id": r.id,
                    "shape": shape,
                    "dtype": str(t.tags.get("dtype", "")),
                    "layout": layout,
                }
            )
    columns = ["op", "ranks", "x", "t", "stream", "others", "rank", "id", "shape", "dtype"]
    columns.append("layout")
    return pd.DataFrame(rows, columns=columns)


def dispatch_gaps(graph: TaskGraph, trace: pd.DataFrame) -> pd.DataFrame:
    """How long each task waited between becoming ready and starting (sim.hardware.costs.dispatch).

    Ready = the later of its stream predecessor's end and its dependencies' ends; `via` says
    which one came last: 'stream' (the predecessor) or 'cross' (a task of another stream).
    Tasks with neither (the first on a stream, without dependencies) have no gap.
    """
    start = dict(zip(trace["id"], trace["start"]))
    end = dict(zip(trace["id"], trace["end"]))
    rows = []
    for (rank, _stream), tasks in graph.streams().items():
        prev_end = None
        for t in tasks:
            if t.id not in start:
                continue
            dep_end = max((end[d] for d in t.deps if d in end), default=None)
            if dep_end is not None and (prev_end is None or dep_end > prev_end):
                via, ready = "cross", dep_end
            elif prev_end is not None:
                via, ready = "stream", prev_end
            else:
                via, ready = None, None
            if via is not None:
                rows.append(
                    {"via": via, "gap": max(start[t.id] - ready, 0.0), "rank": rank, "id": t.id}
                )
            prev_end = end[t.id]
    return pd.DataFrame(rows, columns=["via", "gap", "rank", "id"])


def issue_rows(graph: TaskGraph, issued: dict[str, float]) -> pd.DataFrame:
    """Host seconds per issued task (`RankResult.extra["issue_s"]` of a GPU run: the
    executor's one launching thread), as rows of op (the task's kind) and issue."""
    rows = [{"op": graph.tasks[tid].kind, "issue": s} for tid, s in issued.items()]
    return pd.DataFrame(rows, columns=["op", "issue"])
