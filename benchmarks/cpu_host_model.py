"""The CPU twin's model of its own host (issue 29 item 2), measured on this machine.

One calibration at 2 ranks (gloo; the full microbenchmark plan, with the exact GEMM shapes of
the validation graphs at 2 and at 4 ranks), then `benchmarks/validate_cpu.yaml`'s validation
graphs (sequential and pipelined r = 1, 2, 4, 8; fwd and fwd+bwd) measured at 2 ranks and at 4
ranks (the median of 3 runs each, as `moesim validate` keeps), and every graph simulated on
`localhost-cpu` with that one calibration, twice:

- **before**: the host model off (`costs.shared_cpu: false`): compute at the calibrated
  times whatever the rank count, and a 4-rank all-to-all at the 2-rank fit (the fit of the
  nearest group size, as the collective model clamps);
- **after**: the host model on (sim.hardware.costs.host, sim.hardware.costs.gloo): kernels
  slowed by the ranks' share of the cores against the calibration's, memory-bound kernels
  by the memory bandwidth the running ranks share, and the all-to-all extrapolated from the
  calibrated group size as gloo runs it.

Both with the calibration's jitter (what `validate` does) and without (`costs.jitter: null`).
The same measured traces serve both, so the comparison is of the models alone. Reported per
rank count: MAPE, Spearman's rank correlation and the pick per pass set, beside the host's
load average while measuring.

    python benchmarks/cpu_host_model.py measure [--work DIR] [--repeats 3]
    python benchmarks/cpu_host_model.py memory [--work DIR]
    python benchmarks/cpu_host_model.py comm [--work DIR]
    python benchmarks/cpu_host_model.py report [--work DIR ...]

`measure` keeps its traces in --work (default out/cpu_host_model, not committed); `memory`
measures the streaming copy rate of 1, 2 and 4 single-threaded processes at once (the
memory figures of topologies/localhost-cpu.yaml: gpu.mem_bw, shared_cpu.mem_bw); `comm`
measures gloo's all-to-all alone at 2, 3 and 4 ranks (the check of sim.hardware.costs.gloo,
and shared_cpu.comm_cores); `report`
simulates from one or more such folders and writes benchmarks/results/cpu_host_model.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "benchmarks" / "validate_cpu.yaml"
RANKS = (2, 4)
CAL_RANKS = 2


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


STREAM = """
import sys, time
import numpy as np
a = np.ones(2**24, dtype=np.float32); b = np.empty_like(a)  # 64 MiB each: past the caches
np.copyto(b, a)
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < float(sys.argv[1]):
    np.copyto(b, a); n += 1
print(2 * a.nbytes * n / (time.perf_counter() - t0))  # bytes read + written per second
"""


def stream_bw(procs: int, seconds: float = 2.0) -> list[float]:
    """Bytes/s (read + written) each of `procs` single-threaded processes copies at once: one
    thread's streaming rate alone (1) and what the host's memory serves them together."""
    import subprocess

    cmd = [sys.executable, "-c", STREAM, str(seconds)]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    return [float(p.communicate()[0]) for p in ps]


def measure_memory(work: Path) -> None:
    """The memory figures of `localhost-cpu` (gpu.mem_bw, shared_cpu.mem_bw), on this host."""
    path = work / "measure.json"
    log = json.loads(path.read_text()) if path.exists() else {}
    l0 = _load()
    log["stream_bw"] = {str(p): stream_bw(p) for p in (1, 2, 4)}
    log["stream_bw_load"] = [l0, _load()]
    path.write_text(json.dumps(log, indent=1))
    print(json.dumps(log["stream_bw"]))


COMM_RANKS = (2, 3, 4)
COMM_SIZES = (2**16, 2**20, 2**24)  # bytes per rank the report compares at


def measure_comm(work: Path, rounds: int = 3) -> None:
    """gloo's all-to-all alone at 2, 3 and 4 ranks (the calibration's comm benchmark, 7
    repetitions per size), `rounds` times interleaved so that the host's load falls on every
    rank count alike; the rows are kept (comm_r{n}.csv) for `report` to fit."""
    import pandas as pd

    from exec.measure.microbench import Plan, comm_graph
    from exec.measure.timings import measurements
    from exec.runtime.launch import launch
    from sim.analysis.trace import write_table

    path = work / "measure.json"
    log = json.loads(path.read_text()) if path.exists() else {}
    plan = Plan(collectives=("all_to_all",), reps=7)
    rows: dict[int, list[Any]] = {n: [] for n in COMM_RANKS}
    l0 = _load()
    for _ in range(rounds):
        for n in COMM_RANKS:
            g = comm_graph(n, plan)
            rows[n].append(measurements(g, launch(g, n, "gloo", 120.0).trace))
    for n in COMM_RANKS:
        write_table(pd.concat(rows[n], ignore_index=True), work / f"comm_r{n}.csv")
    log["all_to_all_load"] = [l0, _load()]
    path.write_text(json.dumps(log, indent=1))


def measure(work: Path, repeats: int) -> None:
    """Calibrate at CAL_RANKS, then measure every validation graph at each of RANKS."""
    from exec.measure.microbench import Plan, calibrate
    from exec.measure.validation import case_graph, case_graphs, cases
    from exec.runtime.launch import host_cores, launch, rank_threads
    from sim.analysis.trace import write_table
    from sim.config import RunConfig

    work.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig.load(CONFIG)
    log: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": host_cores(),
        "cpus": os.cpu_count(),
        "steps": [],
    }
    graphs = [g for n in RANKS for g in case_graphs(cfg, n)]
    plan = Plan().with_shapes_of(graphs)
    t0, l0 = time.time(), _load()
    cal, rows = calibrate(CAL_RANKS, "gloo", plan)
    cal.save(work / "calibration.yaml")
    write_table(rows, work / "calibration.measurements.csv")
    log["steps"].append(
        {"step": f"calibrate {CAL_RANKS} ranks", "s": time.time() - t0, "load": [l0, _load()]}
    )
    print(f"calibrated in {time.time() - t0:.0f} s, load {l0} -> {_load()}", flush=True)
    for n in RANKS:
        layer = cfg.layer(n)
        t0, l0 = time.time(), _load()
        spans: dict[str, list[float]] = {}
        loads = []
        for case in cases(layer.capacity):
            graph = case_graph(cfg, layer, case)
            runs = [launch(graph, n, "gloo", 120.0) for _ in range(repeats)]
            loads.append(_load()[0])
            order = sorted(range(len(runs)), key=lambda i: runs[i].makespan)
            median = runs[order[len(order) // 2]]
            slug = case.name.replace(" ", "_").replace("=", "").replace("+", "_")
            write_table(median.trace, work / f"r{n}" / f"{slug}.measured.csv")
            spans[case.name] = [r.makespan for r in runs]
            print(f"  {n} ranks {case.name:26s} {median.makespan * 1e3:8.2f} ms", flush=True)
        log["steps"].append(
            {
                "step": f"validate {n} ranks",
                "s": time.time() - t0,
                "load": [l0, _load()],
                "load_1min_per_graph": loads,
                "threads_per_rank": rank_threads(n),
                "spans": spans,
            }
        )
    path = work / "measure.json"  # beside what `memory` and `comm` wrote there
    path.write_text(
        json.dumps({**(json.loads(path.read_text()) if path.exists() else {}), **log}, indent=1)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("measure", "memory", "comm", "report"))
    ap.add_argument(
        "--work",
        type=Path,
        action="append",
        help="measurement folder (default out/cpu_host_model); report: one or more",
    )
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    works = a.work or [ROOT / "out" / "cpu_host_model"]
    if a.what == "measure":
        measure(works[0], a.repeats)
    elif a.what == "memory":
        measure_memory(works[0])
    elif a.what == "comm":
        measure_comm(works[0])
    else:
        from benchmarks.cpu_host_report import report

        report(works)
    return 0


if __name__ == "__main__":
    sys.exit(main())
