"""Part `replay`: a torch.profiler (Kineto) trace of the executor's block step (`replay_job.py`
beside this file, its own process), replayed by `moesim replay`: the replayed step time
against the measured one. Measured three ways: the recorded `ProfilerStep#1` (the step the
trace holds; issue 27's criterion: the replay within 5% of it), the span of the trace's ops
(what `moesim replay` calls the measured makespan), and the median of the unprofiled steps
(what the profiler itself costs)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

from .common import Ctx, moesim, run_cmd, write_rows

JOB = Path(__file__).resolve().with_name("replay_job.py")
COLUMNS = ["what", "seconds", "replay_error_pct"]


def profiler_step_s(trace: Path, step: int = 1) -> float | None:
    """Duration of `ProfilerStep#<step>` in a Kineto trace (plain or gzipped JSON)."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        doc = json.load(f)
    for e in doc.get("traceEvents") or []:
        if e.get("ph") == "X" and e.get("name") == f"ProfilerStep#{step}":
            return float(e["dur"]) * 1e-6
    return None


def run(ctx: Ctx) -> dict[str, Any]:
    d = ctx.out / "replay"
    log = d / "replay.log"
    cmd = [sys.executable, str(JOB), "--out", str(d), *(["--dry-run"] if ctx.dry else [])]
    rc, last = run_cmd(ctx, cmd, log)
    job_file, trace = d / "job.json", d / "kineto" / "rank0.json.gz"
    if rc != 0 or not job_file.is_file() or not trace.is_file():
        return {"status": "failed", "reason": f"the block step's process exit {rc}: {last}"}
    job = json.loads(job_file.read_text())
    rc, last = run_cmd(ctx, moesim("replay", str(trace), "--out", str(d / "replayed")), log)
    summ = d / "replayed" / "summary.json"
    if rc != 0 or not summ.is_file():
        return {"status": "failed", "reason": f"moesim replay exit {rc}: {last}"}
    s = json.loads(summ.read_text())
    replayed = float(s["makespan_s"])
    span = (s.get("replay") or {}).get("measured_makespan_s")
    step = profiler_step_s(trace)
    unprofiled = job.get("step_s_median")

    def err(m: float | None) -> float | None:
        return 100.0 * (replayed - m) / m if m else None

    rows = [
        {"what": "replayed (moesim replay)", "seconds": replayed, "replay_error_pct": ""},
        {"what": "ProfilerStep#1 (measured)", "seconds": step, "replay_error_pct": err(step)},
        {"what": "span of the trace's ops", "seconds": span, "replay_error_pct": err(span)},
        {
            "what": "unprofiled step (median)",
            "seconds": unprofiled,
            "replay_error_pct": err(unprofiled),
        },
    ]
    write_rows(ctx, "replay/replay.csv", rows, COLUMNS)
    res = {
        "replayed_s": replayed,
        "profiler_step_s": step,
        "trace_span_s": span,
        "unprofiled_step_s": unprofiled,
        "error_pct": err(step),
        "error_vs_unprofiled_pct": err(unprofiled),
        "tasks": (s.get("replay") or {}).get("tasks"),
        "job": job,
    }
    ctx.shared["replay"] = res
    return {"status": "ran", "error_pct": res["error_pct"]}
