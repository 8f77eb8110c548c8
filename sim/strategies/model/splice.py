"""The MoE layer a strategy built (layer 0 of its own graph), spliced into block b of a model.

The strategy's builder runs once, unchanged; its tasks are cut per (rank, phase) and each MoE
block gets a relabelled copy: ids, dependencies and collective ids move from layer 0 to
layer b, buffer names get the block's prefix (block b's dispatch buffer is not block c's),
tags say the block and, in the backward, each task's role (a weight-gradient GEMM is `dW`,
everything else `dX`). The phase's sources (tasks depending on nothing of the phase) wait for
the block's input; its sinks (tasks nothing of the phase waits for) are the block's output.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sim.core.graph import Task, TaskGraph

ROLE_TAG = "role"  # "dX" (input gradient) or "dW" (weight gradient) in the backward


def role(phase: str, step: str) -> str | None:
    """A backward step's role: weight-gradient GEMMs produce only a weight's gradient."""
    if phase != "bwd":
        return None
    return "dW" if step.endswith("_wgrad") else "dX"


@dataclass
class PhaseTemplate:
    """One rank's tasks of one phase of the layer, per stream in program order."""

    streams: dict[str, list[Task]] = field(default_factory=lambda: defaultdict(list))
    sources: set[str] = field(default_factory=set)
    sinks: list[str] = field(default_factory=list)


def templates(layer_graph: TaskGraph) -> dict[tuple[int, str], PhaseTemplate]:
    """(rank, phase) -> its tasks, sources and sinks."""
    out: dict[tuple[int, str], PhaseTemplate] = defaultdict(PhaseTemplate)
    phase_of: dict[str, tuple[int, str]] = {}
    for t in layer_graph:
        key = (t.rank, str(t.tags.get("phase", "fwd")))
        phase_of[t.id] = key
        out[key].streams[t.stream].append(t)
    needed: set[str] = set()
    for t in layer_graph:
        key = phase_of[t.id]
        inside = [d for d in t.deps if phase_of.get(d) == key]
        if not inside:
            out[key].sources.add(t.id)
        needed.update(inside)
    for tpl in out.values():
        for tasks in tpl.streams.values():
            tpl.sinks += [t.id for t in tasks if t.id not in needed]
    return dict(out)


def rename(s: str, b: int) -> str:
    """Layer 0's name of a task, collective or buffer, as block b's."""
    if "/L0/" in s:
        return s.replace("/L0/", f"/L{b}/", 1)
    if s.startswith("L0/"):
        return f"L{b}/" + s[3:]
    return f"L{b}:" + s


def splice(
    tpl: PhaseTemplate, b: int, inputs: list[str], streams: dict[str, list[Task]]
) -> tuple[list[str], list[str]]:
    """Append block b's copy of the phase to `streams`; returns (sink ids, dW ids)."""
    dws = []
    for stream, tasks in tpl.streams.items():
        out = streams[stream]
        for t in tasks:
            deps = [rename(d, b) for d in t.deps]
            if t.id in tpl.sources:
                deps += inputs
            tags = dict(t.tags)
            tags["layer"] = b
            r = role(str(tags.get("phase")), str(tags.get("step", "")))
            if r is not None:
                tags[ROLE_TAG] = r
            nt = Task(
                rename(t.id, b),
                t.rank,
                t.stream,
                t.kind,
                deps=deps,
                flops=t.flops,
                bytes=t.bytes,
                shape=t.shape,
                group=t.group,
                coll=None if t.coll is None else rename(t.coll, b),
                split=t.split,
                recv_split=t.recv_split,
                peer=t.peer,
                algo=t.algo,
                allocs={rename(k, b): v for k, v in t.allocs.items()},
                frees=[rename(k, b) for k in t.frees],
                tags=tags,
            )
            if r == "dW":
                dws.append(nt.id)
            out.append(nt)
    return [rename(s, b) for s in tpl.sinks], dws
