"""The trace: one row per executed task per rank, the schema both engines write.

Columns: id, rank, stream, kind, start, end, duration, sync_wait (s; time a collective member
waited for the others), bytes, flops, and the tags layer, phase, step, chunk. Times are seconds
from the start of the run. Written as CSV or Parquet, and exported to Chrome trace JSON
(chrome://tracing or ui.perfetto.dev): a process per rank, a thread per stream
(`sim.analysis.chrome`).

The package: the columns and the table that holds them without pandas (`columns`), the trace
of a result and its files (`export`), times as integer nanoseconds (`ns`).
"""

from sim.analysis.trace.columns import COLUMNS, TAGS, TraceTable
from sim.analysis.trace.export import table, to_frame, write_table, write_trace_files

__all__ = [
    "COLUMNS",
    "TAGS",
    "TraceTable",
    "table",
    "to_frame",
    "write_table",
    "write_trace_files",
]
