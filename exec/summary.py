"""A measured run in numbers: makespan, stream busy time, exposed communication, clocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from exec.launch import ExecResult
from sim.summary import exposed, union_length


def summarize(res: ExecResult) -> dict[str, Any]:
    """The fields of sim.summary that a measurement has (no links, no memory model)."""
    df = res.trace
    busy: dict[str, float] = {}
    for stream, sub in df.groupby("stream"):
        per_rank = [union_length(g[["start", "end"]].to_numpy()) for _, g in sub.groupby("rank")]
        busy[str(stream)] = float(np.mean(per_rank))
    kinds = df["stream"].str.split(".").str[0]
    exp = []
    for _rank, g in df.assign(k=kinds).groupby("rank"):
        comm = g[g["k"] == "comm"][["start", "end"]].to_numpy()
        comp = g[g["k"] == "compute"][["start", "end"]].to_numpy()
        exp.append(exposed(comm, comp))
    return {
        "makespan_s": res.makespan,
        "tasks": int(len(df)),
        "ranks": res.nprocs,
        "backend": res.backend,
        "device": res.device,
        "busy_s": busy,
        "exposed_comm_s": float(np.mean(exp)) if exp else 0.0,
        "sync_wait_s": float(df["sync_wait"].sum()),
        "clock_offsets_ns": res.clock_offsets_ns,
        "clock_bound_us": max(res.clock_bounds_ns, default=0) / 1e3,
    }
