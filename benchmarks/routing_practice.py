"""Routing as it is in practice, measured in moesim against what the sources publish.

1. NVIDIA's token-imbalance workloads W0-W7 (NVIDIA/Megatron-LM PR #7488, its README's
   results table as posted on issue #6757) on the PR's settings: 8 experts, top-2, 128 tokens
   per rank (also top-4 / 512 and top-2 / 2,048), hidden 512, expert FFN 1,024, bf16, EP 1, 2
   and 4 inside one node, dropless (Megatron-Core's all-to-all dispatcher). "dispatch only"
   is the layer's forward without a router (permute, all-to-allv, the experts, combine);
   "MoE fwd+bwd" adds the backward. The PR names no GPU: dgx-h100 is used. The times are the
   slowest rank's, as the PR reports; its step is 0 (the PR's default `--steps 1`).
2. DeepEP's intra-host imbalance (deepseek-ai/DeepEP issue #343): EP32 on 4 nodes of 8,
   256 experts, top-8, 4,096 tokens per rank, hidden 7,168, nodes balanced and the GPUs of
   each node not (`lognormal` node max/mean 1, gpu max/mean 1.5-3): DeepEP's dispatch and
   combine times against balanced routing (the issue reports ~2x).
3. DeepSeek-V3's training step at NVIDIA's published layouts (`moesim predict` rows of
   ../shared/reference/published-runs/megatron_bridge_perf.csv) with the hottest EP rank's
   routed rows at 1.3-4.0 times the mean (UltraEP, arXiv 2606.04101: 1.30-4.01 measured; its
   balancing gains 1.49x on average): the step-time penalty against balanced routing.

Writes benchmarks/results/routing_practice.md. `python benchmarks/routing_practice.py`.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.engine.engine import simulate  # noqa: E402
from sim.hardware.costs import CostModel  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from sim.strategies import Cluster, build  # noqa: E402
from sim.workload.moe import MoELayer  # noqa: E402
from sim.workload.routing.imbalance import NAMES, WORKLOADS  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "routing_practice.md"
TABLE = ROOT.parent / "shared" / "reference" / "published-runs" / "megatron_bridge_perf.csv"
# NVIDIA/Megatron-LM PR #7488 README, "Measured results" (worst-rank median, ms), one node
PUBLISHED = {
    ("dispatch only", 1, 2, 128): [1.346, 1.275, 1.436, 1.191, 1.305, 1.108, 1.297, 1.313],
    ("dispatch only", 2, 2, 128): [1.806, 3.606, 4.714, 1.956, 4.866, 4.746, 4.427, 1.831],
    ("dispatch only", 4, 2, 128): [4.710, 3.292, 1.568, 1.589, 1.579, 2.570, 4.791, 1.611],
    ("dispatch only", 2, 4, 512): [4.941, 1.644, 1.751, 2.624, 1.730, 2.686, 2.763, 1.782],
    ("dispatch only", 2, 2, 2048): [2.314, 2.665, 2.457, 2.729, 2.457, 1.915, 3.113, 5.206],
    ("MoE fwd+bwd", 1, 2, 128): [2.661, 2.083, 1.981, 2.745, 1.519, 1.202, 2.315, 2.544],
    ("MoE fwd+bwd", 2, 2, 128): [3.252, 3.001, 3.113, 2.749, 3.017, 3.722, 3.023, 3.024],
}
MODES = {"dispatch only": ("fwd",), "MoE fwd+bwd": ("fwd", "bwd")}


def ranks(x) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank (times within 0.1% tie)."""
    x = np.asarray(x, dtype=float)
    r = np.empty(len(x))
    order = np.argsort(x, kind="stable")
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] <= x[order[i]] * 1.001:
            j += 1
        r[order[i : j + 1]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a, b) -> float | None:
    """Rank correlation; None where one side's times all tie."""
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def fmt_rho(rho: float | None) -> str:
    return "n/a (moesim's times tie)" if rho is None else f"{rho:+.2f}"


def layer_time(layer: MoELayer, topo: Topology, strategy: str, passes, params=None) -> tuple:
    costs = CostModel.build(topo, {})
    g = build(strategy, layer, params or {}, passes, Cluster(topo, costs))
    res = simulate(g, topo, costs)
    steps: dict[str, float] = {}
    for i, t in enumerate(g):
        s = t.tags.get("step")
        if s in ("dispatch", "combine"):
            # from the last member's arrival: a member's wait for the others is not transfer
            took = float(res.end[i] - res.start[i] - res.sync_wait[i])
            steps[s] = max(steps.get(s, 0.0), took)
    return res.makespan, steps, g.meta["tokens_per_layer"]


def workloads(lines: list[str]) -> None:
    topo = Topology.load("dgx-h100", nodes=1)
    lines += [
        "## 1. W0-W7 (NVIDIA/Megatron-LM PR #7488) on the PR's settings",
        "",
        "Slowest rank's layer time in moesim (sequential strategy, dropless, dgx-h100), the "
        "receivers' max/mean load, and the rank correlation (Spearman) with the published "
        "times of the same configuration.",
        "",
    ]
    corrs = []
    for (mode, ep, k, T), pub in PUBLISHED.items():
        ms, loads = [], []
        for w in WORKLOADS:
            layer = MoELayer(
                1,
                T,
                512,
                1024,
                8,
                ep,
                top_k=k,
                routing={"kind": "imbalance", "workload": w},
                dropless=True,
            )
            span, _, tok = layer_time(layer, topo, "sequential", MODES[mode])
            ms.append(span * 1e3)
            loads.append(tok["gpu_load_max_mean"])
        rho = spearman(ms, pub)
        corrs.append((mode, ep, k, T, rho, max(ms) / min(ms), max(pub) / min(pub)))
        order = " > ".join(WORKLOADS[i] for i in np.argsort(ms)[::-1])
        porder = " > ".join(WORKLOADS[i] for i in np.argsort(pub)[::-1])
        lines += [
            f"### {mode}, EP {ep}, top-{k}, {T} tokens per rank",
            "",
            "| workload | receivers' max/mean | moesim (ms) | published (ms) |",
            "|---|---:|---:|---:|",
            *(
                f"| {w} {NAMES[w]} | {loads[i]:.2f} | {ms[i]:.3f} | {pub[i]:.3f} |"
                for i, w in enumerate(WORKLOADS)
            ),
            "",
            f"- slowest to fastest, moesim: {order}",
            f"- slowest to fastest, published: {porder}",
            f"- Spearman {fmt_rho(rho)}; spread (max/min) moesim {max(ms) / min(ms):.2f}x, "
            f"published {max(pub) / min(pub):.2f}x",
            "",
        ]
    lines += [
        "### Summary",
        "",
        "| mode | EP | top-k | tokens | Spearman vs published | spread moesim | spread published |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {m} | {ep} | {k} | {T} | {fmt_rho(rho)} | {a:.2f}x | {b:.2f}x |"
            for m, ep, k, T, rho, a, b in corrs
        ),
        "",
        "Reading. moesim times each layer's GPU work and transfers: 0.05-0.2 ms at these "
        "sizes (128 tokens of width 512), ordered by the hottest receiver's load (W1, W2, W6 "
        "and W5 slowest; W0, W3, W4, W7 near balanced; at EP 1 there is no exchange and the "
        "times tie). The published times are 1.1-5.2 ms, 20-60x the GPU work: they are host-"
        "bound (the PR's experts run as a per-expert Python loop without grouped GEMM, the "
        "dispatcher syncs the host for the splits) on a node the PR says was shared with other "
        "tenants, and they do not follow the load: W1 and W2 are the same rule in the PR's "
        "code yet differ 2.1x at EP 4, the balanced W0 is the second slowest at EP 4 and the "
        "slowest at top-4, and W4 (near uniform) is the slowest at EP 2. The issue's target "
        "(moesim's W0-W7 ranking equal to the published single-node ranking) is not reached "
        "and cannot be by a model driven by the loads; the spread moesim gives "
        f"({min(c[5] for c in corrs):.2f}-{max(c[5] for c in corrs):.2f}x) is set beside "
        "the published 1.30-3.06x above.",
        "",
    ]


def deepep_intra_host(lines: list[str]) -> None:
    topo = Topology.load("dgx-h100", nodes=4)
    base = dict(batch=1, seq_len=4096, model_dim=7168, hidden_dim=2048, experts=256, world=32)
    cases = [("balanced (uniform)", {"kind": "uniform"})] + [
        (
            f"nodes 1.0, GPUs in a node {x}",
            {"kind": "lognormal", "node": {"max_mean": 1.0}, "gpu": {"max_mean": x}, "seed": 1},
        )
        for x in (1.5, 2.0, 3.0)
    ]
    lines += [
        "## 2. DeepEP with intra-host imbalance (deepseek-ai/DeepEP issue #343)",
        "",
        "EP32 = 4 dgx-h100 nodes, 256 experts, top-8, 4,096 tokens per rank, hidden 7,168, "
        "DeepEP normal kernels (bf16 dispatch, 24 SMs), forward; the slowest rank's dispatch "
        "and combine from the last member's arrival (waits for the others excluded).",
        "",
        "| routing | receivers' max/mean | dispatch (us) | combine (us) | dispatch vs balanced |",
        "|---|---:|---:|---:|---:|",
    ]
    ref = None
    for label, routing in cases:
        layer = MoELayer(**base, top_k=8, routing=routing, dropless=True)
        _, steps, tok = layer_time(layer, topo, "deepep", ("fwd",), {"dispatch_dtype": "bf16"})
        d, c = steps.get("dispatch", 0.0), steps.get("combine", 0.0)
        ref = ref or d
        lines.append(
            f"| {label} | {tok['gpu_load_max_mean']:.2f} | {d * 1e6:.0f} | {c * 1e6:.0f} | "
            f"{d / ref:.2f}x |"
        )
    lines += [
        "",
        "Reading. The issue reports about 2x lower throughput with nodes balanced and GPUs "
        "skewed inside them (its figures are screenshots; the skew it used is not given). In "
        "moesim DeepEP's dispatch stays bound by the RDMA leg, which a balanced node split "
        "keeps even (each remote owner's tokens enter through its same-local-index "
        "forwarder); the hot GPU's extra rows ride NVLink and its kernel's SMs (24 x 14 GB/s, "
        "sending and receiving), which have headroom up to a receivers' max/mean of about 3. "
        "Not modelled: the back-pressure of DeepEP's per-channel buffers (a slow receiver "
        "stalls the forwarders' RDMA queues) and the share of a channel's warps that receive; "
        "both would carry the hot GPU's slowdown to the whole exchange. The gap stands.",
        "",
    ]


def step_penalty(lines: list[str], rows: list[int]) -> None:
    from sim.training.predict import parse_row, predict_run

    table = list(csv.DictReader(TABLE.open()))
    lines += [
        "## 3. DeepSeek-V3's step with imbalanced routing (published layouts)",
        "",
        "`moesim predict` of the published rows with `routing_max_mean` (the hottest EP "
        "rank's routed rows over the mean): tokens/s/GPU and the slowdown against balanced "
        "routing. UltraEP measured 1.30-4.01 without balancing and a 1.49x average gain from "
        "balancing to 1.01-1.04.",
        "",
        "| row | system | layout | published | 1.0 | 1.3 | 2.0 | 3.0 | 4.0 |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i in rows:
        cols = table[i - 1]
        tps = []
        for m in (1.0, 1.3, 2.0, 3.0, 4.0):
            r = predict_run(parse_row(dict(cols, routing_max_mean=str(m)), i))
            tps.append(r["predicted_tokens_per_s_per_gpu"])
        cells = [f"{tps[0]:.0f}"] + [f"{t:.0f} ({tps[0] / t:.2f}x)" for t in tps[1:]]
        layout = (
            f"{cols['gpus']} GPUs, TP{cols['tp']} PP{cols['pp']} EP{cols['ep']} {cols['precision']}"
        )
        lines.append(
            f"| {i} | {cols['system']} | {layout} | {cols['tokens_per_s_per_gpu']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Reading. Every EP all-to-all waits for its hottest rank, so the MoE part of each "
        "layer slows with the max/mean while attention, the dense layers and the pipeline do "
        "not: the penalty is below the max/mean and larger where MoE work dominates the step "
        "(EP 64 more than EP 8). UltraEP's 1.49x average gain from balancing corresponds to "
        "a max/mean near 2 at the EP 64 layouts here, inside its measured 1.30-4.01.",
        "",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows", default="9,52,10", help="published rows for part 3 (1-based, as predict --row)"
    )
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    t0 = time.time()
    load = os.getloadavg()[0]
    lines = [
        "# Routing in practice: imbalance workloads, DeepEP intra-host skew, step penalty",
        "",
        f"Generated by `python benchmarks/routing_practice.py` on "
        f"{datetime.date.today().isoformat()}: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, 1-min load {load:.2f}. "
        "Simulated figures only; no parameter was fitted to any of them.",
        "",
    ]
    workloads(lines)
    deepep_intra_host(lines)
    step_penalty(lines, [int(r) for r in a.rows.split(",") if r])
    lines.append(f"Wall time {time.time() - t0:.0f} s.")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
