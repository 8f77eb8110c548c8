"""A measured run in numbers: makespan, stream busy time, exposed communication, clocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from exec.runtime.launch import ExecResult
from sim.analysis.summary import busy_per_stream, exposed_per_rank


def summarize(res: ExecResult) -> dict[str, Any]:
    """The fields of sim.analysis.summary that a measurement has (no links, no memory model)."""
    df = res.trace
    busy = busy_per_stream(df)
    exp = exposed_per_rank(df)
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
