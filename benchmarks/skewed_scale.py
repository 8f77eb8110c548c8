"""Simulator time under skewed routing: one MoE layer forward, `sequential`, Zipf(1.2)
routing on dgx-a100 (per-flow all-to-allv: every (source, destination) pair its own size, so
neither bundling nor a closed form applies and every flow finish changes max-min rates).

This is the simulator's slowest regime; the numbers say where it stops being interactive, and
what `costs.finish_rtol` (flows ending within that fraction of the current time end together)
buys against the exact default. Wall and CPU time of `simulate` are both recorded: on a
machine shared with other jobs the CPU time is the steadier of the two.

Runs are kept per `--label` in benchmarks/results/skewed_scale.json (a run replaces the rows of
its own label only), so the same script run against an older checkout (PYTHONPATH pointing at
it) records the "before" next to the "after"; the .md lays them side by side.

    python benchmarks/skewed_scale.py [--gpus 16 32 64 128 256] [--rtol 1e-9 1e-3]
        [--repeat 1] [--exact-max 256] [--label after] [--shared]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from sim.core.io import atomic_write_text
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.workload.moe import MoELayer

OUT = Path(__file__).resolve().parent / "results"
TARGET_S = 30.0
WHY = (
    "`original`: every flow start or finish re-solved max-min rates over all active flows. "
    "`rounds`: the solve is local, in rounds of re-filling and checks around each change. "
    "`before`: when flows finish, every rate below the lowest of theirs stays (the prefix "
    "property of progressive filling), so one filling over the flows at or above it replaces "
    "the rounds; but that filling is a chain of ~10-20 rounds of local minima per event, ~20 "
    "array passes each. `after`: the filling over those flows starts from the bottleneck "
    "each had (sim/hardware/network/assigned.py): the levels then solve a linear system, "
    "triangular in the order links saturate, reached by Jacobi sweeps of ~5 array passes "
    "from the previous levels, and the result is checked to be max-min fair (every flow has "
    "a saturated link where no flow gets more; no link over capacity), the few flows that "
    "changed bottleneck moved and the system solved again (1.5 solves per event on average; "
    "a guess that does not settle, ~0.1% of events, falls back to the filling). Flows "
    "finishing at once are found in one pass over the flows, not four. Makespans agree with "
    "`before` to all printed digits (the test suite checks the rates against a solve from "
    "scratch). CPU times, not wall: `before` and `after` ran back to back at a load "
    "average of ~0.5, but the CPU time of the same code grows under load too: 88e9dfa's "
    "code took 83 s of CPU at 256 GPUs at a load average of ~14 against 36 s here, so on a "
    "busy machine `after` may take ~35 s."
)


def one(n: int, rtol: float) -> dict:
    layer = MoELayer(
        batch=4,
        seq_len=1024,
        model_dim=2048,
        hidden_dim=8192,
        experts=n,
        world=n,
        top_k=2,
        capacity_factor=1.2,
        routing={"kind": "zipf", "s": 1.2, "seed": 0},
    )
    graph = build("sequential", layer, {}, ("fwd",))
    topo = Topology.load("dgx-a100", nodes=n // 8)
    costs = CostModel.build(topo, {"finish_rtol": rtol})
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(graph, topo, costs)
    return {
        "gpus": n,
        "finish_rtol": rtol,
        "tasks": len(graph),
        "simulate_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "flows": res.stats["flows"],
        "rate_recomputes": res.stats["rate_recomputes"],
        "makespan_ms": res.makespan * 1e3,
    }


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    model = names[0] if names else platform.processor() or platform.machine()
    cores = os.cpu_count()
    return f"{cores}-core CI-class container ({model}), Python {platform.python_version()}"


def _table(rows: list[dict]) -> list[str]:
    out = [
        "| GPUs | finish_rtol | tasks | simulate wall (s) | CPU (s) | flows | rate solves "
        "| makespan (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['gpus']} | {r['finish_rtol']:.0e} | {r['tasks']} | {r['simulate_s']:.2f} | "
            f"{r['cpu_s']:.2f} | {r['flows']} | {r['rate_recomputes']} | "
            f"{r['makespan_ms']:.4f} |"
        )
    return out


def _compare(before: list[dict], after: list[dict]) -> list[str]:
    key = {(r["gpus"], r["finish_rtol"]): r for r in before}
    out = [
        "| GPUs | finish_rtol | before CPU (s) | after CPU (s) | speed-up (CPU) "
        "| before wall (s) | after wall (s) | same makespan |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in after:
        b = key.get((r["gpus"], r["finish_rtol"]))
        if b is None:
            out.append(
                f"| {r['gpus']} | {r['finish_rtol']:.0e} | not run | {r['cpu_s']:.2f} | | "
                f"not run | {r['simulate_s']:.2f} | |"
            )
            continue
        same = abs(b["makespan_ms"] - r["makespan_ms"]) <= 1e-9 * b["makespan_ms"]
        out.append(
            f"| {r['gpus']} | {r['finish_rtol']:.0e} | {b['cpu_s']:.2f} | {r['cpu_s']:.2f} | "
            f"{b['cpu_s'] / r['cpu_s']:.1f}x | {b['simulate_s']:.2f} | {r['simulate_s']:.2f} | "
            f"{'yes' if same else 'no'} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--rtol", type=float, nargs="+", default=[1e-9, 1e-3])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--exact-max", type=int, default=256, help="largest GPU count at 1e-9")
    ap.add_argument("--label", default="after", help="name of this run (e.g. before, after)")
    ap.add_argument("--shared", action="store_true", help="say the machine ran other jobs")
    ap.add_argument("--render-only", action="store_true", help="rewrite the .md from the .json")
    a = ap.parse_args()
    path = OUT / "skewed_scale.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    runs_by_label = old.get("runs", {})
    if not a.render_only:
        runs_by_label[a.label] = run(a)
    OUT.mkdir(exist_ok=True)
    atomic_write_text(path, json.dumps({"runs": runs_by_label}, indent=1))
    atomic_write_text(OUT / "skewed_scale.md", render(runs_by_label))


def run(a: argparse.Namespace) -> dict:
    rows = []
    for n in a.gpus:
        for rtol in a.rtol:
            if rtol <= 1e-9 and n > a.exact_max:
                continue
            runs = [one(n, rtol) for _ in range(a.repeat)]
            med = dict(runs[0])  # the median run's times; the rest agrees between runs
            med["simulate_s"] = statistics.median(r["simulate_s"] for r in runs)
            med["cpu_s"] = statistics.median(r["cpu_s"] for r in runs)
            rows.append(med)
            print(
                f"{n:5d} GPUs  rtol {rtol:7.0e}  wall {med['simulate_s']:8.2f} s  "
                f"cpu {med['cpu_s']:8.2f} s  {med['flows']} flows  "
                f"{med['rate_recomputes']} rate solves  makespan {med['makespan_ms']:.4f} ms",
                flush=True,
            )
    where = machine() + ("; shared with other jobs" if a.shared else "")
    return {"machine": where, "repeat": a.repeat, "rows": rows}


def render(runs_by_label: dict) -> str:
    md = [
        "# Skewed routing: one MoE layer fwd, sequential, Zipf(1.2), dgx-a100, per-flow",
        "",
        "Layer: B=4, L=1024, M=2048, H=8192, E/P=1, top-2, f=1.2, bf16. Times are of "
        "`simulate` alone, median of the runs. Generated by `python "
        "benchmarks/skewed_scale.py`; `original` is the same script run with PYTHONPATH at "
        "commit 3687c94 (one sim/hardware/network.py, rates re-solved over every active "
        "flow), `rounds` at a22dab9 (the local solver in rounds), `before` at 88e9dfa (one "
        "filling above the floor), re-run just before `after` on the same machine.",
    ]
    exact = [
        r
        for r in runs_by_label.get("after", {}).get("rows", [])
        if r["gpus"] == 256 and r["finish_rtol"] <= 1e-9
    ]
    if exact:
        r = exact[0]
        # CPU time: on a machine shared with other jobs, wall time measures the others too
        verdict = "reached" if r["cpu_s"] < TARGET_S else "not reached"
        md += [
            "",
            f"Issue target, exact (finish_rtol 1e-9) at 256 GPUs under {TARGET_S:.0f} s of CPU: "
            f"**{verdict}** ({r['simulate_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU). " + WHY,
        ]
    if "before" in runs_by_label and "after" in runs_by_label:
        md += ["", "## Before / after", ""]
        md += _compare(runs_by_label["before"]["rows"], runs_by_label["after"]["rows"])
    for label, run in runs_by_label.items():
        md += ["", f"## {label}", "", f"Machine: {run['machine']}; {run['repeat']} run(s).", ""]
        md += _table(run["rows"])
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
