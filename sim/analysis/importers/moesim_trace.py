"""moesim's own traces (the executor's or the simulator's): CSV or Parquet in the schema of
sim.analysis.trace, with the task graph that produced them if there is one.

With the graph, the structure is the graph's (dependencies, groups, collective ids, sizes)
and the trace gives every task's times. Without it, the structure is inferred
(sim.analysis.importers.timeline): stream order from start times, cross-stream waits from
gaps, and collectives matched across ranks by their task id less its `r{rank}/` prefix (the
builders' ids) or, failing that, by kind and order on the stream. All-to-allv splits and
send/recv peers are not in the trace: without the graph an all-to-allv is even and a
send/recv pair is replayed as two rank-local operations.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from sim.analysis.importers.timeline import MAX_SPAN_S, Op, to_graph
from sim.analysis.trace import COLUMNS, TAGS
from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.core.kinds import COMM_KINDS

REQUIRED = ("id", "rank", "stream", "kind", "start", "end")
_RANK_PREFIX = re.compile(r"^r\d+/")


def read_table(path: str | Path) -> pd.DataFrame:
    """A trace table, checked for the columns a replay needs."""
    p = Path(path)
    what = f"trace {p}"
    if not p.is_file():
        raise ConfigError(f"{what}: not found")
    if p.suffix != ".parquet":
        with p.open("rb") as f:  # a CSV cut mid-row still parses: its last line tells
            f.seek(max(p.stat().st_size - 1, 0))
            last = f.read(1)
        if last not in (b"", b"\n"):
            raise ConfigError(
                f"{what}: the last line is incomplete (truncated?); expected a moesim trace CSV"
            )
    try:
        df = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
    except ImportError as e:
        raise ConfigError(f"{what}: reading Parquet needs pyarrow ({e})") from None
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{what}: empty file; expected a moesim trace CSV") from None
    except Exception as e:  # noqa: BLE001 - pandas raises many kinds; report one line
        raise ConfigError(f"{what}: not a readable trace table ({_one_line(e)})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError(
            f"{what}: missing column(s) {missing}; expected the moesim trace schema "
            f"({', '.join(COLUMNS)})"
        )
    if df.empty:
        raise ConfigError(f"{what}: has no rows")
    try:
        for c in ("start", "end", "rank"):
            df[c] = df[c].astype(float)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what}: start, end and rank must be numbers ({_one_line(e)})") from None
    _plausible(df, what, p.suffix != ".parquet")
    df["rank"] = df["rank"].astype(int)
    if df["id"].duplicated().any():
        dup = df.loc[df["id"].duplicated(), "id"].iloc[0]
        raise ConfigError(f"{what}: task id {dup!r} appears twice")
    return df


def _plausible(df: pd.DataFrame, what: str, csv: bool) -> None:
    """Ranks non-negative integers (1.5 must not become rank 1), times finite and within
    MAX_SPAN_S of each other (one row at 1e308 s must not become the measured makespan)."""
    rank, start, end = df["rank"], df["start"], df["end"]
    bad = ~(rank.map(lambda r: r == r and float(r).is_integer()) & (rank >= 0))
    times_bad = ~(np.isfinite(start) & np.isfinite(end))
    span = max(end[~times_bad].max() - start[~times_bad].min(), 0.0) if (~times_bad).any() else 0
    for mask, expected in (
        (bad, "rank: a non-negative integer"),
        (times_bad, "start and end: finite numbers (seconds)"),
        (end < start, "end >= start"),
    ):
        if mask.any():
            i = int(np.argmax(mask.to_numpy()))
            row = f"line {i + 2}" if csv else f"row {i + 1}"  # CSV: line 1 is the header
            raise ConfigError(f"{what}: {row} (task {df['id'].iloc[i]!r}): expected {expected}")
    if span > MAX_SPAN_S:
        i = int(np.argmax((end - start.min()).to_numpy()))
        raise ConfigError(
            f"{what}: task {df['id'].iloc[i]!r} ends {end.iloc[i]:g} s, more than "
            f"{MAX_SPAN_S:g} s after the first start; expected the times of one measurement"
        )


def times_of(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    return {str(i): (float(s), float(e)) for i, s, e in zip(df["id"], df["start"], df["end"])}


def with_graph(
    path: str | Path, graph_path: str | Path
) -> tuple[TaskGraph, dict[str, tuple[float, float]]]:
    df = read_table(path)
    graph = TaskGraph.from_json(graph_path)
    times = times_of(df)
    missing = [t for t in graph.tasks if t not in times]
    if missing:
        raise ConfigError(
            f"trace {path}: {len(missing)} task(s) of graph {graph_path} are not in it "
            f"(first {missing[0]!r}); give the graph the trace was recorded from"
        )
    extra = sorted(set(times) - set(graph.tasks))
    if extra:
        raise ConfigError(
            f"trace {path}: task {extra[0]!r} is not in graph {graph_path} "
            f"({len(extra)} such); give the graph the trace was recorded from"
        )
    graph.meta = {**graph.meta, "replay_of": str(path)}
    return graph, times


def infer(path: str | Path) -> tuple[TaskGraph, dict[str, tuple[float, float]]]:
    """The graph inferred from the trace alone."""
    df = read_table(path)
    match = _match_keys(df)
    ranks = sorted({int(r) for r in df["rank"]})  # every collective has a member on each
    ops = []
    for row, key in zip(df.itertuples(index=False), match):
        tags = {t: _plain(getattr(row, t)) for t in TAGS if hasattr(row, t)}
        tags = {k: v for k, v in tags.items() if v is not None}
        kind = str(row.kind)
        ops.append(
            Op(
                str(row.id),
                int(row.rank),
                str(row.stream),
                kind,
                float(row.start),
                float(row.end),
                bytes=_num(getattr(row, "bytes", 0.0)),
                flops=_num(getattr(row, "flops", 0.0)),
                match=key,
                members=ranks if key is not None else None,
                tags=tags,
            )
        )
    world = int(df["rank"].max()) + 1
    return to_graph(ops, world, f"trace {path}", {"replay_of": str(path), "inferred": True})


def _match_keys(df: pd.DataFrame) -> list:
    """Per row: the key its collective's members share (None for compute).

    The builders name a task `r{rank}/...` with the same rest on every member; when every
    communication id has that form and each key is unique per rank, the rest is the key.
    Otherwise the n-th communication of a kind on a stream matches the n-th elsewhere."""
    comm = df["kind"].isin(COMM_KINDS)
    ids = df["id"].astype(str)
    rest = ids.str.replace(_RANK_PREFIX, "", regex=True)
    by_id = comm & ids.str.match(_RANK_PREFIX)
    if by_id.sum() == comm.sum() and not (
        pd.DataFrame({"r": df["rank"], "k": rest})[comm].duplicated().any()
    ):
        return [("id", k, r) if c else None for c, k, r in zip(comm, df["kind"], rest)]
    order = df.sort_values(["rank", "stream", "start"], kind="stable")
    count: dict[tuple, int] = defaultdict(int)
    keys: dict[int, tuple] = {}
    for idx, row in zip(order.index, order.itertuples(index=False)):
        if row.kind in COMM_KINDS:
            k = (row.rank, row.stream, row.kind)
            keys[idx] = ("order", row.stream, row.kind, count[k])
            count[k] += 1
    return [keys.get(i) for i in df.index]


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if f == f else 0.0


def _plain(v):
    """A tag value as plain Python (NaN from an empty CSV cell is no value)."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
