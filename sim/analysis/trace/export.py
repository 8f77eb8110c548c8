"""A run's trace made (a TraceTable without pandas, or a DataFrame) and written: CSV or
Parquet, and with its Chrome trace (`sim.analysis.chrome`) in an output set."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sim.analysis.trace.columns import TraceTable
from sim.core.errors import ConfigError
from sim.core.io import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    import pandas as pd

    from sim.core.graph import TaskGraph
    from sim.core.io import OutputSet
    from sim.engine.result import SimResult


def table(res: SimResult) -> TraceTable:
    """The trace of a run without pandas (what a run summarises and writes)."""
    return TraceTable.of(res)


def to_frame(res: SimResult) -> pd.DataFrame:
    return TraceTable.of(res).to_frame()


def write_table(df: pd.DataFrame | TraceTable, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        frame = df.to_frame() if isinstance(df, TraceTable) else df
        try:
            import io

            buf = io.BytesIO()
            frame.to_parquet(buf, index=False)
        except ImportError as e:
            raise ConfigError(f"{path}: Parquet output needs pyarrow ({e}); use .csv") from None
        atomic_write_bytes(path, buf.getvalue())
    elif isinstance(df, TraceTable):
        atomic_write_text(path, df.to_csv())
    else:
        atomic_write_text(path, df.to_csv(index=False))
    return path


def write_trace_files(
    out: OutputSet,
    df: pd.DataFrame,
    graph: TaskGraph | None = None,
    res: SimResult | None = None,
    prefix: str = "",
) -> dict[str, str]:
    """trace.csv and trace.chrome.json as files `prefix`trace.* of the output set `out`
    (the Chrome trace with the graph's arrows and memory, and what `res` recorded: see
    `chrome_trace`); their final paths by kind."""
    from sim.analysis.chrome import write_chrome_trace  # the Chrome trace reads the columns

    write_table(df, out.path(f"{prefix}trace.csv"))
    write_chrome_trace(df, out.path(f"{prefix}trace.chrome.json"), None, graph, res)
    return {
        "trace": str(out.final(f"{prefix}trace.csv")),
        "chrome_trace": str(out.final(f"{prefix}trace.chrome.json")),
    }
