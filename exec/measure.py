"""A measured trace as calibration rows (sim.calibrate.COLUMNS: op, ranks, x, t, stream, others).

- x: work as the cost models see it: m*n*k (times batch) for GEMMs, bytes otherwise, and for
  communication the per-rank payload of sim.collectives.payload;
- t: the duration, less sync_wait for communication (the time before the last member
  launched is waiting, not transfer);
- others: '+'-joined stream kinds of this rank's tasks on *other* streams that overlap the
  task for more than `overlap` of its duration ('' = it ran alone).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.collectives import payload
from sim.graph import COMM_KINDS, TaskGraph, stream_kind


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
                }
            )
    return pd.DataFrame(rows, columns=["op", "ranks", "x", "t", "stream", "others", "rank", "id"])
