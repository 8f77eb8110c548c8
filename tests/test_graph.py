"""The task-graph contract: JSON round trip, static validation, and run-time deadlock reports."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from sim.core.errors import DeadlockError, GraphError
from sim.core.graph import SCHEMA_VERSION, Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

TASK_FIELDS = [f.name for f in dataclasses.fields(Task)]


def _tasks(p2p: tuple[int, int] = (0, 1)) -> list[dict]:
    """A small valid graph: every Task field is set to a non-default value on some task.

    Ranks 0 and 1 run a GEMM, an all_to_all ('disp'), an all_to_allv ('comb') and an
    elementwise op; `p2p` = (sender, receiver) exchange one send/recv pair ('p2p').
    """
    snd, rcv = p2p
    tasks = [
        {
            "id": "g0",
            "rank": 0,
            "stream": "compute",
            "kind": "gemm",
            "flops": 2.0 * 2 * 64 * 128 * 256,
            "bytes": 1000.0,
            "shape": {"m": 64, "n": 128, "k": 256, "batch": 2},
            "allocs": {"act0": 4096.0},
            "tags": {"phase": "fwd", "chunk": 0, "step": "expert"},
        },
        {
            "id": "g1",
            "rank": 1,
            "stream": "compute",
            "kind": "gemm",
            "flops": 2.0 * 64 * 128 * 256,
            "shape": {"m": 64, "n": 128, "k": 256},
        },
        {
            "id": "a0",
            "rank": 0,
            "stream": "comm",
            "kind": "all_to_all",
            "deps": ["g0"],
            "bytes": 4096.0,
            "group": [0, 1],
            "coll": "disp",
            "algo": "linear",
            "tags": {"phase": "fwd", "step": "dispatch"},
            "sms": 4,
            "host_sync": True,
        },
        {
            "id": "a1",
            "rank": 1,
            "stream": "comm",
            "kind": "all_to_all",
            "deps": ["g1"],
            "bytes": 4096.0,
            "group": [0, 1],
            "coll": "disp",
            "algo": "linear",
        },
        {
            "id": "v0",
            "rank": 0,
            "stream": "comm",
            "kind": "all_to_allv",
            "group": [0, 1],
            "coll": "comb",
            "split": [100.0, 200.0],
            "recv_split": [100.0, 300.0],
        },
        {
            "id": "v1",
            "rank": 1,
            "stream": "comm",
            "kind": "all_to_allv",
            "group": [0, 1],
            "coll": "comb",
            "split": [300.0, 400.0],
            "recv_split": [200.0, 400.0],
        },
        {
            "id": "s0",
            "rank": snd,
            "stream": "comm",
            "kind": "send",
            "peer": rcv,
            "coll": "p2p",
            "bytes": 512.0,
        },
        {
            "id": "r1",
            "rank": rcv,
            "stream": "comm",
            "kind": "recv",
            "peer": snd,
            "coll": "p2p",
            "bytes": 512.0,
        },
        {
            "id": "e0",
            "rank": 0,
            "stream": "compute",
            "kind": "elementwise",
            "deps": ["v0"],
            "bytes": 64.0,
            "frees": ["act0"],
        },
    ]
    return tasks


def _graph_dict(tasks: list[dict] | None = None, world: int = 2) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "world_size": world,
        "meta": {"strategy": "hand-built", "note": "test"},
        "tasks": _tasks() if tasks is None else tasks,
    }


def _by_id(d: dict, tid: str) -> dict:
    return next(t for t in d["tasks"] if t["id"] == tid)


def _round_trip(tmp_path, d: dict) -> None:
    g = TaskGraph.from_dict(d)
    path = tmp_path / "g.json"
    g.to_json(path)
    json.loads(path.read_text())  # plain JSON on disk
    back = TaskGraph.from_json(path)
    assert back.to_dict() == g.to_dict()
    assert back.world_size == g.world_size and back.meta == g.meta
    assert list(back.tasks) == list(g.tasks)  # program order survives
    for tid, t in g.tasks.items():
        u = back.tasks[tid]
        for name in TASK_FIELDS:
            assert getattr(u, name) == getattr(t, name), (tid, name)
    # The input dicts themselves survive too (nothing dropped or renamed).
    for raw in d["tasks"]:
        u = back.tasks[raw["id"]]
        for k, v in raw.items():
            assert getattr(u, k) == v, (raw["id"], k)


def test_fixture_sets_every_task_field():
    """Keeps the round trip honest: each Task field is non-default somewhere in the fixture."""
    defaults = Task(id="x", rank=0, stream="compute", kind="gemm")
    covered = {k for t in _tasks() for k, v in t.items() if v != getattr(defaults, k, object())}
    covered |= {"id", "rank", "stream", "kind"}
    assert covered == set(TASK_FIELDS)


def test_json_round_trip_without_rank0_peer(tmp_path):
    # Same graph on 3 ranks with the send/recv pair between ranks 1 and 2 (no peer == 0).
    _round_trip(tmp_path, _graph_dict(_tasks(p2p=(1, 2)), world=3))


def test_json_round_trip(tmp_path):
    _round_trip(tmp_path, _graph_dict())


def test_to_dict_keeps_peer_zero():
    t = Task(id="r", rank=1, stream="comm", kind="recv", peer=0, coll="p")
    assert t.to_dict().get("peer") == 0


def test_valid_graph_simulates():
    g = TaskGraph.from_dict(_graph_dict())
    topo = Topology.load("dgx-a100", nodes=1)
    res = simulate(g, topo, CostModel.build(topo, {}))
    assert res.makespan > 0
    assert all(res.end >= res.start)


# -- bad inputs ----------------------------------------------------------------------------


def _mut(fn):
    def apply():
        d = _graph_dict()
        fn(d)
        return d

    return apply


def _swap(d: dict, a: str, b: str) -> None:
    ts = d["tasks"]
    i = next(k for k, t in enumerate(ts) if t["id"] == a)
    j = next(k for k, t in enumerate(ts) if t["id"] == b)
    ts[i], ts[j] = ts[j], ts[i]


def _set(tid: str, **kw):
    return _mut(lambda d: _by_id(d, tid).update(kw))


def _drop(tid: str):
    return _mut(lambda d: d["tasks"].remove(_by_id(d, tid)))


def _add(*tasks: dict):
    return _mut(lambda d: d["tasks"].extend(copy.deepcopy(list(tasks))))


BAD = [
    (
        "duplicate_id",
        _mut(lambda d: d["tasks"].append(dict(_by_id(d, "g0")))),
        ["'g0'", "duplicate"],
    ),
    ("unknown_dep", _set("e0", deps=["ghost"]), ["'e0'", "ghost"]),
    (
        "dep_cycle",
        _add(
            {"id": "cx", "rank": 1, "stream": "compute.1", "kind": "gemm", "deps": ["cy"]},
            {"id": "cy", "rank": 1, "stream": "copy", "kind": "d2d", "deps": ["cx"]},
        ),
        ["cycle", "cx", "cy"],
    ),
    (
        "stream_order_cycle",
        _add(
            {"id": "sa", "rank": 1, "stream": "compute.2", "kind": "gemm", "deps": ["sb"]},
            {"id": "sb", "rank": 1, "stream": "compute.2", "kind": "gemm"},
        ),
        ["cycle", "sa", "sb"],
    ),
    ("opposite_collective_order", _mut(lambda d: _swap(d, "a1", "v1")), ["cycle", "disp", "comb"]),
    ("collective_missing_on_member", _drop("a1"), ["'disp'", "[1]"]),
    ("all_to_all_bytes_differ", _set("a1", bytes=8192.0), ["'disp'", "'a1'"]),
    ("recv_split_disagrees", _set("v1", recv_split=[999.0, 400.0]), ["'comb'", "'v1'"]),
    ("split_wrong_length", _set("v0", split=[100.0]), ["'v0'", "split"]),
    ("send_without_recv", _drop("r1"), ["'s0'", "'p2p'"]),
    ("send_recv_bytes_differ", _set("r1", bytes=1024.0), ["'s0'", "'r1'"]),
    ("rank_out_of_range", _set("g1", rank=2), ["'g1'", "rank 2"]),
    ("unknown_kind", _set("g0", kind="fft"), ["'g0'", "fft"]),
    ("comm_kind_on_compute_stream", _set("a0", stream="compute"), ["'a0'", "comm stream"]),
    ("unknown_stream_kind", _set("g0", stream="gpu"), ["'g0'", "gpu"]),
    (
        "schema_version",
        _mut(lambda d: d.update(schema_version=SCHEMA_VERSION + 1)),
        ["schema_version", str(SCHEMA_VERSION + 1)],
    ),
    ("unknown_task_field", _set("g0", colour="red"), ["'g0'", "colour"]),
]


@pytest.mark.parametrize("make, needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_graph_raises(make, needles):
    d = make()
    with pytest.raises(GraphError) as ei:
        TaskGraph.from_dict(d)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, (n, msg)


def test_base_graph_is_valid():
    # The mutations above start from a graph that passes validation.
    TaskGraph.from_dict(_graph_dict())


def test_non_json_file(tmp_path):
    p = tmp_path / "graph.json"
    p.write_text("this is { not json")
    with pytest.raises(GraphError, match="not valid JSON") as ei:
        TaskGraph.from_json(p)
    assert str(p) in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(GraphError, match="not found"):
        TaskGraph.from_json(tmp_path / "nope.json")


def test_runtime_deadlock_lists_blocked_tasks():
    d = _graph_dict()
    _swap(d, "a1", "v1")  # rank 1 launches 'comb' first, rank 0 launches 'disp' first
    g = TaskGraph.from_dict(d, validate=False)
    topo = Topology.load("dgx-a100", nodes=1)
    with pytest.raises(DeadlockError) as ei:
        simulate(g, topo, CostModel.build(topo, {}))
    msg = str(ei.value)
    # Both comm streams sit in a collective the other rank never launches; e0 waits for v0.
    for tid in ("a0", "v1", "e0"):
        assert tid in msg, (tid, msg)
    assert "'disp'" in msg and "'comb'" in msg
