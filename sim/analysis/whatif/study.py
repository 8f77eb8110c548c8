"""What-if studies: one base, some changes (`--set KEY=VALUE`), simulated before and after.

    r = whatif("my.yaml", ["link.*.bw=*2"])  # r.before, r.after, r.before_trace, ...
    whatif("g.json", ["compute.speed=*0.5"], topology="dgx-a100")
    whatif("traces/exec-gloo-2r", ["compute.speed=*2"])      # a measured trace, replayed

The base is a run config (YAML path, mapping or RunConfig), a task graph (JSON path or
TaskGraph; it needs a topology) or a measured trace (anything sim.analysis.replay imports, or
a replay graph). Keys (sim.analysis.whatif.keys): topology, nodes, a link class's bandwidth or
latency (`link.nvlink3.bw=*2`, `link.*.latency=1e-6`), compute speed (`compute.speed=*0.5`:
every compute task twice as long; `host.speed` for a measured trace's host ops), the layer
(`model.capacity_factor=1.5`, `model.routing.s=1.5`: Zipf skew, switching a uniform routing to
Zipf), the strategy and its parameters (`strategy=pipelined`, `strategy.degree=4`) and cost
options (`costs.network=collective`).

On a measured trace the measured times stay where nothing changes them: `compute.speed`
scales the device's compute tasks' measured times (GPU kernels; not their launch gaps), and
only those: the host's CPU ops (the framework's ops, kernel launches, the optimizer's Python)
keep their measured times unless `host.speed` is given, which scales those (a trace with no
GPU work, a CPU run, computes on the host: there both keys scale the host's ops, said in a
note). A what-if on one rank's file of a larger world (`distributedInfo.world_size`) cannot
move the communication it waited in: communication keys are refused there, compute keys
noted. A link bandwidth scales a
communication task's measured time by how much its bottleneck (the slowest link between its
members) speeds up, i.e. assumes it was bandwidth-bound; `topology`, `nodes` or `costs.*`
re-model the communication on that cluster (flows over its links) and keep the measured
compute. Latency changes need a model: they apply after `topology=` only.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

import sim.analysis.whatif.keys as keys
from sim.analysis.replay import (
    DEFAULT_TOPOLOGY,
    LAUNCH_TAG,
    import_trace,
    launched,
    replay_costs,
    replay_costs_topology,
)
from sim.analysis.summary import summarize, work_note
from sim.analysis.trace import to_frame
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.core.kinds import COMM_KINDS, COMPUTE_KINDS, COPY_KINDS
from sim.engine.engine import SimResult, simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.dispatch import Dispatch
from sim.hardware.costs.interference import Interference
from sim.hardware.costs.measured import GAP_TAG, MEASURED_TAG, MeasuredCompute, ScaledCompute
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build

Run = tuple[dict[str, Any], pd.DataFrame, SimResult]


class WhatIf(NamedTuple):
    before: dict[str, Any]  # summaries as sim.analysis.summary gives them
    after: dict[str, Any]  # ... plus "whatif": the changes and notes
    before_trace: pd.DataFrame
    after_trace: pd.DataFrame
    before_sim: SimResult | None = None  # the simulations (graph, topology, link bytes, ...)
    after_sim: SimResult | None = None


def whatif(
    base: Any,
    sets: list[str],
    topology: str | None = None,
    nodes: int | None = None,
    costs: dict[str, Any] | None = None,
) -> WhatIf:
    """Simulate `base` as it is and with `sets` applied. `topology`, `nodes` and `costs`
    describe the cluster of a graph or trace base (a run config names its own)."""
    changes = keys.parse(sets)
    notes: list[str] = []
    if nodes is not None and nodes < 1:  # 0 would read as "just enough nodes"
        raise ConfigError(f"--nodes: expected a positive integer, got {nodes}")
    kind, obj = load_base(base)
    if kind == "config":
        if topology or nodes is not None or costs:
            raise ConfigError("a run config names its cluster: use --set topology=/nodes= instead")
        (b, bt, bs), (a, at, as_) = _config(obj, changes, notes)
    elif kind == "replay":
        (b, bt, bs), (a, at, as_) = _replayed(obj, changes, topology, costs, notes)
    else:
        (b, bt, bs), (a, at, as_) = _graph(obj, changes, topology, nodes, costs, notes)
    work = work_note([b, a], ["before", "after"])  # e.g. a skew that drops tokens
    if work:
        notes.append(work.removeprefix("note: "))
    a["whatif"] = {"changes": [f"{c.key}={c.text}" for c in changes], "notes": notes}
    return WhatIf(b, a, bt, at, bs, as_)


def load_base(base: Any) -> tuple[str, Any]:
    """("config", RunConfig) | ("graph", TaskGraph) | ("replay", TaskGraph with times)."""
    if isinstance(base, RunConfig):
        return "config", base
    if isinstance(base, TaskGraph):
        return _graph_kind(base)
    if isinstance(base, dict):
        if "tasks" in base and "schema_version" in base:
            return _graph_kind(TaskGraph.from_dict(base))
        return "config", RunConfig.from_dict(base)
    if isinstance(base, (list, tuple)):
        return "replay", import_trace(list(base))[0]
    p = Path(base)
    if p.suffix in (".yaml", ".yml"):
        return "config", RunConfig.load(p)
    if p.suffix == ".json" and p.is_file():
        try:
            doc = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            doc = None  # the importer says what is wrong with it
        if isinstance(doc, dict) and "tasks" in doc and "schema_version" in doc:
            return _graph_kind(TaskGraph.from_dict(doc))
    return "replay", import_trace(p)[0]


def _graph_kind(g: TaskGraph) -> tuple[str, TaskGraph]:
    return ("replay" if any(MEASURED_TAG in t.tags for t in g) else "graph"), g


# -- run configs ---------------------------------------------------------------------------
def _config(cfg: RunConfig, changes: list[keys.Change], notes: list[str]) -> tuple[Run, Run]:
    # the changes first: a bad value fails before the base's simulation, not after it
    applied = keys.apply(cfg, changes, notes)
    after = RunConfig.from_dict(applied.raw, source=f"{cfg.source} with --set")
    before = _run_config(cfg, [], 1.0)
    if applied.links and after.costs.get("network") == "collective":
        notes.append("costs.network is collective: link changes do not enter alpha-beta costs")
    return before, _run_config(after, applied.links, applied.speed)


def _run_config(cfg: RunConfig, links: list[keys.Change], speed: float) -> Run:
    topo = with_links(cfg.load_topology(), links)
    costs = with_speed(CostModel.build(topo, cfg.costs), speed)
    wl = cfg.workload(topo)
    graph = build(
        cfg.strategy, wl.layer, wl.params, cfg.passes, Cluster(topo, costs), layout=wl.layout
    )
    res = simulate(graph, topo, costs)
    df = to_frame(res)
    return summarize(res, df), df, res


def with_links(topo: Topology, links: list[keys.Change]) -> Topology:
    """`topo` with the link classes' bandwidth / latency changed (`*` = every class)."""
    if not links:
        return topo
    spec = copy.deepcopy(topo.spec)
    classes = spec["link_classes"]
    for c in links:
        _, cls, field = c.key.split(".")
        if cls != "*" and cls not in classes:
            raise ConfigError(
                f"{c.where} {c.key}: topology {topo.name} has no link class {cls!r} "
                f"(it has: {', '.join(sorted(classes))}; or link.*.{field} for all)"
            )
        for name in list(classes) if cls == "*" else [cls]:
            classes[name][field] = float(c.number(float(classes[name].get(field, 0.0))))
    return Topology(spec, nodes=topo.nodes, source=topo.source)


def with_speed(costs: CostModel, speed: float) -> CostModel:
    if speed == 1.0:
        return costs
    inner = costs.compute.inner if isinstance(costs.compute, MeasuredCompute) else costs.compute
    return replace(costs, compute=MeasuredCompute(ScaledCompute(inner, speed)))


# -- task graphs ---------------------------------------------------------------------------
CLUSTER_KEYS = ("topology", "nodes", "link.", "compute.speed", "host.speed", "costs.")


def _cluster_changes(changes: list[keys.Change], what: str) -> None:
    for c in changes:
        if not c.key.startswith(CLUSTER_KEYS):
            raise ConfigError(
                f"--set {c.key}: needs a run config base; on {what} only the cluster changes "
                "(topology, nodes, link.<class>.bw/latency, compute.speed, costs.<field>)"
            )


def _graph(
    g: TaskGraph,
    changes: list[keys.Change],
    topology: str | None,
    nodes: int | None,
    costs: dict[str, Any] | None,
    notes: list[str],
) -> tuple[Run, Run]:
    _cluster_changes(changes, "a task graph")
    for c in changes:
        if c.key == "host.speed":
            raise ConfigError(
                "--set host.speed: scales the host's (CPU) ops of a measured trace; a task "
                "graph has none measured (compute.speed scales its compute)"
            )
    if topology is None:
        raise ConfigError("a task-graph base needs its cluster: give a topology (--topology)")
    name, n, spec, links, speed = _cluster_after(changes, topology, nodes, costs, g)
    before = _run_graph(g, topology, nodes, dict(costs or {}), [], 1.0)  # after the checks
    return before, _run_graph(g, name, n, spec, links, speed)


def _cluster_after(changes, topology, nodes, costs, g):
    name, n, spec, links, speed = topology, nodes, dict(costs or {}), [], 1.0
    for c in changes:
        if c.key == "topology":
            name = str(c.value)
        elif c.key == "nodes":
            n = c.nodes(n or _enough(name, g.world_size))
        elif c.key.startswith("costs."):
            spec = keys.set_cost(spec, c)
        elif c.key.startswith("link."):
            links.append(c)
        elif c.key == "compute.speed":
            speed = c.speed()
    return name, n, spec, links, speed


def _enough(name: str, world: int) -> int:
    """Just enough nodes of topology `name` for `world` ranks."""
    return -(-world // Topology.load(name, nodes=1).gpus_per_node)


def _run_graph(g, name, nodes, spec, links, speed) -> Run:
    topo = with_links(Topology.load(name, nodes=nodes or _enough(name, g.world_size)), links)
    costs = with_speed(CostModel.build(topo, spec), speed)
    res = simulate(g, topo, costs)
    df = to_frame(res)
    return summarize(res, df), df, res


# -- measured traces -----------------------------------------------------------------------
def _replayed(
    g: TaskGraph,
    changes: list[keys.Change],
    topology: str | None,
    costs: dict[str, Any] | None,
    notes: list[str],
) -> tuple[Run, Run]:
    _cluster_changes(changes, "a measured trace")
    _whole_world(g, changes, notes)
    topo, rc = replay_costs_topology(g, topology)
    name, n, spec, links, speed = _cluster_after(
        changes, topology or DEFAULT_TOPOLOGY, None, costs, g
    )
    host = 1.0
    for c in changes:
        if c.key == "host.speed":
            host *= c.speed()
    before = _run_measured(g, topo, rc)  # after the changes are checked
    after = copy.deepcopy(g)
    _scale_compute(after, speed, host, notes)
    remodel = any(c.key in ("topology", "nodes") or c.key.startswith("costs.") for c in changes)
    if remodel:
        for t in after:  # communication and copies: the new cluster's model
            if t.kind in COMM_KINDS or t.kind in ("d2h", "h2d"):
                for tag in (MEASURED_TAG, GAP_TAG, LAUNCH_TAG):
                    t.tags.pop(tag, None)
        new = with_links(Topology.load(name, nodes=n or _enough(name, g.world_size)), links)
        cost = replace(
            CostModel.build(new, spec),
            interference=Interference.from_table({}),
            dispatch=Dispatch(),
            jitter=None,
        )
        notes.append(f"communication re-modelled on {new.name} ({cost.network}); compute measured")
        return before, _run_measured(after, new, cost)
    if any(c.key.endswith(".latency") for c in links):
        raise ConfigError(
            "--set link.<class>.latency: a measured communication time has no latency part "
            "to change; re-model the communication with --set topology=... first"
        )
    new = with_links(topo, links)
    if links:
        _scale_comm(after, topo, new)
        notes.append("measured communication scaled by its bottleneck link (bandwidth-bound)")
    return before, _run_measured(after, new, replay_costs(new))


def _scale_compute(g: TaskGraph, speed: float, host: float, notes: list[str]) -> None:
    """Measured compute times over `speed` (the device's: tasks not tagged as the host's)
    and the host's ops' over `host`; where the trace has no device compute, the host
    computes and `speed` applies to it too."""
    if speed == 1.0 and host == 1.0:
        return
    timed = [t for t in g if MEASURED_TAG in t.tags and t.kind not in COMM_KINDS]
    on_host = [t for t in timed if t.tags.get("side") == "host"]
    on_device = [t for t in timed if t.tags.get("side") != "host" and t.kind in COMPUTE_KINDS]
    if speed != 1.0 and on_host and not on_device:
        notes.append(
            "no device (GPU) work in the trace: the host computes, compute.speed scales its ops"
        )
        host, speed = host * speed, 1.0
    elif speed != 1.0 and on_host:
        notes.append(
            f"compute.speed scales the {len(on_device)} device ops; the host's "
            f"{len(on_host)} CPU ops keep their measured times (host.speed scales those)"
        )
    for t in on_device:
        t.tags[MEASURED_TAG] /= speed
    for t in on_host:
        t.tags[MEASURED_TAG] /= host
    if host != 1.0 and not on_host:
        notes.append("host.speed: the trace has no host ops apart from the device's work")


COMM_CHANGES = ("topology", "nodes", "link.", "costs.")


def _whole_world(g: TaskGraph, changes: list[keys.Change], notes: list[str]) -> None:
    """A what-if on some ranks of a larger world: what needs the others is refused, the
    rest noted (their collectives replay on the ranks present, the waits for the others
    measured in)."""
    info = (g.meta.get("replay") or {}) if isinstance(g.meta, dict) else {}
    world = g.meta.get("world_size_recorded") if isinstance(g.meta, dict) else None
    present = sorted({t.rank for t in g})
    if not isinstance(world, int) or len(present) >= world:
        return
    src = info.get("source") or "the trace"
    what = f"{src}: rank(s) {present} of a world of {world}"
    comm = [c for c in changes if c.key.startswith(COMM_CHANGES)]
    if comm:
        raise ConfigError(
            f"--set {comm[0].key}: {what}; a communication what-if needs every rank's file "
            "(the collectives' other members), give them all"
        )
    notes.append(
        f"{what}: the other ranks are not in the trace; its collectives' waits for them stay "
        "as measured"
    )


def _run_measured(g: TaskGraph, topo: Topology, costs: CostModel) -> Run:
    res = simulate(g, topo, costs)
    df = launched(to_frame(res), g)
    return summarize(res, df), df, res


def _scale_comm(g: TaskGraph, old: Topology, new: Topology) -> None:
    """Each measured communication (and host copy) time times old / new bottleneck
    bandwidth between its members (for copies: on its host route)."""
    cache: dict[tuple, float] = {}

    def ratio(members: tuple[int, ...], copy_kind: str | None = None) -> float:
        key = (members, copy_kind)
        if key not in cache:
            caps = []
            for topo in (old, new):
                if copy_kind:
                    routes = [topo.host_route(members[0], to_host=copy_kind == "d2h")]
                else:
                    routes = [topo.route(a, b) for a in members for b in members if a != b]
                caps.append(min((float(topo.link_cap[r].min()) for r in routes if r), default=0))
            cache[key] = caps[0] / caps[1] if caps[0] > 0 and caps[1] > 0 else 1.0
        return cache[key]

    for t in g:
        if MEASURED_TAG not in t.tags:
            continue
        if t.kind in COMM_KINDS:
            members = tuple(t.group or ()) if t.kind not in ("send", "recv") else (t.rank, t.peer)
            t.tags[MEASURED_TAG] *= ratio(members)  # type: ignore[arg-type]
        elif t.kind in COPY_KINDS and t.kind != "d2d":
            t.tags[MEASURED_TAG] *= ratio((t.rank,), t.kind)
