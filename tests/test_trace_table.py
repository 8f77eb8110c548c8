"""A run's trace without pandas (`sim.analysis.trace.columns.TraceTable`) reads and writes
exactly as the DataFrame it stands for: the same trace.csv bytes, the same Chrome trace, the same
summary (busy time summed as pandas sums it, bit for bit), on real runs and on tables with
awkward tags; and the numpy rewrites of the Chrome trace's pandas steps (sub-track lanes, each
rank's first start) agree with the pandas code they replace."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pandas as pd
import pytest

import sim.commands as commands
from benchmarks.startup import TINY
from sim.analysis.chrome.document import _cummax_per_key, _lanes, chrome_trace
from sim.analysis.summary import busy_per_stream, exposed, exposed_per_rank
from sim.analysis.trace.columns import COLUMNS, TraceTable, col_list

SMALL = {"batch": 2, "seq_len": 256, "model_dim": 512, "hidden_dim": 1024, "experts_per_gpu": 2}
CONFIGS = {
    "tiny": TINY,
    "demo": commands.demo_config(),
    "two_streams_zipf": {
        "topology": "dgx-a100",
        "nodes": 2,
        "model": {**SMALL, "top_k": 2, "routing": {"kind": "zipf", "s": 1.2, "seed": 3}},
        "strategy": {"name": "pipelined", "degree": 4, "order": "two_streams"},
        "passes": ["fwd", "bwd"],
    },
    "mpipemoe": {
        "topology": "dgx-a100",
        "nodes": 1,
        "model": {**SMALL, "top_k": 2},
        "strategy": {"name": "mpipemoe", "degree": 2, "reuse": "S1"},
        "passes": ["fwd", "bwd"],
    },
}


def _same(a: list, b: list) -> bool:
    """Equal lists, NaN equal to NaN, and None equal to NaN (a str column's gap reads as NaN
    in pandas 3, None before)."""

    def gap(x):
        return x is None or (isinstance(x, float) and math.isnan(x))

    return len(a) == len(b) and all(
        (gap(x) and gap(y)) or (x == y and type(x) is type(y)) for x, y in zip(a, b)
    )


def _busy_pandas(df: pd.DataFrame) -> dict[str, float]:  # the code busy_per_stream replaced
    per = df.groupby("stream").agg(total=("duration", "sum"), ranks=("rank", "nunique"))
    return {str(k): float(r.total) / r.ranks for k, r in per.iterrows()}


def _exposed_pandas(df: pd.DataFrame) -> list[float]:  # the code exposed_per_rank replaced
    kind = df["stream"].str.split(".").str[0].to_numpy()
    rank = df["rank"].to_numpy()
    iv = df[["start", "end"]].to_numpy()
    order = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.diff(rank[order])) + 1
    out = []
    for idx in np.split(order, bounds) if len(order) else []:
        k = kind[idx]
        out.append(exposed(iv[idx[k == "comm"]], iv[idx[k == "compute"]]))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_table_reads_and_writes_as_its_frame(name):
    r = commands._simulate_table(CONFIGS[name], record_links=True)
    table = r.trace
    assert isinstance(table, TraceTable)
    df = table.to_frame()
    assert list(df.columns) == COLUMNS
    for col in COLUMNS:
        assert _same(col_list(table, col), df[col].tolist()), col
    assert table.to_csv() == df.to_csv(index=False)
    assert busy_per_stream(table) == _busy_pandas(df) == busy_per_stream(df)
    assert exposed_per_rank(table) == _exposed_pandas(df) == exposed_per_rank(df)
    for ranks in (None, 1):
        want = json.dumps(chrome_trace(df, ranks, r.graph, r.sim))
        assert json.dumps(chrome_trace(table, ranks, r.graph, r.sim)) == want


def test_run_still_returns_a_dataframe():
    r = commands.simulate_config(TINY)
    assert isinstance(r.trace, pd.DataFrame) and list(r.trace.columns) == COLUMNS


def test_awkward_tags_read_and_write_as_pandas():
    n = 6
    base = {
        "id": ["a", "b,c", 'q"uote', "new\nline", " sp", ""],
        "rank": np.array([0, 1, 0, 1, 2, 2], dtype=np.int64),
        "stream": ["compute", "comm", "comm.1", "compute", "copy", "comm"],
        "kind": ["gemm"] * n,
        "start": np.array([0.0, 1e-5, 2.5e-7, 1e16, 3.0, 0.1]),
        "end": np.array([1.0, 2e-5, 3e-7, 2e16, 4.0, 0.3]),
        "duration": np.array([1.0, 1e-5, 5e-8, 1e16, 1.0, 0.2]),
        "sync_wait": np.zeros(n),
        "bytes": [0.0, 1.5, 2.0, 1e20, 3.0, 4.0],
        "flops": [1.0] * n,
    }
    tags = [
        [None] * n,
        [0, None, 2, 3, None, 5],
        [1, 2.5, 3, 4, 5, 6],
        [1, 2, 3, 4, 5, 6],
        ["fwd", None, "a,b", 'x"y', "", "bwd"],
        [True, None, False, True, True, False],
        [True, False, True, True, False, False],
        [np.int64(3), None, np.int64(4), 1, 2, 3],
        [1.5, None, None, None, None, 2.0],
    ]
    for i, tag in enumerate(tags):
        for layer, phase, step, chunk in [(tag, "x", "y", None), (0, tag, None, tag)]:
            cols = dict(base)
            for k, v in (("layer", layer), ("phase", phase), ("step", step), ("chunk", chunk)):
                cols[k] = v if isinstance(v, list) else [v] * n
            table = TraceTable(cols)
            df = table.to_frame()
            assert table.to_csv() == df.to_csv(index=False), i
            for col in COLUMNS:
                assert _same(col_list(table, col), df[col].tolist()), (i, col)


def _lanes_pandas(rank, stream, start, end):  # the code _lanes replaced
    lane = np.zeros(len(rank), dtype=np.int64)
    if not len(rank):
        return lane
    code, names = pd.factorize(stream)
    key = rank * len(names) + code
    order = np.lexsort((end, start, key))
    k, s, e = key[order], start[order], end[order]
    reach = pd.Series(e).groupby(k).cummax().to_numpy()
    overlap = (k[1:] == k[:-1]) & (s[1:] < reach[:-1])
    for g in np.unique(k[1:][overlap]):
        ends: list[int] = []
        for i in order[k == g]:
            j = next((j for j, last in enumerate(ends) if last <= start[i]), len(ends))
            if j == len(ends):
                ends.append(0)
            ends[j] = int(end[i])
            lane[i] = j
    return lane


def test_lanes_and_running_maxima_equal_pandas():
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(0, 60)
        rank = np.array([rng.randrange(4) for _ in range(n)], dtype=np.int64)
        stream = np.array([rng.choice(["compute", "comm", "comm.1"]) for _ in range(n)], object)
        start = np.array([rng.randrange(0, 50) for _ in range(n)], dtype=np.int64)
        end = start + np.array([rng.randrange(0, 20) for _ in range(n)], dtype=np.int64)
        assert (
            _lanes(rank, stream, start, end).tolist()
            == _lanes_pandas(rank, stream, start, end).tolist()
        )
        key = np.sort(rank)
        want = pd.Series(end).groupby(key).cummax().to_numpy()
        assert _cummax_per_key(key, end).tolist() == want.tolist()
    # past int64's room for lifting the runs apart: the run-by-run loop, same maxima
    key = np.array([0, 0, 1, 1, 2, 2, 3], dtype=np.int64)
    x = np.array([2**61, 5, 2**61 + 3, 1, 0, 2**61, 7], dtype=np.int64)
    assert _cummax_per_key(key, x).tolist() == pd.Series(x).groupby(key).cummax().tolist()
