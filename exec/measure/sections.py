"""Benchmark graphs run as one launch: chained back to back (a process start per rank
measures them all), with where they ran and the host's time per issued task."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from exec.measure.timings import issue_rows
from exec.runtime.launch import ExecResult, assemble, call_ranks
from sim.core.graph import TaskGraph


def chain(sections: dict[str, TaskGraph]) -> TaskGraph:
    """The benchmarks one after the other in one graph, so that one launch (a process start
    per rank) measures them all: ids, collectives and buffers are prefixed by the section's
    name, and each section's first task on a rank waits for the previous section's last one
    there (each runs alone, as in its own graph)."""
    out: TaskGraph | None = None
    last: dict[int, str] = {}
    for name, g in sections.items():
        if out is None:
            out = TaskGraph(g.world_size, meta={"benchmark": "+".join(sections)})
        ends: dict[int, str] = {}
        for t in g:
            deps = [f"{name}:{d}" for d in t.deps]
            if t.rank in last and t.rank not in ends:
                deps.append(last[t.rank])  # the first of this section on its rank
            tid = f"{name}:{t.id}"
            out.add(
                replace(
                    t,
                    id=tid,
                    deps=deps,
                    coll=None if t.coll is None else f"{name}:{t.coll}",
                    allocs={f"{name}:{k}": v for k, v in t.allocs.items()},
                    frees=[f"{name}:{k}" for k in t.frees],
                )
            )
            ends[t.rank] = tid
        last = {**last, **ends}
    assert out is not None
    out.validate()
    return out


def _job(rank: int, world: int, graph: TaskGraph, backend: str, timeout_s: float):
    """A rank's run of `graph`, with where it ran (exec.measure.environment)."""
    import torch

    from exec.measure.environment import environment
    from exec.runtime.runner import run_rank

    res = run_rank(graph, rank, backend, None, timeout_s, 1)
    res.extra["environment"] = environment(torch.device(res.device))
    return res


def run_sections(
    g: TaskGraph, nprocs: int, backend: str, timeout_s: float, memory_kinds: tuple[str, ...]
) -> tuple[ExecResult, dict[str, Any], pd.DataFrame]:
    """The run of `g`, where it ran, and its host seconds per issued task (GPU runs only;
    the first of `memory_kinds`, the memory-bound stand-in kernel, stands for the others, as
    for its fits)."""
    results = call_ranks(_job, (g, backend, timeout_s), nprocs, backend, timeout_s)
    env = dict(results[0].extra.get("environment") or {})
    issued = {k: v for r in results for k, v in (r.extra.get("issue_s") or {}).items()}
    issues = issue_rows(g, issued)
    mem = issues[issues["op"] == memory_kinds[0]]
    issues = pd.concat([issues, *(mem.assign(op=k) for k in memory_kinds[1:])])
    return assemble(g, results, backend), env, issues.reset_index(drop=True)
