"""Chrome traces that Perfetto reads exactly (sim.analysis.chrome): integer-nanosecond times
with no overlap on a thread, processes and threads in order, flow arrows bound to slices,
counters for memory and link utilisation.

Perfetto's own trace processor cannot be installed here (it downloads a binary at run time),
so `tests.perfetto_model` reads the JSON back as Perfetto's importer does and nests slices as
its slice tracker does; `dropped` is what Perfetto would lose.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import commands
from sim.analysis.chrome import chrome_trace, flow_events, layout, write_chrome_trace
from sim.analysis.trace import to_frame
from sim.analysis.trace.ns import to_ns, us
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from tests.perfetto_model import load, nest, ns_from_number, ns_from_text, ts_variants
from tests.test_engine import TOPO, costs
from tests.test_network import GB


def _run(nodes: int) -> commands.RunResult:
    cfg = commands.demo_config().to_dict()
    cfg["nodes"] = nodes
    return commands.simulate_config(cfg, record_links=True)


@pytest.fixture(scope="module")
def demo():
    return _run(2)


def check(text: str, df: pd.DataFrame) -> list[dict]:
    """Everything Perfetto needs to show the trace whole; returns the events."""
    assert all(a == b for a, b in ts_variants(text))  # number and text readings agree
    events = load(text)
    dropped, kept = nest(events)
    assert dropped == 0
    # no overlap: nothing nested (but a zero-length task where the next one starts)
    assert all(d == 0 for slices in kept.values() for s, e, d, _ in slices if e > s)
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(df)
    # the integers are the table's times, each rounded once
    by_id = {e["args"]["id"]: e for e in xs}
    start, end = to_ns(df["start"]), to_ns(df["end"])
    for i, tid in enumerate(df["id"]):
        e = by_id[tid]
        assert (e["ts_ns"], e["ts_ns"] + e["dur_ns"]) == (start[i], end[i])
    meta = defaultdict(dict)
    for e in events:
        if e["ph"] == "M":
            meta[e["name"]][(e["pid"], e.get("tid"))] = e["args"]
    pids = {e["pid"] for e in events if e["ph"] in "XC"}
    assert pids <= {p for p, _ in meta["process_name"]}
    assert pids <= {p for p, _ in meta["process_sort_index"]}
    threads = {(e["pid"], e["tid"]) for e in xs}
    assert threads <= set(meta["thread_name"]) and threads <= set(meta["thread_sort_index"])
    assert not {t for _, t in threads} & pids  # never a process's "main thread"
    for args in list(meta["process_sort_index"].values()) + list(
        meta["thread_sort_index"].values()
    ):
        assert isinstance(args["sort_index"], int)
    # ranks in numeric order both ways: by sort index (chrome) and by name (Perfetto)
    ranks = sorted(
        (args["sort_index"], meta["process_name"][key]["name"])
        for key, args in meta["process_sort_index"].items()
        if meta["process_name"][key]["name"].startswith("rank")
    )
    assert [n for _, n in ranks] == sorted(n for _, n in ranks)
    _check_flows(events, kept)
    _check_counters(events)
    return events


def _check_flows(events: list[dict], kept: dict) -> None:
    ends = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            assert e["id"] not in ends[e["ph"]]
            ends[e["ph"]][e["id"]] = e
    assert set(ends["s"]) == set(ends["f"])
    for n, s in ends["s"].items():
        f = ends["f"][n]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]) and f["bp"] == "e"
        assert s["ts_ns"] < f["ts_ns"]
        for p in (s, f):  # strictly inside exactly one slice of its thread
            inside = [x for x in kept[(p["pid"], p["tid"])] if x[0] < p["ts_ns"] < x[1]]
            assert len(inside) == 1


def _check_counters(events: list[dict]) -> None:
    series = defaultdict(list)
    for e in events:
        if e["ph"] == "C":
            series[(e["pid"], e["name"])].append(e)
    for pts in series.values():
        ts = [e["ts_ns"] for e in pts]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
        for e in pts:
            assert all(math.isfinite(v) and v >= 0 for v in e["args"].values())


# -- times ----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10**15), min_size=1, max_size=50))  # up to 10^6 s
def test_integer_ns_round_trip(ns):
    text = json.dumps({"ts": us(ns)})
    tokens = text[text.index("[") + 1 : -2].split(", ")
    assert [ns_from_number(t) for t in tokens] == ns
    assert [ns_from_text(t) for t in tokens] == ns


def test_old_conversion_loses_slices_new_does_not(demo):
    """The checker can fail: ts and dur converted separately (the old export) lose slices."""
    df = demo.trace
    old = [
        {"ph": "X", "name": "t", "pid": int(r), "tid": s, "ts": a * 1e6, "dur": (b - a) * 1e6}
        for r, s, a, b in zip(df["rank"], df["stream"], df["start"], df["end"])
    ]
    assert nest(load(json.dumps({"traceEvents": old})))[0] > 0
    assert nest(load(json.dumps(chrome_trace(df))))[0] == 0


# -- whole traces -----------------------------------------------------------------------------


def test_demo_trace_is_read_whole(demo, tmp_path):
    path = write_chrome_trace(demo.trace, tmp_path / "t.json", None, demo.graph, demo.sim)
    events = check(path.read_text(), demo.trace)
    names = {e["name"] for e in events if e["ph"] == "C"}
    assert {"memory", "nvlink3 all links", "hdr busiest link"} <= names
    assert sum(e["ph"] == "s" for e in events) > 0
    procs = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {"rank 00 (node 0)", "rank 09 (node 1)", "network"} <= procs
    # the engine runs a stream's tasks one after another: no sub-track was needed
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert threads and not any("overlap" in t for t in threads)


def test_multi_node_back_to_back(tmp_path):
    """24 GPUs on 3 nodes, every rank's streams full of back-to-back tasks."""
    r = _run(3)
    check(json.dumps(chrome_trace(r.trace, None, r.graph, r.sim)), r.trace)


@pytest.mark.slow
def test_256_gpus_read_whole():
    r = _run(32)
    check(json.dumps(chrome_trace(r.trace, None, r.graph, r.sim)), r.trace)


def test_max_ranks_keeps_the_first(demo):
    events = load(json.dumps(chrome_trace(demo.trace, 3, demo.graph, demo.sim)))
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1, 2}
    assert nest(events)[0] == 0


def test_executor_trace_shipped(tmp_path):
    """A measured trace (the executor's, gloo) gets the same guarantees."""
    shipped = Path(__file__).resolve().parents[1] / "traces" / "exec-gloo-2r"
    df = pd.read_csv(shipped / "trace.csv")
    graph = TaskGraph.from_json(shipped / "graph.json")
    check(json.dumps(chrome_trace(df, None, graph)), df)


# -- layout ----------------------------------------------------------------------------------


def _frame(rows: list[tuple]) -> pd.DataFrame:
    cols = ["id", "rank", "stream", "kind", "start", "end"]
    df = pd.DataFrame(rows, columns=cols)
    df["duration"] = df["end"] - df["start"]
    for c in ("sync_wait", "bytes", "flops"):
        df[c] = 0.0
    for c in ("layer", "phase", "step", "chunk"):
        df[c] = None
    return df


def test_overlapping_tasks_go_to_a_sub_track():
    """Measured times may overlap on a stream; the later task moves to "(overlap 1)" rather
    than nest under a task it is not part of (a contained one too)."""
    df = _frame(
        [
            ("a", 0, "comm", "send", 0.0, 2e-6),
            ("b", 0, "comm", "send", 1e-6, 3e-6),  # overlaps a
            ("c", 0, "comm", "send", 1.2e-6, 1.5e-6),  # inside a and b
            ("d", 0, "comm", "send", 3e-6, 4e-6),  # back to back with b
            ("e", 0, "compute", "gemm", 0.0, 4e-6),
            ("z", 0, "comm", "send", 4e-6, 4e-6),  # zero length, where f starts
            ("f", 0, "comm", "send", 4e-6, 5e-6),
        ]
    )
    df.loc[df["id"] == "f", "step"] = float("nan")  # as a CSV gives a missing tag
    events = check(json.dumps(chrome_trace(df)), df)
    tname = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    on = {e["args"]["id"]: tname[e["tid"]] for e in events if e["ph"] == "X"}
    assert on == {
        "a": "comm",
        "b": "comm (overlap 1)",
        "c": "comm (overlap 2)",
        "d": "comm",
        "e": "compute",
        "z": "comm",
        "f": "comm",
    }
    order = {
        tname[e["tid"]]: e["args"]["sort_index"]
        for e in events
        if e.get("name") == "thread_sort_index"
    }
    assert order["compute"] < order["comm"] < order["comm (overlap 1)"] < order["comm (overlap 2)"]


def test_processes_and_threads_in_order():
    rows = [
        (f"t{r}{s}", r, s, "gemm", 0.0, 1e-6)
        for r in range(12)
        for s in ("copy", "comm.1", "comm", "compute")
    ]
    lay = layout(_frame(rows))
    assert [s for s, _ in lay.threads] == ["compute", "comm", "comm.1", "copy"]
    assert set(lay.tid.tolist()).isdisjoint(range(13))
    events = chrome_trace(_frame(rows))["traceEvents"]
    names = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
    assert names == sorted(names) == [f"rank {r:02d}" for r in range(12)]


# -- flows -----------------------------------------------------------------------------------


def _dep_graph() -> TaskGraph:
    g = TaskGraph(2)
    g.add(Task("g0", 0, "compute", "elementwise"))
    g.add(Task("s", 0, "comm", "send", deps=["g0"], peer=1, bytes=10e9, coll="p"))
    g.add(Task("r", 1, "comm", "recv", peer=0, bytes=10e9, coll="p"))
    g.add(Task("g1", 1, "compute", "elementwise", deps=["r"]))
    g.add(Task("g2", 1, "compute", "elementwise"))  # same stream as g1: no arrow
    return g


def test_flows_for_cross_stream_and_cross_rank_dependencies():
    g = _dep_graph()
    res = simulate(g, TOPO, costs())
    df = to_frame(res)
    events = check(json.dumps(chrome_trace(df, None, g, res)), df)
    xs = [e for e in events if e["ph"] == "X"]

    def bound(p):
        return next(
            x["args"]["id"]
            for x in xs
            if (x["pid"], x["tid"]) == (p["pid"], p["tid"])
            and x["ts_ns"] < p["ts_ns"] < x["ts_ns"] + x["dur_ns"]
        )

    s = {e["id"]: e for e in events if e["ph"] == "s"}
    f = {e["id"]: e for e in events if e["ph"] == "f"}
    arrows = sorted((s[n]["cat"], bound(s[n]), bound(f[n])) for n in s)
    assert arrows == [("dependency", "g0", "s"), ("dependency", "r", "g1"), ("send/recv", "s", "r")]


def test_flow_to_members_that_waited():
    """Rank 0 computes 1 s before the all-to-all, rank 1 launches it at once and waits: an
    arrow from rank 0's all-to-all (the last to launch) to rank 1's."""
    g = TaskGraph(2)
    g.add(Task("g", 0, "compute", "elementwise"))
    for r in (0, 1):
        deps = ["g"] if r == 0 else []
        g.add(Task(f"a{r}", r, "comm", "all_to_all", deps, bytes=1e9, group=[0, 1], coll="x"))
    res = simulate(g, TOPO, costs())
    df = to_frame(res)
    events = check(json.dumps(chrome_trace(df, None, g, res)), df)
    flows = [(e["ph"], e["pid"], e["cat"]) for e in events if e["ph"] in "sf"]
    assert ("s", 0, "waited for") in flows and ("f", 1, "waited for") in flows


def test_flow_cap_keeps_cross_rank_first():
    g = _dep_graph()
    res = simulate(g, TOPO, costs())
    df = to_frame(res)
    lay = layout(df)
    flows = flow_events(df, lay, g, limit=1)
    assert (flows.written, flows.omitted) == (1, 2)
    assert flows.events[0]["cat"] == "send/recv"
    doc = chrome_trace(df, None, g, res)
    assert doc["otherData"]["moesim"]["flows"] == 3


# -- counters --------------------------------------------------------------------------------


def _counters(doc: dict, name: str) -> list[tuple[int, dict]]:
    events = load(json.dumps(doc))
    return [(e["ts_ns"], e["args"]) for e in events if e["ph"] == "C" and e["name"] == name]


def test_link_utilisation_closed_form():
    """GPU 0 sends 15 GB to GPU 1 of a 4-GPU star at 10 GB/s: for 1.5 s the "slow" class
    (GPU 0's two directions) is half used, its busiest link full; the "fast" class (six
    directions) carries one link's worth; then nothing."""
    g = TaskGraph(4)
    g.add(Task("s", 0, "comm", "send", peer=1, bytes=15 * GB, coll="p"))
    g.add(Task("r", 1, "comm", "recv", peer=0, bytes=15 * GB, coll="p"))
    res = simulate(g, TOPO, costs(), record_links=True)
    doc = chrome_trace(to_frame(res), None, g, res)
    assert _counters(doc, "slow all links") == [(0, {"%": 50.0}), (1_500_000_000, {"%": 0.0})]
    assert _counters(doc, "slow busiest link") == [(0, {"%": 100.0}), (1_500_000_000, {"%": 0.0})]
    fast = _counters(doc, "fast all links")
    assert [t for t, _ in fast] == [0, 1_500_000_000]
    assert fast[0][1]["%"] == pytest.approx(100 / 6, rel=1e-6)
    assert simulate(g, TOPO, costs()).link_timeline is None  # only when asked for


@pytest.mark.parametrize("symmetric", [False, True])
def test_link_utilisation_integrates_to_link_bytes(symmetric, demo):
    """Utilisation x capacity integrated over time is the bytes the engine says each class
    carried, in a plain run and in a symmetric one (one link simulated per orbit)."""
    r = demo
    if symmetric:
        cfg = commands.demo_config().to_dict()
        cfg["parallel"] = {"ep": 8, "dp": 2}
        cfg["costs"] = dict(cfg["costs"], symmetry="on")
        r = commands.simulate_config(cfg, record_links=True)
    tl, topo = r.sim.link_timeline, r.sim.topology
    assert (r.sim.stats.get("symmetry") or {}).get("used", False) == symmetric
    cls = np.array(topo.link_class_names)
    for c, name in enumerate(tl["classes"]):
        cap = topo.link_cap[cls == name].sum()
        carried = r.sim.link_bytes[cls == name].sum()
        assert float(np.sum(tl["mean"][:-1, c] * np.diff(tl["t"]))) * cap == pytest.approx(
            carried, rel=1e-9
        )
        assert tl["mean"][-1, c] == 0.0 and tl["max"][:, c].max() <= 1 + 1e-12


def test_memory_counter_closed_form():
    """a (1 s) allocates x = 100 B; b (1 s) allocates y = 50 B and frees x at its end; c
    (1 s) frees y: 100, 150, 50, 0 at 0, 1, 2, 3 s."""
    g = TaskGraph(1)
    g.add(Task("a", 0, "compute", "elementwise", allocs={"x": 100.0}))
    g.add(Task("b", 0, "compute", "elementwise", allocs={"y": 50.0}, frees=["x"]))
    g.add(Task("c", 0, "compute", "elementwise", frees=["y"]))
    res = simulate(g, TOPO, costs())
    got = _counters(chrome_trace(to_frame(res), None, g, res), "memory")
    mib = 2.0**20
    assert got == [
        (0, {"MiB": 100 / mib}),
        (1_000_000_000, {"MiB": 150 / mib}),
        (2_000_000_000, {"MiB": 50 / mib}),
        (3_000_000_000, {"MiB": 0.0}),
    ]


def test_memory_counter_peaks_at_the_engines_peak(demo):
    doc = chrome_trace(demo.trace, None, demo.graph, demo.sim)
    peak = defaultdict(float)
    for e in doc["traceEvents"]:
        if e["ph"] == "C" and e["name"] == "memory":
            peak[e["pid"]] = max(peak[e["pid"]], e["args"]["MiB"] * 2**20)
    assert [peak[r] for r in range(16)] == pytest.approx(demo.sim.mem_peak.tolist(), rel=1e-12)


def test_whatif_sides_get_the_same_guarantees(tmp_path):
    from sim.analysis.whatif import whatif_command

    shipped = Path(__file__).resolve().parents[1] / "traces" / "exec-gloo-2r"
    whatif_command(str(shipped / "trace.csv"), ["compute.speed=*0.5"], out=str(tmp_path))
    for side in ("before", "after"):
        df = pd.read_csv(tmp_path / side / "trace.csv")
        events = check((tmp_path / side / "trace.chrome.json").read_text(), df)
        assert any(e["ph"] == "s" for e in events)


def test_link_utilisation_under_interference():
    """The same send while GPU 0 computes for its first second (comm at half speed then):
    5 GB/s for 1 s, then 10 GB/s for the remaining 10 GB."""
    g = TaskGraph(4)
    g.add(Task("gemm", 0, "compute", "elementwise"))  # 1 s
    g.add(Task("s", 0, "comm", "send", peer=1, bytes=15 * GB, coll="p"))
    g.add(Task("r", 1, "comm", "recv", peer=0, bytes=15 * GB, coll="p"))
    res = simulate(g, TOPO, costs(interference={"comm": {"compute": 0.5}}), record_links=True)
    doc = chrome_trace(to_frame(res), None, g, res)
    s, f = 1_000_000_000, 2_000_000_000
    assert _counters(doc, "slow all links") == [(0, {"%": 25.0}), (s, {"%": 50.0}), (f, {"%": 0.0})]
    assert _counters(doc, "slow busiest link") == [(0, {"%": 50}), (s, {"%": 100}), (f, {"%": 0})]
