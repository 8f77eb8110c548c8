"""Simulator wall-clock for one 16 MiB-per-GPU all-to-all (network issue benchmark).

dgx-a100 (single-switch HDR fabric) at 64 .. 4,096 GPUs with the linear and 2DH algorithms,
and a single flat 300 GB/s switch at 256 and 1,024 GPUs. Fidelity `auto` picks bundled flows
at these sizes (exact: equal to per-flow wherever both run, see tests); per-flow runs too
where it takes seconds, as the reference. Reference from the issue: ASTRA-sim's
congestion-aware analytical backend needs 0.53 s (256 GPUs) and 18.4 s (1,024 GPUs) on the
flat switch on this kind of machine.

The issue asks for 10x ASTRA-sim in CPU time with process start-up included, so the flat-switch
cases are also run as a whole fresh process (`python -c`: interpreter start, imports, topology,
graph, simulation) and its user+sys CPU time is taken from the child's rusage (median of
`--process-repeat` runs).

    python benchmarks/collective_scale.py [--repeat 3] [--process-repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine  # noqa: E402
from sim.analysis.collbench import graph_for  # noqa: E402
from sim.core.io import atomic_write_text  # noqa: E402
from sim.engine.engine import simulate  # noqa: E402
from sim.hardware.costs import CostModel  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
SIZE = 16 * 2**20
CASES = [
    ("dgx-a100", n, algo, fid)
    for n in (64, 256, 1024, 2048, 4096)
    for algo in ("linear", "2dh")
    for fid in ("auto", "flow")
    if fid == "auto" or n <= 1024
]
CASES += [("flat-switch", n, "linear", fid) for n in (256, 1024) for fid in ("auto", "flow")]
ASTRA = {256: 0.53, 1024: 18.4}


def one(preset: str, gpus: int, algo: str, fid: str) -> dict:
    t0 = time.perf_counter()
    topo = Topology.load(preset, nodes=gpus // Topology.load(preset, nodes=1).gpus_per_node)
    graph = graph_for("all_to_all", algo, gpus, SIZE)
    res = simulate(graph, topo, CostModel.build(topo, {"fidelity": fid}))
    wall = time.perf_counter() - t0
    return {
        "topology": preset,
        "gpus": gpus,
        "algo": algo,
        "fidelity": fid,
        "used": res.stats["fidelity"],
        "wall_s": wall,
        "flows": res.stats["flows"],
        "bundles": res.stats["bundles"],
        "sim_time_us": res.makespan * 1e6,
    }


# What a user's process does for one case, from interpreter start to the simulated result.
IMPORTS = """\
from sim.analysis.collbench import graph_for
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
"""
CHILD = (
    IMPORTS
    + """\
topo = Topology.load({preset!r}, nodes={nodes})
graph = graph_for("all_to_all", {algo!r}, {gpus}, {size})
simulate(graph, topo, CostModel.build(topo, {{"fidelity": {fid!r}}}))
"""
)


def process_cpu(preset: str, gpus: int, algo: str, fid: str) -> float:
    """User + system CPU seconds of a fresh `python -c` process that simulates the case."""
    nodes = gpus // Topology.load(preset, nodes=1).gpus_per_node
    return child_cpu(
        CHILD.format(preset=preset, nodes=nodes, algo=algo, gpus=gpus, size=SIZE, fid=fid)
    )


def child_cpu(code: str) -> float:
    """User + system CPU seconds of `python -c code`, run from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if proc.returncode:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{code}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--process-repeat", type=int, default=5)
    ap.add_argument("--shared", action="store_true", help="say the machine ran other jobs")
    a = ap.parse_args()
    rows = []
    for case in CASES:
        best = min((one(*case) for _ in range(a.repeat)), key=lambda r: r["wall_s"])
        if case[0] == "flat-switch":
            cpu = [process_cpu(*case) for _ in range(a.process_repeat)]
            best["process_cpu_s"] = statistics.median(cpu)
            best["process_cpu_runs_s"] = cpu
        rows.append(best)
        print(
            f"{best['topology']:12s} {best['gpus']:5d} {best['algo']:7s} {best['fidelity']:5s} "
            f"{best['wall_s']:7.3f} s  flows {best['flows']:>9d}  bundles {best['bundles']:>7d}"
            f"  simulated {best['sim_time_us']:10.1f} us",
            flush=True,
        )
    startup = statistics.median(child_cpu(IMPORTS) for _ in range(a.process_repeat))
    where = machine() + ("; shared with other jobs" if a.shared else "")
    atomic_write_text(
        OUT / "collective_scale.json",
        json.dumps({"machine": where, "startup_cpu_s": startup, "rows": rows}, indent=2),
    )
    lines = [
        "# One 16 MiB-per-GPU all-to-all: simulator wall-clock",
        "",
        f"Machine: {where}; wall: best of {a.repeat}, in one process (topology load, graph, "
        f"simulation); process CPU: median of {a.process_repeat} fresh `python -c` processes, "
        "user + sys, interpreter start-up and imports included. Generated by "
        "`python benchmarks/collective_scale.py`.",
        "",
        "| topology | GPUs | algorithm | fidelity asked | used | flows | bundles | wall (s) "
        "| simulated (us) | ASTRA-sim ref (s) | speed-up (wall) | process CPU (s) "
        "| speed-up (process CPU) |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ref = ASTRA.get(r["gpus"]) if r["topology"] == "flat-switch" else None
        used = ", ".join(f"{k} {v}" for k, v in r["used"].items())
        speedup = f"{ref / r['wall_s']:.0f}x" if ref else ""
        cpu = r.get("process_cpu_s")
        cpu_cols = f"{cpu:.2f} | {ref / cpu:.1f}x" if cpu and ref else " | "
        lines.append(
            f"| {r['topology']} | {r['gpus']} | {r['algo']} | {r['fidelity']} | {used} | "
            f"{r['flows']} | {r['bundles']} | {r['wall_s']:.3f} | {r['sim_time_us']:.1f} | "
            f"{ref or ''} | {speedup} | {cpu_cols} |"
        )
    lines += [
        "",
        "10x ASTRA-sim in whole-process CPU time (the issue's bar), flat switch: "
        + "; ".join(
            f"{r['gpus']} GPUs {r['fidelity']}: {ASTRA[r['gpus']] / r['process_cpu_s']:.1f}x "
            f"({'reached' if ASTRA[r['gpus']] / r['process_cpu_s'] >= 10 else 'not reached'}, "
            f"runs {min(r['process_cpu_runs_s']):.2f}-{max(r['process_cpu_runs_s']):.2f} s)"
            for r in rows
            if "process_cpu_s" in r
        )
        + f". Start-up alone (interpreter + these imports, nothing simulated) takes "
        f"{startup:.2f} s CPU here, so no case can beat 10x of 0.53 s at 256 GPUs; most of "
        "it is numpy and networkx, which sim.hardware.topology imports at module level.",
    ]
    atomic_write_text(OUT / "collective_scale.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
