"""The host launch thread as a serial resource (`sim.engine.launch`): closed forms of its
degenerate cases, its default (inactive), its errors and `Task.host_sync`'s schema."""

from __future__ import annotations

import math

import pytest

from sim.core.errors import ConfigError, DeadlockError, GraphError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import Engine, simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

TOPO = Topology.load("dgx-h100", nodes=1)
L = 5e-6


def _run(tasks: list[Task], spec: dict | None = None, world: int = 1) -> dict:
    g = TaskGraph(world)
    for t in tasks:
        g.add(t)
    r = simulate(g, TOPO, CostModel.build(TOPO, spec or {}))
    return {t.id: (float(r.start[i]), float(r.end[i])) for i, t in enumerate(g)}


def _work(tid: str, stream: str = "compute", flops: float = 1e9, **kw) -> Task:
    return Task(tid, 0, stream, "elementwise", flops=flops, tags={"dtype": "bf16"}, **kw)


def _spread(n: int) -> list[Task]:
    """n independent tasks, one per stream (no more streams than hardware queues)."""
    return [_work(f"t{j}", "compute" if j == 0 else f"compute.{j}") for j in range(n)]


def test_independent_tasks_start_one_launch_apart():
    times = _run(_spread(4), {"resources": {"launch_s": L}})
    for j in range(4):
        assert times[f"t{j}"][0] == pytest.approx(j * L, abs=1e-15)


def test_launches_on_one_stream_overlap_with_running_kernels():
    """A stream's next kernel is issued while the previous one runs: a kernel longer than L
    hides the launch cost entirely."""
    times = _run([_work("a", flops=1e12), _work("b", flops=1e12)], {"resources": {"launch_s": L}})
    assert times["a"][1] - times["a"][0] > L
    assert times["b"][0] == pytest.approx(times["a"][1])


@pytest.mark.parametrize("launch_s", [0.0, L])
def test_host_sync_delays_the_issue_of_every_later_task_to_its_end(launch_s):
    sync = _work("sync", host_sync=True)
    later = [_work("x", "compute.1", flops=1e6), _work("y", "compute.2", flops=1e6)]
    times = _run([sync, *later], {"resources": {"launch_s": launch_s}})
    d = times["sync"][1]
    assert times["sync"][0] == 0.0
    assert d > launch_s  # the sync outlasts one launch, so the thread waits for it
    assert times["x"][0] == pytest.approx(d)
    assert times["y"][0] == pytest.approx(d + launch_s)


def test_host_sync_holds_only_its_own_rank():
    a = Task("a", 0, "compute", "elementwise", flops=1e9, tags={"dtype": "bf16"}, host_sync=True)
    b = Task("b", 0, "compute.1", "elementwise", flops=1e6, tags={"dtype": "bf16"})
    c = Task("c", 1, "compute", "elementwise", flops=1e6, tags={"dtype": "bf16"})
    times = _run([a, b, c], world=2)
    assert times["b"][0] == pytest.approx(times["a"][1])
    assert times["c"][0] == 0.0


def test_default_is_inactive_and_unchanged():
    tasks = [*_spread(3), _work("z", deps=["t1"])]
    g = TaskGraph(1)
    for t in tasks:
        g.add(t)
    assert Engine(g, TOPO, CostModel.build(TOPO, {})).launch is None
    assert CostModel.build(TOPO, {}).resources.launch_s == 0.0
    plain = _run(tasks)
    assert _run(tasks, {"resources": {"launch_s": 0.0}}) == plain
    assert plain["t2"][0] == 0.0


def test_a_host_sync_that_waits_on_a_later_launch_is_a_deadlock_naming_it():
    """The host waits on `s`, which waits on `y`, which the host launches only after `s`."""
    s = _work("s", deps=["y"], host_sync=True)
    y = _work("y", "compute.1")
    with pytest.raises(DeadlockError, match=r"y \(rank 0, compute.1\).*host sync s") as e:
        _run([s, y])
    assert "s (rank 0, compute): waits for ['y']" in str(e.value)


def test_launch_cost_per_kind_spaces_the_issues_by_each_tasks_own_cost():
    """costs.launch names a kind's host cost; the others cost resources.launch_s: independent
    tasks start at the running sum of their predecessors' costs, in issue order."""
    tasks = [
        Task("a", 0, "comm", "all_to_all", bytes=8.0, group=[0]),
        _work("b", "compute.1"),
        _work("c", "compute.2"),
    ]
    times = _run(tasks, {"launch": {"all_to_all": 40e-6}, "resources": {"launch_s": L}})
    assert [times[k][0] for k in "abc"] == pytest.approx([0.0, 40e-6, 40e-6 + L], abs=1e-15)


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"nope": 1e-6}, "costs.launch.nope"),
        ({"gemm": -1e-6}, "costs.launch.gemm"),
        (3, "costs.launch"),
    ],
)
def test_bad_launch_per_kind_is_a_one_line_error(bad, where):
    with pytest.raises(ConfigError, match=where) as e:
        CostModel.build(TOPO, {"launch": bad})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [-1e-6, math.inf, math.nan, "5us", True, 2.0])
def test_bad_launch_s_is_a_one_line_error(bad):
    with pytest.raises(ConfigError, match=r"costs\.resources\.launch_s") as e:
        CostModel.build(TOPO, {"resources": {"launch_s": bad}})
    assert "\n" not in str(e.value)


def test_bad_launch_s_in_a_run_config_names_the_field():
    from pydantic import ValidationError

    from sim.config.run_schema import CostsSpec

    with pytest.raises(ValidationError, match="launch_s"):
        CostsSpec.model_validate({"resources": {"launch_s": -1.0}})


def _graph(task: dict) -> dict:
    return {"schema_version": 1, "world_size": 1, "tasks": [task]}


def test_host_sync_round_trips_and_defaults_away():
    t = Task("c", 0, "copy", "d2h", bytes=8.0, host_sync=True)
    assert t.to_dict()["host_sync"] is True
    assert "host_sync" not in Task("c", 0, "copy", "d2h", bytes=8.0).to_dict()
    assert TaskGraph.from_dict(_graph(t.to_dict())).tasks["c"].host_sync is True


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_bad_host_sync_is_a_one_line_error(bad):
    task = {"id": "c", "rank": 0, "stream": "copy", "kind": "d2h", "bytes": 8.0, "host_sync": bad}
    with pytest.raises(GraphError, match="host_sync") as e:
        TaskGraph.from_dict(_graph(task))
    assert "\n" not in str(e.value)
