"""Host issue order (sim.core.issue): every strategy's graph launches on one hardware queue.

A rank's tasks reach its hardware queues in the order they were added to the graph; with
`costs.resources.max_connections: 1` a task issued before one it waits for blocks the queue
for good. Builders that add tasks stream by stream are re-issued in an order a host thread
could issue (`sim.strategies.build`), stream order untouched; a builder's own launchable order
is kept. One queue can only serialise, so no strategy runs faster on it. A genuine deadlock is
still reported, as its cycle of waits in a few lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sim import commands
from sim.core.errors import DeadlockError
from sim.core.graph import Task, TaskGraph
from sim.core.issue import in_issue_order, stuck
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import STRATEGIES, Cluster, build, resolve_params
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer

DEMO = Path(__file__).resolve().parents[1] / "sim" / "configs" / "demo.yaml"
TOPO = Topology.load("dgx-h100", nodes=2)
PASSES = ("fwd", "bwd")
LAYER = MoELayer(batch=1, seq_len=128, model_dim=256, hidden_dim=512, experts=16, world=16, top_k=2)
# DualPipe's devices are pipeline stages: two of them, each an EP group of 4
SMALL = MoELayer(batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=4, top_k=2)
MODEL = BlockModel(n=2, heads=4, moe_every=2, shared=1)

CASES: list[tuple[str, dict[str, Any], MoELayer, BlockModel | None]] = [
    ("sequential", {}, LAYER, None),
    ("pipelined", {"degree": 4, "order": "tutel"}, LAYER, None),
    ("pipelined", {"degree": 2, "order": "alternating"}, LAYER, None),
    ("pipelined", {"degree": 2, "order": "two_streams"}, LAYER, None),
    ("pipelined", {"degree": 2}, LAYER, MODEL),  # the model builder around the layer
    ("pipemoe", {}, LAYER, None),
    ("tutel", {}, LAYER, None),
    ("ted", {"tp": 2}, LAYER, None),
    ("fastermoe", {}, LAYER, None),
    ("mpipemoe", {}, LAYER, None),
    ("lancet", {}, LAYER, BlockModel(n=2, heads=4, moe_every=2)),  # its passes over a model
    ("parm", {"tp": 2, "schedule": "s1"}, LAYER, None),
    ("deepep", {}, LAYER, None),
    ("megatron_ep", {"micro": 2, "layers": 1, "shared": 1, "heads": 8}, LAYER, None),
    ("dualpipe", {"pp": 2, "micro": 4, "layers": 2, "shared": 0}, SMALL, None),
]


def _costs(max_connections: int) -> CostModel:
    return CostModel.build(TOPO, {"resources": {"max_connections": max_connections}})


def _id(case: tuple) -> str:
    name, params, _layer, blocks = case
    return "-".join([name, *map(str, params.values())] + (["blocks"] if blocks else []))


def _streams(g: TaskGraph) -> dict[tuple[int, str], list[str]]:
    return {k: [t.id for t in ts] for k, ts in g.streams().items()}


def test_the_cases_cover_every_strategy():
    assert {c[0] for c in CASES} == set(STRATEGIES)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_every_strategy_runs_on_one_hardware_queue(case):
    """1, 2 and 8 queues all run, one no faster than eight; the issue order keeps every
    stream's order, and a builder order a host could issue is kept as it is."""
    name, params, layer, blocks = case
    span = {}
    for mc in (8, 2, 1):
        costs = _costs(mc)
        g = build(name, layer, params, PASSES, Cluster(TOPO, costs), blocks=blocks)
        span[mc] = simulate(g, TOPO, costs).makespan  # a DeadlockError fails the test
    assert span[1] >= span[8] * (1 - 1e-9), span
    assert not stuck(list(g))
    if blocks is None and not STRATEGIES[name].builds_model:
        cluster = Cluster(TOPO, _costs(1))
        raw = STRATEGIES[name].build(layer, resolve_params(name, params), PASSES, cluster)
        assert _streams(raw) == _streams(g)  # stream order is program order
        if not stuck(list(raw)):  # the builder's own order stands
            assert [t.id for t in raw] == [t.id for t in g]


def test_a_pipelined_layer_issues_each_chunk_dispatch_expert_combine():
    """Tutel's queue order (every dispatch before any combine on one comm stream): the host
    issues the dispatches as far as the stream allows, then each expert chunk just before
    the combine that needs it."""
    g = build("pipelined", SMALL, {"degree": 2, "order": "tutel"}, ("fwd",))
    steps = [t.id.split("/", 3)[3] for t in g if t.rank == 0]
    assert steps == [
        "gate",
        "encode",
        "dispatch.0",
        "dispatch.1",
        "fc1.0",
        "fc2.0",
        "combine.0",
        "fc1.1",
        "fc2.1",
        "combine.1",
        "decode",
    ]


def test_a_builder_order_by_stream_is_what_deadlocked():
    """The layer builder adds a rank's compute stream before its comm stream: on one queue
    fc1 waits for its dispatch, queued behind it. `stuck` predicts the engine's count."""
    raw = STRATEGIES["sequential"].build(LAYER, resolve_params("sequential", {}), PASSES)
    n = len(stuck(list(raw)))
    assert n > 0
    with pytest.raises(DeadlockError, match=rf"^simulated deadlock: {n} task\(s\)"):
        simulate(raw, TOPO, _costs(1))
    assert not stuck(list(in_issue_order(raw)))


def test_the_demo_runs_on_one_hardware_queue():
    """The issue's report: the demo config with max_connections 1 deadlocked."""
    cfg = yaml.safe_load(DEMO.read_text())
    one = commands.simulate_config(
        {**cfg, "costs": {**cfg["costs"], "resources": {"max_connections": 1}}}
    )
    eight = commands.simulate_config(cfg)
    assert one.summary["makespan_s"] >= eight.summary["makespan_s"]


def _work(tid: str, rank: int, deps: list[str]) -> Task:
    return Task(tid, rank, "compute", "elementwise", deps=deps, flops=1e9, tags={"dtype": "bf16"})


def _a2a(tid: str, rank: int, stream: str, coll: str, group: list[int]) -> Task:
    return Task(tid, rank, stream, "all_to_all", bytes=1e6, group=group, coll=coll)


def _ring(k: int) -> TaskGraph:
    """k ranks in a ring, rank r issuing: collective C<r> with rank r+1 (comm), work on its
    result (compute), then C<r-1> with rank r-1 (comm.1). On one queue each rank's C<r-1>
    waits behind its work, which waits for C<r>, whose member on rank r+1 waits behind that
    rank's work: a cycle of 3k links. With a queue per stream every collective launches."""
    g = TaskGraph(k)
    for r in range(k):
        up, down = sorted((r, (r + 1) % k)), sorted(((r - 1) % k, r))
        g.add(_a2a(f"C{r}@{r}", r, "comm", f"C{r}", up))
        g.add(_work(f"y{r}", r, [f"C{r}@{r}"]))
        g.add(_a2a(f"C{(r - 1) % k}@{r}", r, "comm.1", f"C{(r - 1) % k}", down))
    g.validate()
    return g


def test_opposite_collective_orders_deadlock_one_queue_and_name_the_cycle():
    """Two ranks issue collectives A and B in opposite orders, work between them: with one
    queue each the wait-for chain closes on itself; the report is that cycle, one line per
    link. Re-issued (one collective order for both ranks), it runs."""
    g = _ring(2)
    simulate(g, TOPO, _costs(8))  # a queue per stream: no deadlock
    with pytest.raises(DeadlockError) as e:
        simulate(g, TOPO, _costs(1))
    msg = str(e.value)
    lines = msg.splitlines()
    assert lines[0].startswith("simulated deadlock: 6 task(s) can never finish")
    assert len(lines) == 1 + 6  # header, then the six links of the cycle
    for tid in ("C0@0", "C0@1", "C1@1", "C1@0", "y0", "y1"):
        assert sum(line.strip().startswith(tid + " ") for line in lines) == 1, (tid, msg)
    assert "waits behind y1 on its hardware queue (max_connections 1)" in msg
    assert "waits for ['C0@0']" in msg and "to launch all_to_all 'C1'" in msg
    assert lines[-1].endswith("a cycle")
    fixed = in_issue_order(g)
    assert _streams(fixed) == _streams(g)
    simulate(fixed, TOPO, _costs(1))


def test_a_long_cycle_is_reported_in_a_few_lines():
    g = _ring(6)  # 18 links
    with pytest.raises(DeadlockError) as e:
        simulate(g, TOPO, _costs(1))
    lines = str(e.value).splitlines()
    assert len(lines) <= 9 and len(str(e.value)) < 1200, str(e.value)
    assert any("more link(s)" in line for line in lines)
    assert lines[-1].endswith("a cycle")
