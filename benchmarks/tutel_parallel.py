"""Tutel's switchable parallelism on one dgx-a100 node (Tutel Table 5): P1 vs P2, simulated.

Table 5's settings (f = capacity factor, E = global experts, S = tokens/step, V = expert
hidden size; W = 8 GPUs, M = 2K) on dgx-a100 (the Azure NDv4 / DGX A100 node Tutel ran on),
forward + backward, bf16, top-2 gating (Tutel's default gate; top-1 when E = 1). S is read as
tokens per GPU, as Tutel's text reads tokens/step (issue 26): Fig. 7's caption says
tokens/step = 16384 and Sec. 2.3 gives the expert input on 2,048 GPUs as B(2048, dE, 8, M),
8 tokens from each of 2,048 GPUs, 16384 / 2048: every GPU routes 16384 tokens. `--per-step-total`
reads S as the step's tokens over the 8 GPUs (S/8 per GPU), the reading recorded before, under
which the simulated ranking matches Table 5a; under the text's reading P1 wins every f. Each cell is
the throughput improvement of the adaptive choice over the static one, t_static / t_best - 1
(0% where the static one is the best), as Table 5 reports it; the router column is the inline
router's O(1) pick (`sim.strategies.tutel.route_parallel`), and its cost where it misses.
The last 5b row runs f = 1, 2, 4, 8, 16 in turn (Tutel's "f1~16") and compares the total time.
Results go to benchmarks/results/tutel_parallel.{json,md}.

    python benchmarks/tutel_parallel.py [--per-step-total]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.core.io import atomic_write_text
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.tutel import comm_bytes, route_parallel
from sim.workload.moe import MoELayer

OUT = Path(__file__).resolve().parent / "results"
W, M = 8, 2048
PASSES = ("fwd", "bwd")
FS = [1, 2, 4, 8, 16]
# Tutel Table 5a: improvement over static P1 / P2 per f (E2, S2K, V8K)
PAPER_5A = {1: (19.2, 0.0), 2: (2.3, 0.0), 4: (0.0, 9.7), 8: (0.0, 18.6), 16: (0.0, 23.1)}
# Tutel Table 5b: (f, E, S, V) -> improvement over static P1 / P2; f = None: f1~16
PAPER_5B = [
    ((1, 4, 1024, 4096), (29.7, 0.0)),
    ((1, 4, 1024, 8192), (47.8, 0.0)),
    ((1, 2, 16384, 2048), (0.0, 58.3)),
    ((1, 2, 32768, 2048), (0.0, 74.7)),
    ((1, 4, 4096, 8192), (12.8, 0.0)),
    ((1, 1, 4096, 8192), (0.0, 10.7)),
    ((None, 4, 2048, 8192), (8.1, 5.8)),
]


def layer(f: float, E: int, S: int, V: int, per_gpu: bool = True) -> MoELayer:
    return MoELayer(
        batch=1,
        seq_len=S if per_gpu else S // W,
        model_dim=M,
        hidden_dim=V,
        experts=E,
        world=W,
        top_k=min(2, E),
        capacity_factor=float(f),
    )


def times(cl: Cluster, f: float, E: int, S: int, V: int, per_gpu: bool = True) -> dict:
    lay = layer(f, E, S, V, per_gpu)
    t = {
        p: simulate(
            build("tutel", lay, {"parallel": p}, PASSES, cl), cl.topology, cl.costs
        ).makespan
        for p in ("p1", "p2")
    }
    b = comm_bytes(lay)
    return {
        "f": f,
        "E": E,
        "S": S,
        "V": V,
        "p1_s": t["p1"],
        "p2_s": t["p2"],
        "best": min(t, key=t.get),
        "router": route_parallel(lay),
        "p1_bytes": b["p1"],
        "p2_bytes": b["p2"],
    }


def improvement(row: dict) -> tuple[float, float]:
    best = min(row["p1_s"], row["p2_s"])
    return 100 * (row["p1_s"] / best - 1), 100 * (row["p2_s"] / best - 1)


def tables(per_gpu: bool = True) -> tuple[list[dict], list[dict]]:
    """Table 5a's and 5b's settings, simulated under one reading of S."""
    topo = Topology.load("dgx-a100", nodes=1)
    cl = Cluster(topo, CostModel.build(topo, {}))
    table_a = [times(cl, f, 2, 2048, 8192, per_gpu) for f in FS]
    table_b = []
    for (f, E, S, V), paper in PAPER_5B:
        if f is not None:
            table_b.append({**times(cl, f, E, S, V, per_gpu), "paper": paper})
            continue
        rows = [times(cl, g, E, S, V, per_gpu) for g in FS]  # f1~16: one iteration per f
        total = {
            "p1_s": sum(r["p1_s"] for r in rows),
            "p2_s": sum(r["p2_s"] for r in rows),
            "adaptive_s": sum(min(r["p1_s"], r["p2_s"]) for r in rows),
            "router_s": sum(r[f"{r['router']}_s"] for r in rows),
        }
        table_b.append(
            {"f": "1~16", "E": E, "S": S, "V": V, **total, "paper": paper, "per_f": rows}
        )
    return table_a, table_b


def main(per_gpu: bool = True) -> None:
    table_a, table_b = tables(per_gpu)
    atomic_write_text(
        OUT / "tutel_parallel.json",
        json.dumps(
            {
                "topology": "dgx-a100",
                "W": W,
                "M": M,
                "passes": list(PASSES),
                "S_read_as": "tokens per GPU" if per_gpu else "tokens over the 8 GPUs",
                "table_5a": table_a,
                "table_5b": table_b,
            },
            indent=2,
        ),
    )
    lines = [
        "# Tutel switchable parallelism P1 / P2 on one dgx-a100 node (simulated, Table 5)",
        "",
        "Generated by `python benchmarks/tutel_parallel.py"
        f"{'' if per_gpu else ' --per-step-total'}`"
        " (settings and reading of S in its docstring: S "
        f"{'tokens per GPU' if per_gpu else 'tokens per step over the 8 GPUs'}, top-2 gating, "
        "bf16, forward + backward). "
        "Cells: improvement of the best choice over static P1 / P2 (t_static / t_best - 1), "
        "simulated vs Tutel's Table 5; 'router' is the inline router's pick (O(1) byte count).",
        "",
        "## Table 5a: E2, S2K, V8K, W = 8, M = 2K",
        "",
        "| f | P1 ms | P2 ms | sim: over P1 | sim: over P2 | paper: over P1 | paper: over P2 "
        "| best | router |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in table_a:
        i1, i2 = improvement(r)
        p1, p2 = PAPER_5A[r["f"]]
        lines.append(
            f"| {r['f']} | {r['p1_s'] * 1e3:.3f} | {r['p2_s'] * 1e3:.3f} | {i1:.1f}% | "
            f"{i2:.1f}% | {p1}% | {p2}% | {r['best']} | {_router(r)} |"
        )
    lines += [
        "",
        "## Table 5b: other settings (W = 8, M = 2K)",
        "",
        "| setting | P1 ms | P2 ms | sim: over P1 | sim: over P2 | paper: over P1 | "
        "paper: over P2 | best | router |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in table_b:
        name = f"f{r['f']},E{r['E']},S{r['S'] // 1024}K,V{r['V'] // 1024}K"
        p1, p2 = r["paper"]
        if "adaptive_s" in r:
            i1 = 100 * (r["p1_s"] / r["adaptive_s"] - 1)
            i2 = 100 * (r["p2_s"] / r["adaptive_s"] - 1)
            picks = "/".join(x["best"] for x in r["per_f"])
            routed = "/".join(x["router"] for x in r["per_f"])
            lines.append(
                f"| {name} (total) | {r['p1_s'] * 1e3:.3f} | {r['p2_s'] * 1e3:.3f} | {i1:.1f}% "
                f"| {i2:.1f}% | {p1}% | {p2}% | {picks} | {routed} |"
            )
            continue
        i1, i2 = improvement(r)
        lines.append(
            f"| {name} | {r['p1_s'] * 1e3:.3f} | {r['p2_s'] * 1e3:.3f} | {i1:.1f}% | {i2:.1f}% "
            f"| {p1}% | {p2}% | {r['best']} | {_router(r)} |"
        )
    lines += ["", "Reading: " + _reading(table_a, table_b, per_gpu)]
    atomic_write_text(OUT / "tutel_parallel.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def _router(r: dict) -> str:
    if r["router"] == r["best"]:
        return r["router"]
    cost = r[f"{r['router']}_s"] / min(r["p1_s"], r["p2_s"]) - 1
    return f"{r['router']} (+{100 * cost:.1f}%)"


def agreement(table_a: list[dict], table_b: list[dict]) -> dict:
    """How many of Table 5's settings the simulated best choice gets as Tutel measured."""
    paper_a = {f: ("p2" if p[0] > 0 else "p1") for f, p in PAPER_5A.items()}
    single = [r for r in table_b if "adaptive_s" not in r]
    return {
        "5a": (sum(r["best"] == paper_a[r["f"]] for r in table_a), len(table_a)),
        "5b": (
            sum(r["best"] == ("p2" if r["paper"][0] > 0 else "p1") for r in single),
            len(single),
        ),
        "5a_best": [r["best"] for r in table_a],
    }


def _reading(table_a: list[dict], table_b: list[dict], per_gpu: bool = True) -> str:
    paper_a = {f: ("p2" if p[0] > 0 else "p1") for f, p in PAPER_5A.items()}
    agree_a = sum(r["best"] == paper_a[r["f"]] for r in table_a)
    single = [r for r in table_b if "adaptive_s" not in r]
    agree_b = sum(r["best"] == ("p2" if r["paper"][0] > 0 else "p1") for r in single)
    router = sum(r["router"] == r["best"] for r in table_a + single)
    missed = [
        f"f{r['f']},E{r['E']},S{r['S'] // 1024}K,V{r['V'] // 1024}K"
        for r in single
        if r["best"] != ("p2" if r["paper"][0] > 0 else "p1")
    ]
    return (
        f"the simulated best choice matches Tutel's in {agree_a} of {len(table_a)} Table 5a "
        f"columns and {agree_b} of {len(single)} single-f Table 5b rows (differing: "
        f"{', '.join(missed) or 'none'}); the router agrees "
        f"with the simulated best in {router} of {len(table_a) + len(single)} settings. "
        + (
            "Under the text's reading (S per GPU) P1 wins at every f of Table 5a: with 2K "
            "tokens per GPU P1's all-to-all of f-scaled tokens stays below P2's traffic, so "
            "Table 5a's switch to P2 at small f does not reproduce; `--per-step-total` (S "
            "over the 8 GPUs) matches it, a reading the text does not support. "
            if per_gpu
            else "For E1 (one expert in 8 slices) Tutel measured P1 faster, explaining that "
            "many slices hurt P2; under this reading of S, P2 sends less than half P1's bytes "
            "there (28 vs 60 MiB per GPU and pass), and neither the byte count nor the model "
            "sees another cost of 8 slices (reading S per GPU, the text's, flips E1 to P1 but "
            "makes P1 win all of Table 5a). "
        )
        + "The "
        "router counts bytes sent only (Sec. 3.2); the simulator also charges P2's repeat and "
        "local sum (n times the buffer through HBM) and lets P1's parameter all-gather run "
        "during gating and the dispatch, so near the crossover the two can differ by a few "
        "percent. Compute dominates this single-node setting in the model (A100 GEMMs at 70% "
        "of peak against 240 GB/s NVLink), so simulated gaps are smaller than Tutel's."
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-step-total", action="store_true", help="S over the 8 GPUs")
    main(not ap.parse_args().per_step_total)
