"""Trace replay: measured traces (the executor's, PyTorch profiler's) replayed unedited
reproduce what was measured; truncated or foreign files are one-line ConfigErrors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from sim.analysis.importers import kineto
from sim.analysis.replay import import_trace, replay, replay_command, replay_graph
from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

TRACES = Path(__file__).resolve().parents[1] / "traces"
EXEC = TRACES / "exec-gloo-2r"
KINETO = TRACES / "kineto-gloo-2r"


def _measured(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).set_index("id")


@pytest.mark.parametrize("graph", [EXEC / "graph.json", None], ids=["with-graph", "inferred"])
def test_executor_trace_replays_to_its_makespan(graph):
    m = _measured(EXEC / "trace.csv")
    measured = m["end"].max() - m["start"].min()
    r = replay(EXEC / "trace.csv", graph=graph)
    rep = r.summary["replay"]
    assert rep["measured_makespan_s"] == pytest.approx(measured, rel=1e-12)
    # rank 1 started 2.5 ms before rank 0 and waited for it in the first all-to-all: the
    # step begins where both ranks run (aligned at that all-to-all), the skew apart
    assert rep["aligned_at"] == "r0/L0/fwd/dispatch.0"
    assert rep["rank_start_skew_s"]["1"] == rep["start_skew_s"] > 0.002
    assert rep["rank_start_skew_s"]["0"] == 0.0
    step = measured - rep["start_skew_s"]
    assert rep["measured_step_s"] == pytest.approx(step, rel=1e-12)
    assert abs(r.summary["makespan_s"] - step) / step < 1e-9
    # and better than that: every task where and when it was measured, sync waits included,
    # on the aligned clock: up to the first all-to-all from its rank's own start, after it
    # from the step's start
    t = r.trace.set_index("id").loc[m.index]
    first = m[m.index.str.endswith("/L0/fwd/dispatch.0")]
    before = m["start"] <= first["start"].max()  # the all-to-all's launches included
    rank_start = m.groupby("rank")["start"].transform("min")
    origin = m["start"].min() + rep["start_skew_s"]
    expected = (m["start"] - rank_start).where(before, m["start"] - origin)
    assert (t["start"] - expected).abs().max() < 1e-9
    ends_before = before & ~m.index.isin(first.index)  # the all-to-all ends together
    expected_end = (m["end"] - rank_start).where(ends_before, m["end"] - origin)
    assert (t["end"] - expected_end).abs().max() < 1e-9
    later = ~m.index.isin(first.index)
    assert (t["sync_wait"] - m["sync_wait"])[later].abs().max() < 1e-9
    # rank 1's wait in the first all-to-all was its early start: gone from the replay
    assert m.loc["r1/L0/fwd/dispatch.0", "sync_wait"] > 0.002
    assert t.loc["r1/L0/fwd/dispatch.0", "sync_wait"] < 1e-3
    # the measured summary's busy times come back too, less the skew waited in the first
    busy = json.loads((EXEC / "summary.json").read_text())["busy_s"]
    shorter = (m["duration"] - t["duration"])[first.index].sum() / 2  # mean over ranks
    assert shorter > 0.001
    for stream, b in busy.items():
        less = shorter if stream == "comm" else 0.0
        assert r.summary["busy_s"][stream] == pytest.approx(b - less, rel=1e-9)


def test_inferred_structure_finds_the_real_waits():
    """Without the graph, the cross-stream dependencies found are mostly those of the graph
    the executor ran (a wait is inferred only where a task started late; on this recording
    19 of the 20 inferred are real, of the graph's 32)."""
    g = TaskGraph.from_json(EXEC / "graph.json")
    inferred, _ = import_trace(EXEC / "trace.csv")

    def cross(graph):
        return {(d, t.id) for t in graph for d in t.deps if graph.tasks[d].stream != t.stream}

    found, real = cross(inferred), cross(g)
    assert len(found & real) >= 0.9 * len(found) and len(found & real) >= 0.5 * len(real)
    # collectives matched across ranks as the graph pairs them
    by_coll = {}
    for t in inferred:
        if t.coll:
            by_coll.setdefault(t.coll, set()).add(t.id.split("/", 1)[1])
    assert all(len(v) == 1 for v in by_coll.values())
    assert len(by_coll) == len({t.coll for t in g if t.coll})


def test_replay_graph_round_trips_and_simulates_elsewhere(tmp_path):
    """The replay graph keeps its measured times through JSON; `simulate` honours them."""
    r = replay(EXEC, topology="localhost-cpu")  # a directory: its trace.csv and graph.json
    assert r.summary["replay"]["format"] == "moesim trace + graph"
    files = replay_command(str(EXEC), out=str(tmp_path / "out"))["files"]
    assert {Path(f).name for f in files.values()} == {
        "trace.csv",
        "trace.chrome.json",
        "graph.json",
        "summary.json",
    }
    assert (tmp_path / "out" / "summary.json").is_file()
    g = TaskGraph.from_json(tmp_path / "out" / "graph.json")
    again = replay_graph(g)
    assert again.summary["makespan_s"] == pytest.approx(r.summary["makespan_s"], rel=1e-12)
    topo = Topology.load("localhost-cpu", nodes=2)
    res = simulate(g, topo, CostModel.build(topo, {"network": "collective"}))
    assert res.makespan == pytest.approx(r.summary["makespan_s"], rel=1e-12)


def _step_span(paths) -> tuple[float, float]:
    """(union of the ranks' ProfilerStep ranges, the longest step), seconds."""
    steps = [kineto._steps(kineto.read(p))[1] for p in paths]
    lo = min(s["ts"] for s in steps)
    hi = max(s["ts"] + s["dur"] for s in steps)
    return (hi - lo) * 1e-6, max(s["dur"] for s in steps) * 1e-6


def test_kineto_trace_imports_and_replays():
    paths = sorted(KINETO.glob("rank*.json.gz"))
    r = replay(paths)
    s = r.summary
    assert s["replay"]["format"] == "pytorch profiler (kineto)"
    assert s["world_size"] == 2 and s["makespan_s"] > 0
    assert abs(s["replay"]["error"]) < 0.02
    # Sane against the step the profiler timed: the replay spans the ops recorded inside
    # the ranks' ProfilerStep#1 ranges, so it is at most their union (ops that run past
    # the step's end aside: 10%) and at least the longest step less the profiler's own
    # bookkeeping at the step's ends (well under 10% of a 50 ms step).
    union, longest = _step_span(paths)
    assert 0.9 * longest <= s["makespan_s"] <= 1.1 * union
    g = r.graph
    colls = {}
    for t in g:
        if t.coll:
            colls.setdefault(t.coll, []).append(t)
    # the recorded step: 2 forward + 2 backward all-to-alls per layer half, 8 in all, each
    # matched across both ranks, with its size from the profiler's input dims
    assert len(colls) == 8
    for members in colls.values():
        assert sorted(m.rank for m in members) == [0, 1]
        assert {m.kind for m in members} == {"all_to_all"} and members[0].bytes > 0
    assert {"gemm", "elementwise", "softmax"} <= {t.kind for t in g}
    # the pipelined forward's communication thread was recorded (profile_all_threads)
    assert any(t.stream.startswith("compute.t") for t in g)


def test_kineto_step_selection_errors(tmp_path):
    paths = sorted(KINETO.glob("rank*.json.gz"))
    with pytest.raises(ConfigError, match=r"has no ProfilerStep#7 \(it has \[1\]\)"):
        kineto.load(paths, step=7)
    with pytest.raises(ConfigError, match="two files of rank"):
        kineto.load([paths[0], paths[0]])


# -- a synthetic GPU trace: the CUDA / NCCL path (no GPU was lent to record a real one) -----


def _gpu_rank(rank: int, off: float) -> dict:
    host = {"pid": 100 + rank, "tid": 1}
    dev = {"pid": 0}

    def x(name, cat, ts, dur, where, **args):
        return {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": ts + off,
            "dur": dur,
            **where,
            "args": args,
        }

    splits = "[1, 3]" if rank == 0 else "[3, 1]"
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "traceEvents": [
            x("ProfilerStep#3", "user_annotation", 0, 1000, host),
            x("aten::mm", "cpu_op", 10, 20, host, **{"Input Dims": [[8, 16], [16, 4]]}),
            x("cudaLaunchKernel", "cuda_runtime", 15, 5, host, correlation=1),
            x(
                "ampere_sgemm_64x32_nn",
                "kernel",
                40,
                100,
                {**dev, "tid": 7},
                stream=7,
                correlation=1,
            ),
            x("c10d::alltoall_base_", "cpu_op", 40, 10, host),
            x("nccl:all_to_all", "cpu_op", 42, 5, host),
            x("cudaLaunchKernel", "cuda_runtime", 43, 2, host, correlation=2),
            x(
                "ncclDevKernel_SendRecv",
                "kernel",
                150,
                200,
                {**dev, "tid": 13},
                stream=13,
                correlation=2,
                **{
                    "Collective name": "all_to_allv",
                    "In msg nelems": 64,
                    "dtype": "Float",
                    "In split size": splits,
                    "Process Group Name": "0",
                    "Process Group Ranks": "[0, 1]",
                    "Seq": 5,
                },
            ),
            x("aten::item", "cpu_op", 60, 400, host),
            x("cudaMemcpyAsync", "cuda_runtime", 62, 2, host, correlation=3),
            x("cudaStreamSynchronize", "cuda_runtime", 65, 390, host),
            x(
                "Memcpy DtoH (Device -> Pinned)",
                "gpu_memcpy",
                360,
                20,
                {**dev, "tid": 7},
                stream=7,
                correlation=3,
                bytes=256,
            ),
        ],
    }


def test_kineto_gpu_path_on_a_synthetic_trace(tmp_path):
    paths = []
    for rank in (0, 1):
        p = tmp_path / f"rank{rank}.json"
        p.write_text(json.dumps(_gpu_rank(rank, 30.0 * rank)))
        paths.append(p)
    r = replay(paths)
    g = r.graph
    kinds = {t.kind for t in g}
    assert {"gemm", "all_to_allv", "d2h", "elementwise"} <= kinds
    nccl = [t for t in g if t.kind == "all_to_allv"]
    assert len({t.coll for t in nccl}) == 1 and nccl[0].group == [0, 1]
    rank0 = next(t for t in nccl if t.rank == 0)
    assert rank0.split == [64.0, 192.0] and rank0.bytes == 256.0  # 64 floats, rows 1:3
    by_name = {(t.rank, t.tags["step"], t.stream): t for t in g}
    gemm = by_name[(0, "ampere_sgemm_64x32_nn", "compute.d0s7")]
    assert gemm.shape is None and any("aten::mm" in d for d in gemm.deps)  # after its launch
    mm = next(t for t in g if t.tags["step"] == "aten::mm" and t.rank == 0)
    assert mm.kind == "gemm" and mm.shape == {"m": 8, "n": 4, "k": 16}
    # the host op that synchronised is cut around the wait; the part after it waited for
    # the last GPU op that ended before the synchronisation returned
    item = sorted((t for t in g if t.rank == 0 and "aten::item" in t.id), key=lambda t: t.id)
    assert len(item) == 2 and any("Memcpy" in d for d in item[1].deps)
    assert abs(r.summary["replay"]["error"]) < 1e-9


def test_kineto_step_is_the_hosts_not_its_gpu_projection(tmp_path):
    """On a GPU, Kineto writes ProfilerStep#N twice; the device copy (`gpu_user_annotation`)
    can end long before the step (H200: 5.0 of 13.1 ms). The step is the host's: the work
    after the device copy's end is replayed."""
    paths = []
    for rank in (0, 1):
        doc = _gpu_rank(rank, 30.0 * rank)
        doc["traceEvents"].append(
            {
                "ph": "X",
                "name": "ProfilerStep#3",
                "cat": "gpu_user_annotation",
                "ts": 40 + 30.0 * rank,
                "dur": 15,
                "pid": 0,
                "tid": 7,
                "args": {},
            }
        )
        p = tmp_path / f"rank{rank}.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    kinds = {t.kind for t in replay(paths).graph}
    # the matmul's host op starts before the device copy (10 < 40 us), the copy's after its
    # end (60 > 55 us)
    assert {"gemm", "all_to_allv", "d2h"} <= kinds


# -- bad input: one line, naming the file and what was expected -------------------------------


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_truncated_kineto_json(tmp_path):
    text = gzip.decompress((KINETO / "rank0.json.gz").read_bytes()).decode()
    p = tmp_path / "cut.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match="cut.json: not valid JSON, truncated") as e:
        replay(p)
    assert "Kineto" in _one_line(e)
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes((KINETO / "rank0.json.gz").read_bytes()[:5000])
    with pytest.raises(ConfigError, match="cut.json.gz: truncated or corrupt gzip") as e:
        replay(gz)
    _one_line(e)


@pytest.mark.parametrize(
    "content, match",
    [
        ({"foo": 1}, "expected a PyTorch profiler"),
        ([1, 2, 3], "expected a PyTorch profiler"),
        ({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1}]}, "has no profiler ops"),
        ({"schema_version": 1, "world_size": 1, "tasks": []}, "is a moesim task graph"),
    ],
    ids=["object", "list", "no-ops", "graph"],
)
def test_foreign_json(tmp_path, content, match):
    p = tmp_path / "foreign.json"
    p.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=match) as e:
        replay(p)
    assert "foreign.json" in _one_line(e)


def test_moesim_chrome_export_is_not_a_profiler_trace():
    with pytest.raises(ConfigError, match="moesim's own Chrome export; replay the trace.csv"):
        replay(EXEC / "trace.chrome.json")


def test_bad_tables(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty.csv: empty file") as e:
        replay(empty)
    _one_line(e)
    cut = tmp_path / "cut.csv"
    cut.write_bytes((EXEC / "trace.csv").read_bytes()[:3000])
    with pytest.raises(ConfigError, match="cut.csv: the last line is incomplete") as e:
        replay(cut)
    _one_line(e)
    header = tmp_path / "header.csv"
    header.write_text("id,rank,stream,kind,start,end\n")
    with pytest.raises(ConfigError, match="header.csv: has no rows"):
        replay(header)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"other.csv: missing column\(s\)") as e:
        replay(other)
    _one_line(e)
    with pytest.raises(ConfigError, match="nope.csv: not found"):
        replay(tmp_path / "nope.csv")
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    with pytest.raises(ConfigError, match="notes.txt: unknown format"):
        replay(txt)
    wrong = tmp_path / "g.json"
    other_graph = TaskGraph(2)
    other_graph.add(Task("x", 0, "compute", "elementwise", bytes=1.0))
    other_graph.to_json(wrong)
    with pytest.raises(ConfigError, match="not in graph|are not in it"):
        replay(EXEC / "trace.csv", graph=wrong)
