"""The real executor on 2 local gloo processes: traces, ordering, clocks, errors, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict

import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.errors import ExecError  # noqa: E402
from exec.measure.timings import measurements  # noqa: E402
from exec.runtime.launch import ExecResult, launch, launch_runs  # noqa: E402
from sim.analysis.trace import COLUMNS  # noqa: E402
from sim.core.graph import Task, TaskGraph  # noqa: E402
from sim.core.kinds import COMM_KINDS  # noqa: E402
from sim.strategies import build  # noqa: E402
from sim.workload.moe import MoELayer  # noqa: E402

TINY = dict(batch=1, seq_len=64, model_dim=32, hidden_dim=64, experts=4, world=2)


def _tiny_graph(**routing) -> TaskGraph:
    layer = MoELayer(**TINY, **routing)
    return build("pipelined", layer, {"degree": 2}, ("fwd", "bwd"))


@pytest.fixture(scope="module")
def tiny() -> tuple[TaskGraph, ExecResult]:
    g = _tiny_graph()
    return g, launch(g, 2, "gloo", timeout_s=30)


def _tolerance(res: ExecResult) -> float:
    """Cross-rank comparisons hold up to the alignment error of both clocks."""
    return 2 * max(res.clock_bounds_ns) / 1e9 + 1e-6


def _check_order(g: TaskGraph, res: ExecResult) -> None:
    row = res.trace.set_index("id")
    for tasks in g.streams().values():  # program order: one after the other, same thread
        for a, b in zip(tasks, tasks[1:]):
            assert row.at[b.id, "start"] >= row.at[a.id, "end"], (a.id, b.id)
    for t in g:  # deps: on this rank, so on the same clock
        for d in t.deps:
            assert row.at[t.id, "start"] >= row.at[d, "end"], (d, t.id)


def _check_collectives(g: TaskGraph, res: ExecResult) -> None:
    row = res.trace.set_index("id")
    tol = _tolerance(res)
    members: dict[str, list[str]] = defaultdict(list)
    for t in g:
        if t.kind in COMM_KINDS:
            members[t.coll].append(t.id)  # type: ignore[index]
    assert members
    for cid, ids in members.items():
        starts, ends = row.loc[ids, "start"], row.loc[ids, "end"]
        # no member can finish before every member has launched it
        assert ends.min() >= starts.max() - tol, cid
        waits = row.loc[ids, "sync_wait"]
        assert (waits >= 0).all() and (waits <= row.loc[ids, "duration"] + 1e-12).all()
        assert waits.min() == 0.0, cid  # the last member to arrive waits for nobody


# -- the tiny MoE graph ------------------------------------------------------------------------


def test_trace_has_one_row_per_task(tiny):
    g, res = tiny
    df = res.trace
    assert list(df.columns) == COLUMNS
    assert len(df) == len(g) and set(df["id"]) == set(g.tasks)
    assert (df["end"] >= df["start"]).all()
    assert (df["duration"] - (df["end"] - df["start"])).abs().max() < 1e-12
    assert df["start"].min() >= -_tolerance(res)
    for t in g:
        r = df[df["id"] == t.id].iloc[0]
        assert (r["rank"], r["stream"], r["kind"]) == (t.rank, t.stream, t.kind)
        assert r["bytes"] == t.bytes and r["step"] == t.tags["step"]
    assert res.device == "cpu" and res.nprocs == 2
    assert res.makespan > 0


def test_program_order_and_dependencies(tiny):
    _check_order(*tiny)


def test_collective_members_overlap_across_ranks(tiny):
    _check_collectives(*tiny)


def test_timed_runs_in_one_launch_are_each_a_whole_run():
    """`launch_runs`: one process start per rank and one warm-up for several timed runs,
    each a whole trace of its own run (program order, collectives, clocks) from its own
    origin, as `moesim validate` measures its repeats."""
    g = _tiny_graph()
    runs = launch_runs(g, 2, 3, "gloo", timeout_s=30)
    assert len(runs) == 3
    for res in runs:
        assert sorted(res.trace["id"]) == sorted(g.tasks)
        _check_order(g, res)
        _check_collectives(g, res)
        assert res.trace["start"].min() >= 0.0  # after its own origin
    # three runs, not one run's trace three times
    assert len({tuple(r.trace.sort_values("id")["end"]) for r in runs}) == 3


def test_clock_offsets_within_their_bound(tiny):
    _, res = tiny
    # one host: every rank reads the same monotonic clock, so the true offset is zero and
    # the estimate must be off by no more than its (round trip / 2) bound
    assert res.clock_offsets_ns[0] == 0 and res.clock_bounds_ns[0] == 0
    for off, bound in zip(res.clock_offsets_ns[1:], res.clock_bounds_ns[1:]):
        assert bound > 0  # its size is a round trip, which a busy machine stretches: not tested
        assert abs(off) <= bound


def test_measurements_for_calibration(tiny):
    g, res = tiny
    m = measurements(g, res.trace)
    assert len(m) == len(g)
    gemm = m[m["op"] == "gemm"]
    assert (gemm["x"] > 0).all() and (gemm["ranks"] == 1).all()
    a2a = m[m["op"] == "all_to_all"]
    assert (a2a["ranks"] == 2).all() and (a2a["t"] >= 0).all()
    # the pipelined graph overlaps experts with all-to-alls somewhere
    assert (m["others"] != "").any()


# -- other graphs ----------------------------------------------------------------------------


def _kinds_graph() -> TaskGraph:
    """Every kind the executor runs, on 2 ranks; the p2p pairs cross stream names."""
    g = TaskGraph(2)
    grp = [0, 1]
    for r in range(2):
        gemm = {"batch": 2, "m": 8, "n": 16, "k": 4}
        g.add(Task(f"r{r}/gemm", r, "compute", "gemm", shape=gemm, tags={"dtype": "bf16"}))
        g.add(Task(f"r{r}/elem", r, "compute", "elementwise", bytes=1 << 16, deps=[f"r{r}/gemm"]))
        g.add(Task(f"r{r}/d2h", r, "copy", "d2h", bytes=4096, deps=[f"r{r}/elem"]))
        g.add(Task(f"r{r}/h2d", r, "copy", "h2d", bytes=4096))
        colls = [
            ("ag", "all_gather", dict(bytes=1000)),
            ("rs", "reduce_scatter", dict(bytes=4096)),
            ("ar", "all_reduce", dict(bytes=4096, tags={"dtype": "fp16"})),
            ("bc", "broadcast", dict(bytes=1000)),
            ("a2a", "all_to_all", dict(bytes=1001)),  # not a multiple of the group size
            ("a2av", "all_to_allv", dict(split=[[100.0, 300.0], [200.0, 0.0]][r])),
        ]
        prev = f"r{r}/gemm"
        for name, kind, kw in colls:
            t = Task(f"r{r}/{name}", r, "comm", kind, group=grp, coll=name, deps=[prev], **kw)
            if kind == "all_to_allv":
                t.bytes = sum(t.split or ())
            g.add(t)
            prev = t.id
    # rank 0 sends on comm.1, rank 1 receives on comm; and back the other way
    g.add(Task("r0/send", 0, "comm.1", "send", bytes=5000, peer=1, coll="p0", deps=["r0/elem"]))
    g.add(Task("r1/recv", 1, "comm", "recv", bytes=5000, peer=0, coll="p0"))
    g.add(Task("r1/use", 1, "compute", "elementwise", bytes=8192, deps=["r1/recv"]))
    g.add(Task("r1/send", 1, "comm.1", "send", bytes=64, peer=0, coll="p1", deps=["r1/use"]))
    g.add(Task("r0/recv", 0, "comm.1", "recv", bytes=64, peer=1, coll="p1"))
    g.validate()
    return g


def test_every_kind_and_send_recv_across_streams():
    g = _kinds_graph()
    res = launch(g, 2, "gloo", timeout_s=30, warmup=0)
    assert set(res.trace["id"]) == set(g.tasks)
    assert set(res.trace["kind"]) == {t.kind for t in g}
    _check_order(g, res)
    _check_collectives(g, res)
    row = res.trace.set_index("id")
    tol = _tolerance(res)
    assert row.at["r1/recv", "end"] >= row.at["r0/send", "start"] - tol
    assert row.at["r0/recv", "end"] >= row.at["r1/send", "start"] - tol
    assert row.at["r0/recv", "end"] >= row.at["r1/use", "end"] - tol  # sent only after use


def test_all_to_allv_with_skewed_routing():
    g = _tiny_graph(routing={"kind": "zipf", "s": 1.5, "seed": 3})
    a2av = [t for t in g if t.kind == "all_to_allv"]
    assert a2av and any(len(set(t.split)) > 1 for t in a2av)  # really uneven
    res = launch(g, 2, "gloo", timeout_s=30, warmup=0)
    assert len(res.trace) == len(g)
    _check_order(g, res)
    _check_collectives(g, res)


# Parameters that make each strategy's graph concrete without a cluster (no selector runs)
RUNNABLE = {
    "sequential": {},
    "pipelined": {"degree": 2, "order": "alternating"},
    "pipemoe": {"degree": 2},
    "tutel": {"degree": 2, "algo": "2dh"},
    "ted": {"tp": 2},
    "fastermoe": {"group_size": 1, "shadow": [0]},
    "mpipemoe": {"degree": 2, "reuse": "S1"},  # d2h / h2d on the copy stream
    "parm": {"schedule": "s2", "saa": True, "tp": 2, "esp": 1},  # SAA rounds + comm.1 gathers
    "lancet": {"degree": 2},
    "deepep": {"gpus_per_node": 1},  # 2 nodes of 1: the forwarder path across them
    "megatron_ep": {"micro": 2, "layers": 1, "shared": 1},  # merged step, compute.1 experts
    "dualpipe": {"pp": 2, "micro": 4},  # 2 devices of an EP group of 1: p2p between them
}


def _strategy_graph(name: str) -> TaskGraph:
    routing = {"routing": {"kind": "zipf", "s": 1.2, "seed": 0}} if name == "fastermoe" else {}
    world = {"world": 1} if name == "dualpipe" else {}  # its graph: devices x the EP group
    return build(name, MoELayer(**{**TINY, **world}, **routing), RUNNABLE[name], ("fwd", "bwd"))


def _union(graphs: dict[str, TaskGraph]) -> TaskGraph:
    """The graphs one after the other in one graph (ids, collectives and buffers prefixed by
    the graph's name): one launch runs them all, instead of a process start per graph."""
    from dataclasses import replace

    out = TaskGraph(2)
    for name, g in graphs.items():
        for t in g:
            out.add(
                replace(
                    t,
                    id=f"{name}:{t.id}",
                    deps=[f"{name}:{d}" for d in t.deps],
                    coll=None if t.coll is None else f"{name}:{t.coll}",
                    allocs={f"{name}:{k}": v for k, v in t.allocs.items()},
                    frees=[f"{name}:{k}" for k in t.frees],
                )
            )
    out.validate()
    return out


@pytest.fixture(scope="module")
def every_strategy():
    graphs = {name: _strategy_graph(name) for name in sorted(RUNNABLE)}
    return graphs, launch(_union(graphs), 2, "gloo", timeout_s=60, warmup=0)


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_every_strategy_graph_runs_for_real(name, every_strategy):
    """The twin's promise: any strategy's graph (its streams, copies, sub-group and
    skewed collectives) executes, in program order and with every dependency honoured."""
    from sim.strategies import STRATEGIES

    assert set(RUNNABLE) == set(STRATEGIES), "add the new strategy to RUNNABLE"
    graphs, res = every_strategy
    g = graphs[name]
    mine = res.trace[res.trace["id"].str.startswith(f"{name}:")]
    mine = mine.assign(id=mine["id"].str[len(name) + 1 :])
    sub = ExecResult(
        mine, res.nprocs, res.backend, res.device, res.clock_offsets_ns, res.clock_bounds_ns
    )
    assert sorted(sub.trace["id"]) == sorted(t.id for t in g)
    _check_order(g, sub)
    _check_collectives(g, sub)


def test_world_size_mismatch_is_a_clear_error(monkeypatch):
    import subprocess

    def no_processes(*_a, **_k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", no_processes)  # refused before any starts
    g = _tiny_graph()
    with pytest.raises(ExecError, match=r"graph is for 2 ranks but 3 processes.*--nprocs 2"):
        launch(g, 3)


def test_collective_a_rank_never_reaches_fails_fast_and_names_it():
    # rank 1 lacks the all_reduce (possible only without validation): rank 0 must fail with
    # a message naming itself, the task, the kind and the peers, not hang
    data = {
        "schema_version": 1,
        "world_size": 2,
        "tasks": [
            {"id": "r0/prep", "rank": 0, "stream": "compute", "kind": "elementwise", "bytes": 64},
            {
                "id": "r0/sum",
                "rank": 0,
                "stream": "comm",
                "kind": "all_reduce",
                "bytes": 4096,
                "group": [0, 1],
                "coll": "grad-sum",
                "deps": ["r0/prep"],
            },
            {"id": "r1/prep", "rank": 1, "stream": "compute", "kind": "elementwise", "bytes": 64},
        ],
    }
    g = TaskGraph.from_dict(data, validate=False)
    t0 = time.monotonic()
    with pytest.raises(ExecError) as err:
        launch(g, 2, "gloo", timeout_s=2, warmup=0)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert "rank 0" in msg and "'r0/sum'" in msg and "all_reduce" in msg, msg
    assert "[0, 1]" in msg and "within 2 s" in msg, msg
    assert elapsed < 300, elapsed  # it fails instead of hanging (generous: a busy machine)


# -- command line -----------------------------------------------------------------------------


def test_cli_exec_config_writes_trace_and_summary(tmp_path, capsys):
    from sim.cli import main

    cfg = {
        "topology": "dgx-a100",
        "model": {k: v for k, v in TINY.items() if k != "world"} | {"top_k": 1},
        "strategy": {"name": "pipelined", "degree": 2, "order": "two_streams"},
        "passes": ["fwd"],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    rc = main(["exec", str(path), "--nprocs", "2", "--out", str(out), "--json", "--warmup", "0"])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    summary = json.loads(stdout)
    assert summary["makespan_s"] > 0 and summary["ranks"] == 2
    assert set(summary["busy_s"]) == {"compute", "comm", "comm.1"}
    df = pd.read_csv(out / "trace.csv")
    assert list(df.columns) == COLUMNS and len(df) == summary["tasks"]
    chrome = json.loads((out / "trace.chrome.json").read_text())
    assert sum(e["ph"] == "X" for e in chrome["traceEvents"]) == len(df)
    # --strategy / --param as for `moesim simulate`: one stream where two_streams had two
    args = ["exec", str(path), "--nprocs", "2", "--out", str(out), "--json", "--warmup", "0"]
    assert main(args + ["--param", "order=tutel"]) == 0
    assert set(json.loads(capsys.readouterr()[0])["busy_s"]) == {"compute", "comm"}
    graph_json = tmp_path / "g.json"
    _tiny_graph().to_json(graph_json)
    assert main(["exec", str(graph_json), "--nprocs", "2", "--strategy", "ted"]) == 2
    assert "--strategy / --param apply to a run config" in capsys.readouterr()[1]


def test_cli_world_mismatch_exits_2_with_one_line(tmp_path, capsys):
    from sim.cli import main

    path = tmp_path / "g.json"
    _tiny_graph().to_json(path)
    rc = main(["exec", str(path), "--nprocs", "4", "--out", str(tmp_path / "o")])
    _, stderr = capsys.readouterr()
    assert rc == 2
    assert stderr.count("\n") == 1 and "graph is for 2 ranks but 4 processes" in stderr


def test_importing_sim_and_exec_does_not_import_torch():
    code = (
        "import sys, sim, exec, exec.cli, sim.cli; sim.cli.build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_runs_under_torchrun(tmp_path):
    path = tmp_path / "g.json"
    g = _tiny_graph()
    g.to_json(path)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "sim.cli", "exec", str(path), "--out", str(out), "--warmup", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("executed 52 tasks on 2 ranks") == 1  # rank 0 reports, alone
    df = pd.read_csv(out / "trace.csv")
    assert set(df["id"]) == set(g.tasks) and set(df["rank"]) == {0, 1}
