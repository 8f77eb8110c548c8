"""The trace: one row per executed task per rank, the schema both engines write.

Columns: id, rank, stream, kind, start, end, duration, sync_wait (s; time a collective member
waited for the others), bytes, flops, and the tags layer, phase, step, chunk. Times are seconds
from the start of the run. Written as CSV or Parquet, and exported to Chrome trace JSON
(chrome://tracing or ui.perfetto.dev): a process per rank, a thread per stream.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError
from sim.core.io import atomic_write_bytes, atomic_write_text
from sim.engine.engine import SimResult

COLUMNS = [
    "id",
    "rank",
    "stream",
    "kind",
    "start",
    "end",
    "duration",
    "sync_wait",
    "bytes",
    "flops",
    "layer",
    "phase",
    "step",
    "chunk",
]
TAGS = ("layer", "phase", "step", "chunk")


def to_frame(res: SimResult) -> pd.DataFrame:
    tasks = list(res.graph)
    df = pd.DataFrame(
        {
            "id": [t.id for t in tasks],
            "rank": np.fromiter((t.rank for t in tasks), dtype=np.int64, count=len(tasks)),
            "stream": [t.stream for t in tasks],
            "kind": [t.kind for t in tasks],
            "start": res.start,
            "end": res.end,
            "duration": res.end - res.start,
            "sync_wait": res.sync_wait,
            "bytes": [float(t.bytes) for t in tasks],
            "flops": [float(t.flops) for t in tasks],
        }
    )
    for tag in TAGS:
        df[tag] = [t.tags.get(tag) for t in tasks]
    return df[COLUMNS]


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import io

            buf = io.BytesIO()
            df.to_parquet(buf, index=False)
        except ImportError as e:
            raise ConfigError(f"{path}: Parquet output needs pyarrow ({e}); use .csv") from None
        atomic_write_bytes(path, buf.getvalue())
    else:
        atomic_write_text(path, df.to_csv(index=False))
    return path


def chrome_trace(df: pd.DataFrame, max_ranks: int | None = None) -> dict:
    if max_ranks is not None:
        df = df[df["rank"] < max_ranks]
    events = []
    streams = sorted(df["stream"].unique())
    tid = {s: i for i, s in enumerate(streams)}
    for rank in sorted(df["rank"].unique()):
        events.append(
            {"ph": "M", "name": "process_name", "pid": int(rank), "args": {"name": f"rank {rank}"}}
        )
        for s in streams:
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": int(rank),
                    "tid": tid[s],
                    "args": {"name": s},
                }
            )
    for row in df.itertuples(index=False):
        args = {"kind": row.kind, "bytes": row.bytes, "flops": row.flops}
        if row.sync_wait > 0:
            args["sync_wait_us"] = row.sync_wait * 1e6
        events.append(
            {
                "ph": "X",
                "name": row.step or row.kind,
                "cat": row.kind,
                "pid": int(row.rank),
                "tid": tid[row.stream],
                "ts": row.start * 1e6,
                "dur": row.duration * 1e6,
                "args": args
                | {
                    k: getattr(row, k)
                    for k in ("phase", "chunk")
                    if getattr(row, k) is not None and getattr(row, k) == getattr(row, k)
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(df: pd.DataFrame, path: str | Path, max_ranks: int | None = None) -> Path:
    atomic_write_text(path, json.dumps(chrome_trace(df, max_ranks)))
    return Path(path)
