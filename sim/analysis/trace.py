"""The trace: one row per executed task per rank, the schema both engines write.

Columns: id, rank, stream, kind, start, end, duration, sync_wait (s; time a collective member
waited for the others), bytes, flops, and the tags layer, phase, step, chunk. Times are seconds
from the start of the run. Written as CSV or Parquet, and exported to Chrome trace JSON
(chrome://tracing or ui.perfetto.dev): a process per rank, a thread per stream
(`sim.analysis.chrome`, re-exported here).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.analysis.chrome import chrome_trace, write_chrome_trace
from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
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
__all__ = [
    "COLUMNS",
    "TAGS",
    "chrome_trace",
    "to_frame",
    "write_chrome_trace",
    "write_table",
    "write_trace_files",
]


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


def write_trace_files(
    out: Path, df: pd.DataFrame, graph: TaskGraph | None = None, res: SimResult | None = None
) -> dict[str, str]:
    """trace.csv and trace.chrome.json in `out` (the Chrome trace with the graph's arrows and
    memory, and what `res` recorded: see `chrome_trace`); their paths by kind."""
    return {
        "trace": str(write_table(df, out / "trace.csv")),
        "chrome_trace": str(write_chrome_trace(df, out / "trace.chrome.json", None, graph, res)),
    }
