"""Simulator wall-clock and peak memory for one MoE layer fwd + bwd at 2,048 and 16,384 GPUs.

`pipelined` r = 4 (tutel order); B=8, L=1024, M=2048, H=8192, one expert per GPU of an EP
group, top-2, f = 1.2, bf16. The clusters are `dgx-h100-superpod` (rail-optimised, 32-node
scalable units: the four EP-64 replicas of a unit share its rail leaves and their spine
uplinks, whose traffic is simulated) and, for the single 2,048-GPU EP group of
`engine_scale.py`, `dgx-a100`. `sym` runs one replica's graph on its representatives
(`sim.engine.symmetric`, what `costs.symmetry: auto` does at these sizes); `full` builds and
simulates every rank (`costs.symmetry: off`), where that is affordable.

Each case runs in a fresh process: `build` is the topology, cost model and graph (one
replica's; the whole graph for `full`), `simulate` the symmetry check, the engine and the
expansion of results, `process` the whole process (interpreter start-up and imports
included) as timed from outside, `imports` the imports alone, `rss` the process's peak
resident memory (ru_maxrss), `events` the SimPy events processed. Medians of --repeat runs.
Results go to benchmarks/results/scale_16k.{json,md}.

    python benchmarks/scale_16k.py [--repeat 3] [--cases ep64-dp256 ...]
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine  # noqa: E402

OUT = ROOT / "benchmarks" / "results"

# name: (topology, nodes, ep, dp, fabric overrides, routing, mode, extra costs)
SUPERPOD = "dgx-h100-superpod"
OVER2 = {"oversubscription": 2}
RTOL = {"finish_rtol": 1e-3}
CASES: dict[str, tuple] = {
    "ep64-dp256": (SUPERPOD, 2048, 64, 256, {}, "uniform", "sym", {}),
    "ep64-dp256-oversub2": (SUPERPOD, 2048, 64, 256, OVER2, "uniform", "sym", {}),
    "ep64-dp256-zipf": (SUPERPOD, 2048, 64, 256, {}, "zipf", "sym", {}),
    "ep64-dp256-zipf-rtol": (SUPERPOD, 2048, 64, 256, {}, "zipf", "sym", RTOL),
    "ep64-dp1-zipf": (SUPERPOD, 8, 64, 1, {}, "zipf", "sym", {}),
    "ep64-dp32": (SUPERPOD, 256, 64, 32, {}, "uniform", "sym", {}),
    "ep64-dp32-full": (SUPERPOD, 256, 64, 32, {}, "uniform", "full", {}),
    "ep64-dp8": (SUPERPOD, 64, 64, 8, {}, "uniform", "sym", {}),
    "ep64-dp8-full": (SUPERPOD, 64, 64, 8, {}, "uniform", "full", {}),
    "ep64-dp8-oversub2": (SUPERPOD, 64, 64, 8, OVER2, "uniform", "sym", {}),
    "ep64-dp8-oversub2-full": (SUPERPOD, 64, 64, 8, OVER2, "uniform", "full", {}),
    "ep2048": ("dgx-a100", 256, 2048, 1, {}, "uniform", "sym", {}),
    "ep2048-full": ("dgx-a100", 256, 2048, 1, {}, "uniform", "full", {}),
}


SLOW = {
    "ep64-dp32-full",
    "ep64-dp256-zipf",
    "ep64-dp1-zipf",
    "ep64-dp256-zipf-rtol",
}  # a minute each: run once


def child(name: str) -> dict:
    import numpy as np
    import simpy

    from sim.engine.engine import simulate
    from sim.engine.symmetric import simulate_replicas
    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology
    from sim.strategies import build
    from sim.workload.moe import MoELayer
    from sim.workload.parallel import ParallelLayout, replicate

    t_imported = time.perf_counter()
    events = [0]
    step = simpy.Environment.step

    def counting_step(self):  # noqa: ANN001
        events[0] += 1
        return step(self)

    simpy.Environment.step = counting_step  # type: ignore[method-assign]
    preset, nodes, ep, dp, fabric, routing, mode, extra = CASES[name]
    t0 = time.perf_counter()
    topo = Topology.load(preset, nodes=nodes, fabric=fabric or None)
    route = {"kind": "zipf", "s": 1.2, "seed": 0} if routing == "zipf" else {"kind": "uniform"}
    layer = MoELayer(
        batch=8,
        seq_len=1024,
        model_dim=2048,
        hidden_dim=8192,
        experts=ep,
        world=ep,
        top_k=2,
        capacity_factor=1.2,
        routing=route,
    )
    costs = CostModel.build(topo, {"symmetry": "on" if mode == "sym" else "off", **extra})
    graph = build("pipelined", layer, {"degree": 4, "order": "tutel"}, ("fwd", "bwd"))
    lay = ParallelLayout(ep, dp, gpus_per_node=topo.gpus_per_node)
    if mode == "full":
        graph = replicate(graph, lay)
    t1 = time.perf_counter()
    if mode == "full":
        res = simulate(graph, topo, costs)
    else:
        ranks = np.stack([lay.replica_ranks(d) for d in range(dp)])
        res = simulate_replicas(graph, topo, costs, ranks, prefix="dp0/" if dp > 1 else "")
    t2 = time.perf_counter()
    sym = res.stats.get("symmetry", {})
    return {
        "case": name,
        "gpus": ep * dp,
        "topology": preset,
        "nodes": nodes,
        "ep": ep,
        "dp": dp,
        "fabric": fabric,
        "routing": routing,
        "costs": extra,
        "mode": mode,
        "imports_s": t_imported - T_START,
        "build_s": t1 - t0,
        "simulate_s": t2 - t1,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "events": events[0],
        "tasks_simulated": res.stats.get("tasks_simulated", res.stats["tasks"]),
        "ranks_simulated": sym.get("ranks_simulated", ep * dp),
        "node_classes": sym.get("node_classes"),
        "bundles": res.stats["bundles"],
        "makespan_s": res.makespan,
    }


def run_case(name: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", name],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t0
    return row


def median_row(rows: list[dict]) -> dict:
    rows = sorted(rows, key=lambda r: r["build_s"] + r["simulate_s"])
    mid = dict(rows[len(rows) // 2])
    for k in ("imports_s", "build_s", "simulate_s", "process_s", "rss_mib"):
        vals = sorted(r[k] for r in rows)
        mid[k] = vals[len(vals) // 2]
    mid["runs"] = len(rows)
    return mid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--note", default="", help="said of the machine (e.g. shared)")
    ap.add_argument("--update", action="store_true", help="keep recorded rows of other cases")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return
    rows = []
    for name in a.cases:
        r = median_row([run_case(name) for _ in range(1 if name in SLOW else a.repeat)])
        rows.append(r)
        print(
            f"{name:20s} {r['gpus']:6d} GPUs  build {r['build_s']:6.2f} s  simulate "
            f"{r['simulate_s']:6.2f} s  process {r['process_s']:6.2f} s  rss {r['rss_mib']:6.0f} "
            f"MiB  events {r['events']:7d}  makespan {r['makespan_s'] * 1e3:.6f} ms",
            flush=True,
        )
    from sim.core.io import atomic_write_text

    mach = machine() + (f"; {a.note}" if a.note else "")
    if a.update and (OUT / "scale_16k.json").is_file():
        mine = {r["case"] for r in rows}
        old = json.loads((OUT / "scale_16k.json").read_text())["rows"]
        rows = sorted(
            [r for r in old if r["case"] not in mine] + rows,
            key=lambda r: list(CASES).index(r["case"]),
        )
    atomic_write_text(
        OUT / "scale_16k.json", json.dumps({"machine": mach, "rows": rows}, indent=2) + "\n"
    )
    lines = [
        "# One MoE layer fwd+bwd at 2,048 and 16,384 GPUs: symmetric vs full simulation",
        "",
        f"Machine: {mach}. Median of {a.repeat} runs (1 for the minute-long cases), each in "
        "a fresh process. Layer: "
        "pipelined r=4 (tutel order), B=8, L=1024, M=2048, H=8192, one expert per GPU of an "
        "EP group, top-2, f=1.2, bf16. `sym`: one replica's graph on its representatives "
        "(`costs.symmetry` auto/on); `full`: every rank (`off`). build + simulate is the "
        "simulator's work; process adds interpreter start-up and imports. Generated by "
        "`python benchmarks/scale_16k.py`.",
        "",
        "| case | GPUs | EP x DP | fabric | mode | ranks simulated | tasks simulated | build (s) "
        "| simulate (s) | build+simulate (s) | imports (s) | process (s) | peak RSS (MiB) "
        "| events | makespan (ms) |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        fab = r["topology"] + (f" {r['fabric']}" if r["fabric"] else "")
        fab += " zipf" if r["routing"] == "zipf" else ""
        fab += "".join(f" {k}={v}" for k, v in r.get("costs", {}).items())
        lines.append(
            f"| {r['case']} | {r['gpus']} | {r['ep']} x {r['dp']} | {fab} | {r['mode']} | "
            f"{r['ranks_simulated']} | {r['tasks_simulated']} | {r['build_s']:.2f} | "
            f"{r['simulate_s']:.2f} | {r['build_s'] + r['simulate_s']:.2f} | "
            f"{r['imports_s']:.2f} | {r['process_s']:.2f} | {r['rss_mib']:.0f} | {r['events']} | "
            f"{r['makespan_s'] * 1e3:.6f} |"
        )
    atomic_write_text(OUT / "scale_16k.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
