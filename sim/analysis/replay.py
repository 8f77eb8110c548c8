"""Trace replay: a measured trace becomes a task graph with measured durations, simulated.

    r = replay("out/exec/trace.csv", graph="g.json")       # moesim executor trace + its graph
    r = replay("out/exec/trace.csv")                       # structure inferred from the trace
    r = replay(["rank0.json.gz", "rank1.json.gz"])         # PyTorch profiler (Kineto), per rank
    r.summary["makespan_s"], r.summary["replay"]["error"]  # vs the measured step
    r.summary["replay"]["start_skew_s"]                    # left out of the step

Every task gets its measured time (sim.hardware.costs.measured): `measured_s`, the operation
(for communication: from the last member's launch to its end, i.e. the measured duration less
the wait for peers), and `gap_s`, from the moment it was ready (stream predecessor and
dependencies done, in the measurement) to its start. The engine adds the waits itself, from
the graph's dependencies and collective rendezvous, so replayed unedited every task ends when
it ended in the measurement (on the ranks' aligned clock, below) and the step is reproduced
(to float rounding). What-ifs
(sim.analysis.whatif) then change the measured times or the hardware under them.

Ranks rarely start together: processes are launched, and profilers started, apart. The
replay measures the step, not that skew: the ranks are aligned at their first common
collective (every rank a member), each rank's way there replayed from its own start (its
first task; in a profiler trace, the first op in its step), so the first rank no longer waits
there for the others' later start, only for their slower way there. `measured_step_s` is the
measured step so aligned (what an unedited replay reproduces, and `error` compares to),
`start_skew_s` the skew left out of it (`rank_start_skew_s` per rank), `measured_makespan_s`
the files' whole span, skew included. Without a common collective (one rank) nothing moves.

Replays run on `localhost-cpu` by default (one rank per node; only its size matters while
every task is measured), collective-level communication, no interference, no jitter, no
dispatch latency: the measurement has all of those in it already.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.summary import summarize
from sim.analysis.trace import to_frame, write_trace_files
from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.core.io import OutputSet
from sim.core.kinds import COMM_KINDS
from sim.engine.engine import SimResult, simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.dispatch import Dispatch
from sim.hardware.costs.interference import Interference
from sim.hardware.costs.measured import GAP_TAG, MEASURED_TAG
from sim.hardware.topology import Topology

LAUNCH_TAG = "launch_s"  # a task's own measured launch gap, for presenting its start

DEFAULT_TOPOLOGY = "localhost-cpu"


@dataclass
class Replay:
    graph: TaskGraph  # with measured times in its tasks' tags
    trace: pd.DataFrame  # the replayed trace
    summary: dict[str, Any]  # sim.analysis.summary's, plus "replay": the comparison
    result: SimResult


def import_trace(
    source: str | Path | list[str | Path], graph: str | Path | None = None
) -> tuple[TaskGraph, dict[str, Any]]:
    """The replay graph of a trace (measured times in its tags) and what the import saw."""
    from sim.analysis.importers import load

    g, times, fmt = load(source, graph)
    info = attach_times(g, times)
    info["format"] = fmt
    info["source"] = [str(s) for s in source] if isinstance(source, list) else str(source)
    world, present = g.meta.get("world_size_recorded"), g.meta.get("ranks_recorded")
    if isinstance(world, int) and present and len(present) < world:
        info["note"] = (
            f"rank(s) {present} of a world of {world}: the other ranks' files not given, "
            "collectives replay on these ranks alone with their waits for the others as measured"
        )
    g.meta = {**g.meta, "replay": info}
    return g, info


def replay(
    source: str | Path | list[str | Path],
    graph: str | Path | None = None,
    topology: str | None = None,
) -> Replay:
    """Import a measured trace and replay it unedited."""
    g, info = import_trace(source, graph)
    res = run_graph(g, replay_costs_topology(g, topology))
    return _result(g, res, info)


def replay_graph(graph: TaskGraph, topology: str | None = None) -> Replay:
    """Replay a graph that already carries measured times (from import_trace)."""
    info = dict(graph.meta.get("replay") or {})
    res = run_graph(graph, replay_costs_topology(graph, topology))
    return _result(graph, res, info)


def _result(g: TaskGraph, res: SimResult, info: dict[str, Any]) -> Replay:
    df = launched(to_frame(res), g)
    summary = summarize(res, df)
    measured = info.get("measured_step_s", info.get("measured_makespan_s"))
    if measured:
        info = {**info, "error": (res.makespan - measured) / measured}
    summary["replay"] = info
    return Replay(g, df, summary, res)


def launched(df: pd.DataFrame, graph: TaskGraph) -> pd.DataFrame:
    """The trace with each measured task starting at its launch, as measured: the engine
    starts a task when it is ready and counts its launch gap into its time; moved by the
    task's own measured gap (`launch_s`), rows compare one to one with the measurement
    (busy time, sync wait)."""
    timed = [t for t in graph if LAUNCH_TAG in t.tags]
    shift = df["id"].map({t.id: float(t.tags[LAUNCH_TAG]) for t in timed}).fillna(0.0)
    shift = shift.clip(upper=df["duration"].clip(lower=0.0))
    # the engine's rendezvous is the last member's ready time; its launch came `gap_s` later
    last = (
        df["id"]
        .map({t.id: float(t.tags.get(GAP_TAG, 0.0)) for t in timed if t.kind in COMM_KINDS})
        .fillna(0.0)
    )
    df = df.copy()
    df["start"] = df["start"] + shift
    df["duration"] = df["end"] - df["start"]
    wait = (df["sync_wait"] - shift + last).clip(lower=0.0)
    df["sync_wait"] = wait.where(df["kind"].isin(COMM_KINDS), 0.0).clip(upper=df["duration"])
    return df


def attach_times(graph: TaskGraph, times: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Tag every task with its measured time and launch gap (see the module docstring);
    returns the measured makespan and how many tasks and ranks were timed."""
    missing = [t for t in graph.tasks if t not in times]
    if missing:
        raise ConfigError(f"trace: no times for task {missing[0]!r} ({len(missing)} such)")
    origin = min(times[t][0] for t in graph.tasks)
    prev: dict[str, str] = {}
    for seq in graph.streams().values():
        for a, b in zip(seq, seq[1:]):
            prev[b.id] = a.id
    after: dict[str, float] = {}  # what a task waited for ended: its ready time, if any
    for t in graph:  # any order: the ready time needs only measured ends
        ends = [times[d][1] for d in t.deps]
        if t.id in prev:
            ends.append(times[prev[t.id]][1])
        if ends:
            after[t.id] = max(ends)
    members: dict[str, list[str]] = defaultdict(list)
    for t in graph:
        if t.kind in COMM_KINDS:
            members[t.coll].append(t.id)  # type: ignore[index]
    align = _align(graph, times, after, members)
    ready: dict[str, float] = {}
    for t in graph:
        if t.id in after:
            ready[t.id] = max(origin, after[t.id])
        elif align is not None and times[t.id][0] < align["at_s"]:
            ready[t.id] = align["starts"][t.rank]  # its rank's start: skew left out
        else:
            ready[t.id] = align["origin_s"] if align is not None else origin
    for t in graph:
        start, end = times[t.id]
        if t.kind in COMM_KINDS:
            ms = members[t.coll]  # type: ignore[index]
            r = max(ready[m] for m in ms)  # the rendezvous, in the measurement
            launch = max(max(times[m][0] for m in ms) - r, 0.0)  # last member's launch gap
        else:
            r = ready[t.id]
            launch = max(start - r, 0.0)
        total = max(end - r, 0.0)
        gap = min(launch, total)
        t.tags[MEASURED_TAG] = total - gap
        t.tags[GAP_TAG] = gap
        t.tags[LAUNCH_TAG] = min(max(start - ready[t.id], 0.0), max(end - ready[t.id], 0.0))
    end = max(times[t][1] for t in graph.tasks)
    step_origin = align["origin_s"] if align is not None else origin
    out: dict[str, Any] = {
        "measured_makespan_s": end - origin,
        "measured_step_s": end - step_origin,
        "start_skew_s": step_origin - origin,
        "tasks": len(graph),
        "ranks": len({t.rank for t in graph}),
    }
    if align is not None:
        out["aligned_at"] = align["at"]
        out["rank_start_skew_s"] = {
            str(r): max(step_origin - s, 0.0) for r, s in sorted(align["starts"].items())
        }
    return out


def _align(
    graph: TaskGraph,
    times: dict[str, tuple[float, float]],
    after: dict[str, float],
    members: dict[str, list[str]],
) -> dict[str, Any] | None:
    """Where the ranks' clocks of work meet: at their first common collective (every rank a
    member; the earliest rendezvous), each rank's run up to it measured from the rank's own
    start (its first task: in a profiler trace, the first op of its step). Ranks that
    started apart (processes launched, or the profiler started, at different times) reach
    the collective together in the replay after as long as each took to get there: the
    first rank waits only for the others' slower way there, not for their later start.

    Returns None without a common collective (one rank, or none recorded): no alignment.
    Else: `starts` (rank -> its first task's start), `at_s` (the collective's measured
    rendezvous: later tasks keep the common clock), `origin_s` (where the aligned step
    begins on the common clock) and `at` (the collective's first member, for the summary)."""
    ranks = sorted({t.rank for t in graph})
    if len(ranks) < 2:
        return None
    starts: dict[int, float] = {}
    for t in graph:
        s = times[t.id][0]
        starts[t.rank] = min(starts.get(t.rank, s), s)
    best: tuple[float, str, dict[int, float]] | None = None
    for ms in members.values():
        if sorted({graph.tasks[m].rank for m in ms}) != ranks or len(ms) != len(ranks):
            continue
        # each member's ready time: after what it waited for, at the earliest its rank's start
        got = {
            graph.tasks[m].rank: max(
                after.get(m, starts[graph.tasks[m].rank]), starts[graph.tasks[m].rank]
            )
            for m in ms
        }
        r = max(got.values())
        if best is None or r < best[0]:
            best = (r, min(ms), got)
    if best is None:
        return None
    r, first, got = best
    lead = max(got[k] - starts[k] for k in ranks)  # the slowest rank's way to the collective
    return {"starts": starts, "at_s": r, "origin_s": r - lead, "at": first}


def replay_costs_topology(graph: TaskGraph, topology: str | None) -> tuple[Topology, CostModel]:
    """The topology a replay runs on (just big enough for the graph's ranks) and its costs:
    collective-level communication, nothing added that the measurement already holds."""
    name = topology or DEFAULT_TOPOLOGY
    per_node = Topology.load(name, nodes=1).gpus_per_node
    topo = Topology.load(name, nodes=-(-graph.world_size // per_node))
    return topo, replay_costs(topo)


def replay_costs(topo: Topology, spec: dict[str, Any] | None = None) -> CostModel:
    costs = CostModel.build(topo, {"network": "collective", **(spec or {})})
    trivial = Interference.from_table({})
    return replace(costs, interference=trivial, dispatch=Dispatch(), jitter=None)


def run_graph(graph: TaskGraph, topo_costs: tuple[Topology, CostModel]) -> SimResult:
    topo, costs = topo_costs
    return simulate(graph, topo, costs)


def write_outputs(r: Replay, out: str | Path) -> dict[str, str]:
    """trace.csv, trace.chrome.json, graph.json (the replay graph: `moesim simulate` or
    `moesim whatif` take it) and summary.json, as one output set under `out`."""
    with OutputSet(out, "replay") as oset:
        files = write_trace_files(oset, r.trace, r.graph, r.result)
        r.graph.to_json(oset.path("graph.json"))
        files["graph"] = str(oset.final("graph.json"))
        files["summary"] = str(oset.final("summary.json"))
        r.summary["files"] = files
        oset.write_text("summary.json", json.dumps(r.summary, indent=2, default=str))
    return files


def replay_command(
    trace: str | list[str],
    graph: str | None = None,
    topology: str | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    """`moesim replay TRACE... [--graph G] [--topology T] [--out DIR]`: the summary (with
    "replay": measured step and makespan, start skew, relative error, format, inferred
    waits)."""
    if out is not None:  # an unusable --out fails before the replay, not after it
        from sim.core.io import check_output_dir

        check_output_dir(out, "--out")
    src: Any = trace[0] if isinstance(trace, list) and len(trace) == 1 else trace
    r = replay(src, graph, topology)
    if out is not None:
        write_outputs(r, out)
    return r.summary


def format_replay(s: dict[str, Any]) -> str:
    rep = s.get("replay", {})
    m = rep.get("measured_step_s", rep.get("measured_makespan_s"))
    lines = [
        f"replayed {rep.get('tasks')} measured tasks on {rep.get('ranks')} rank(s) "
        f"({rep.get('format')}, {s['topology']})",
        f"  step (replayed)      {s['makespan_s'] * 1e3:10.3f} ms",
    ]
    if m:
        lines.append(
            f"  step (measured)      {m * 1e3:10.3f} ms   error {rep.get('error', 0.0):+.3%}"
        )
    if rep.get("aligned_at"):
        lines.append(
            f"  start skew           {rep.get('start_skew_s', 0.0) * 1e3:10.3f} ms (left out: "
            f"ranks aligned at their first common collective, {rep['aligned_at']})"
        )
    if rep.get("note"):
        lines.append(f"  note: {rep['note']}")
    lines.append(f"  exposed comm         {s['exposed_comm_s'] * 1e3:10.3f} ms (mean over ranks)")
    for stream, t in sorted(s["busy_s"].items()):
        lines.append(f"  busy {stream:15s} {t * 1e3:10.3f} ms")
    for name, path in s.get("files", {}).items():
        lines.append(f"  wrote {name:13s} {path}")
    return "\n".join(lines)
