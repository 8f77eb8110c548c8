"""The trace table without pandas: what `moesim simulate` summarises and writes.

A run's trace (`sim.analysis.trace`: one row per executed task, COLUMNS) is held as the
columns pandas would be given, a `TraceTable`. The summary, trace.csv and the Chrome trace are
made from it directly, so a run imports no pandas (~0.4 s of CPU at start-up, more than a
small run's whole work); `TraceTable.to_frame()` is the DataFrame `sim.run` returns.

Whatever reads a trace takes either a DataFrame or a TraceTable through `col_list`, `col_array`,
`col_strings` and `take_rows`, and sees the same values from both: a tag column of integers with
gaps reads as floats with NaN, as pandas reads it, and `TraceTable.to_csv` writes the bytes
`DataFrame.to_csv(index=False)` writes (tests/test_trace_table.py checks both against pandas).
"""

from __future__ import annotations

import csv
import io
import os
from itertools import compress
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from sim.engine.result import SimResult

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
_FLOATS = ("start", "end", "duration", "sync_wait", "bytes", "flops")


class TraceTable:
    """A trace's columns, in COLUMNS order: as lists and numpy arrays, exactly what
    `to_frame` hands pandas."""

    def __init__(self, columns: dict[str, Any]):
        self.columns = columns

    @classmethod
    def of(cls, res: SimResult) -> TraceTable:
        tasks = list(res.graph)
        cols: dict[str, Any] = {
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
        for tag in TAGS:
            cols[tag] = [t.tags.get(tag) for t in tasks]
        return cls(cols)

    def __len__(self) -> int:
        return len(self.columns["id"])

    def to_frame(self) -> pd.DataFrame:
        """The DataFrame of the trace (the tags set as columns one by one, as ever)."""
        import pandas as pd

        df = pd.DataFrame({k: self.columns[k] for k in COLUMNS if k not in TAGS})
        for tag in TAGS:
            df[tag] = self.columns[tag]
        return df[COLUMNS]

    def values(self, name: str) -> list[Any]:
        """The column as `DataFrame[name].tolist()` gives it."""
        col = self.columns[name]
        if isinstance(col, np.ndarray):
            return col.tolist()
        if name in _FLOATS:
            return [float(v) for v in col]
        return _as_pandas_reads(col) if name in TAGS else list(col)

    def array(self, name: str, dtype: Any = None) -> np.ndarray:
        col = self.columns[name]
        if isinstance(col, np.ndarray):
            return col if dtype is None else col.astype(dtype, copy=False)
        if name in _FLOATS:
            return np.asarray(col, dtype=float if dtype is None else dtype)
        vals = self.values(name)
        return np.asarray(vals, dtype=dtype) if dtype is not None else _objects(vals)

    def take(self, mask: np.ndarray) -> TraceTable:
        """The rows where `mask` holds."""
        mask = np.asarray(mask, dtype=bool)
        return TraceTable(
            {
                k: c[mask] if isinstance(c, np.ndarray) else list(compress(c, mask.tolist()))
                for k, c in self.columns.items()
            }
        )

    def to_csv(self) -> str:
        """The text `self.to_frame().to_csv(index=False)` writes: floats as numpy prints
        them, missing values empty, fields quoted where the csv module must."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator=os.linesep)  # pandas' defaults
        w.writerow(COLUMNS)
        w.writerows(zip(*(self._csv_field(k) for k in COLUMNS)))
        return out.getvalue()

    def _csv_field(self, name: str) -> list[Any]:
        col = self.columns[name]
        if name in _FLOATS or (name in TAGS and _number_kind(col) == "float"):
            # float64: numpy's shortest repr, NaN empty (what pandas does)
            a = np.asarray(col if name in _FLOATS else self.values(name), dtype=float)
            text = a.astype(str).astype(object)
            text[np.isnan(a)] = ""
            return text.tolist()
        vals = self.values(name)
        return ["" if v is None or (isinstance(v, float) and v != v) else v for v in vals]


def _number_kind(vals: list[Any]) -> str | None:
    """ "float" where pandas makes a float64 column of the values (numbers, some of them
    floats or gaps), "int" for integers alone, None for anything else (strings, all-None)."""
    has_int = has_float = has_none = False
    for v in vals:
        if v is None:
            has_none = True
        elif isinstance(v, (bool, np.bool_)):
            return None
        elif isinstance(v, (int, np.integer)):
            has_int = True
        elif isinstance(v, (float, np.floating)):
            has_float = True
        else:
            return None
    if has_float or (has_int and has_none):
        return "float"
    return "int" if has_int else None


def _as_pandas_reads(vals: list[Any]) -> list[Any]:
    """A tag column's values as pandas reads them back: numbers with a gap (or integers mixed
    with floats) as floats, a gap NaN; integers as ints; anything else as it is."""
    kind = _number_kind(vals)
    if kind == "float":
        return [float("nan") if v is None else float(v) for v in vals]
    if kind == "int":
        return [int(v) for v in vals]
    return vals


def _objects(vals: list[Any]) -> np.ndarray:
    out = np.empty(len(vals), dtype=object)
    out[:] = vals
    return out


# -- what reads a trace: a DataFrame or a TraceTable alike -------------------------------------


def col_list(df: Any, name: str) -> list[Any]:
    """`df[name].tolist()`."""
    return df.values(name) if isinstance(df, TraceTable) else df[name].tolist()


def col_array(df: Any, name: str, dtype: Any = None) -> np.ndarray:
    """`df[name].to_numpy(dtype)`."""
    return df.array(name, dtype) if isinstance(df, TraceTable) else df[name].to_numpy(dtype)


def col_strings(df: Any, name: str) -> np.ndarray:
    """`df[name].astype(str).to_numpy()`: the column as an object array of str."""
    if isinstance(df, TraceTable):
        return _objects([str(v) for v in df.values(name)])
    return df[name].astype(str).to_numpy()


def take_rows(df: Any, mask: np.ndarray) -> Any:
    """The rows where `mask` holds, numbered from 0."""
    if isinstance(df, TraceTable):
        return df.take(mask)
    return df[mask].reset_index(drop=True)


def stream_kinds(df: Any) -> np.ndarray:
    """Each row's stream kind, its name before any "." (`comm.1` is `comm`)."""
    return np.array([str(s).split(".")[0] for s in col_list(df, "stream")], dtype=object)


def busy_sums(df: Any) -> dict[str, tuple[float, int]]:
    """Per stream, in sorted order: the sum of its rows' durations and its distinct ranks,
    as `df.groupby("stream").agg(total=("duration", "sum"), ranks=("rank", "nunique"))`
    gives them (compensated sums, bit for bit; missing values left out)."""
    sums: dict[Any, list[float]] = {}  # stream -> [sum, compensation]
    ranks: dict[Any, set[Any]] = {}
    streams, durations = col_list(df, "stream"), col_list(df, "duration")
    for s, d, r in zip(streams, durations, col_list(df, "rank")):
        if s is None or s != s:
            continue
        acc = sums.get(s)
        if acc is None:
            acc = sums[s] = [0.0, 0.0]
            ranks[s] = set()
        if r == r:
            ranks[s].add(r)
        if d != d:
            continue
        y = d - acc[1]  # Kahan, as pandas' group sums
        t = acc[0] + y
        c = t - acc[0] - y
        acc[1] = 0.0 if c != c else c
        acc[0] = t
    return {str(s): (sums[s][0], len(ranks[s])) for s in sorted(sums)}
