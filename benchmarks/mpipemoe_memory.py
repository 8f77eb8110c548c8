"""MPipeMoE on dgx-a100: memory and time per (n, reuse), the reuse strategies across cluster
sizes (Fig. 13), and the granularity search (Fig. 12), all simulated.

1. memory: GPT-XL's MoE layer (MPipeMoE Table III: M = 2048, H = 8192, 64 experts) on 64 GPUs
   (8 DGX A100, the paper's cluster), top-1, f = 1, fp32, B = 16k and 320k tokens per GPU,
   forward + backward; for n in {1, 2, 4, 8} and reuse in {none, S1..S4}: the engine's peak
   (model states + activations + buffers, max over ranks), Eq. 1-6's prediction, the saving
   ratio against Eq. 6, the makespan, and whether it fits the preset's 80 GB and the paper's
   40 GB A100.
2. fig13: the three Table III layers on 8, 16, 32 and 64 GPUs (B = 8k, n = 4, tf32: the
   paper ran fp32 models on A100s with torch 1.9.0, whose fp32 matmuls run as TF32 by default,
   `allow_tf32` = True from torch 1.7 to 1.11; `FIG13_DTYPE`): the simulated time of every
   reuse strategy, the simulated best, and the Eq. 10 choice with its factors (alpha, beta,
   eta_all). Interference stays the preset's (none): of Fig. 3 the text gives only sigma = 1
   and mu, sigma > 0.5, no values.
3. fig12: Algorithm 1 with simulated trials over batch sizes 1k..64k (GPT-XL, fp16, 8 GPUs).

Results go to benchmarks/results/mpipemoe_memory.{json,md}.

    python benchmarks/mpipemoe_memory.py
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

from sim.core.io import atomic_write_text
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.search.mpipemoe import granularity_online, reuse_times
from sim.strategies import Cluster, build
from sim.workload import memory as mm
from sim.workload.moe import MoELayer

OUT = Path(__file__).resolve().parent / "results"
MODELS = {"GPT-S": (768, 3072), "GPT-XL": (2048, 8192), "BERT-L": (1024, 4096)}  # Table III
REUSE = ("none", "S1", "S2", "S3", "S4")
PAPER_GPU = 40e9  # MPipeMoE Sec. V-A: A100 SXM 40GB
# tokens per GPU: a size from the paper's range (Fig. 9-13: 4k-32k), and one where the
# pipeline without reuse outgrows the paper's 40 GB A100 (about 43 GB in fp32)
BATCHES = (16384, 327680)
FIG13_DTYPE = "tf32"  # fp32 models on A100 under torch 1.9.0 (MPipeMoE Sec. IV): TF32 GEMMs


def cluster(nodes: int) -> Cluster:
    topo = Topology.load("dgx-a100", nodes=nodes)
    return Cluster(topo, CostModel.build(topo, {}))


def layer(gpus: int, B: int, model: str, experts: int, dtype: str) -> MoELayer:
    M, H = MODELS[model]
    return MoELayer(
        batch=B // 256,
        seq_len=256,
        model_dim=M,
        hidden_dim=H,
        experts=experts,
        world=gpus,
        top_k=1,
        capacity_factor=1.0,
        dtype=dtype,
    )


def memory_study() -> list[dict]:
    cl = cluster(8)
    rows = []
    for tokens, n in itertools.product(BATCHES, (1, 2, 4, 8)):
        L = layer(64, tokens, "GPT-XL", 64, "fp32")
        M, H = MODELS["GPT-XL"]
        B = L.experts * L.capacity
        fp = mm.footprint(B, M, H, L.experts, n, L.local_experts)
        times = reuse_times(L, cl, n)
        base = times["none"]["peak_bytes"]
        for s in REUSE:
            peak = times[s]["peak_bytes"]
            model = (fp.total if s == "none" else fp.total_reuse) * L.elem
            rows.append(
                {
                    "B": B,
                    "n": n,
                    "reuse": s,
                    "makespan_ms": times[s]["makespan_s"] * 1e3,
                    "peak_GB": peak / 1e9,
                    "eq_GB": model / 1e9,
                    "saving_ratio": (base - peak) / base,
                    "eq6_ratio": 0.0 if s == "none" else fp.ratio,
                    "fits_80GB": peak <= float(cl.topology.gpu["memory_bytes"]),
                    "fits_40GB": peak <= PAPER_GPU,
                }
            )
    return rows


def fig13_study(dtype: str = FIG13_DTYPE) -> list[dict]:
    rows = []
    for model in MODELS:
        for gpus in (8, 16, 32, 64):
            cl = cluster(gpus // 8)
            L = layer(gpus, 8192, model, gpus, dtype)
            t = {s: v["makespan_s"] for s, v in reuse_times(L, cl, 4).items()}
            g = build("mpipemoe", L, {"degree": 4}, ("fwd",), cl)
            info = g.meta["selector"]
            best = min(REUSE[1:], key=t.get)
            rows.append(
                {
                    "model": model,
                    "gpus": gpus,
                    **{f"{s}_ms": t[s] * 1e3 for s in REUSE},
                    "sim_best": best,
                    "eq10": g.meta["reuse"],
                    "eq10_slowdown": t[g.meta["reuse"]] / t[best] - 1,
                    "alpha": info["alpha"],
                    "beta": info["beta"],
                    "eta_all": info["eta_all"],
                    "mu_all": info["mu_all"],
                }
            )
    return rows


def fig12_study() -> list[dict]:
    L = layer(8, 1024, "GPT-XL", 8, "fp16")
    batches = [1024, 2048, 4096, 8192, 16384, 24576, 32768, 65536, 12288, 4096]
    hist, search, timer = granularity_online(L, cluster(1), batches, candidates=[1, 2, 4, 8, 16])
    for h in hist:
        h["times_ms"] = {n: t * 1e3 for (b, n), t in sorted(timer.cache.items()) if b == h["B"]}
    return hist


def main() -> None:
    t0 = time.perf_counter()
    mem = memory_study()
    t1 = time.perf_counter()
    fig13 = fig13_study()
    t2 = time.perf_counter()
    fig12 = fig12_study()
    t3 = time.perf_counter()
    data = {
        "memory": mem,
        "fig13": fig13,
        "fig12": fig12,
        "wall_s": {"memory": t1 - t0, "fig13": t2 - t1, "fig12": t3 - t2},
    }
    OUT.mkdir(exist_ok=True)
    atomic_write_text(OUT / "mpipemoe_memory.json", json.dumps(data, indent=1))
    atomic_write_text(OUT / "mpipemoe_memory.md", report(data))
    print(report(data))


def report(d: dict) -> str:
    out = [
        "# MPipeMoE: memory, reuse strategies and granularity on dgx-a100 (simulated)",
        "",
        "Generated by `python benchmarks/mpipemoe_memory.py` "
        f"(wall time: {', '.join(f'{k} {v:.0f} s' for k, v in d['wall_s'].items())}).",
        "",
        "## Peak memory and time per (n, reuse)",
        "",
        "GPT-XL's MoE layer (M = 2048, H = 8192, 64 experts, MPipeMoE Table III) on 64 GPUs, "
        "top-1, f = 1, fp32, B tokens per GPU, forward + backward. Peak: the engine's "
        "tracked model states + activations + buffers (max over ranks); Eq.: Eq. 1 + 4 without "
        "reuse, minus twice Eq. 5 with it.",
        "",
        "| B | n | reuse | makespan (ms) | peak (GB) | Eq. (GB) | saving | Eq. 6 phi "
        "| fits 80 GB | fits 40 GB |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in d["memory"]:
        out.append(
            f"| {r['B']} | {r['n']} | {r['reuse']} | {r['makespan_ms']:.2f} | {r['peak_GB']:.2f} | "
            f"{r['eq_GB']:.2f} | {r['saving_ratio']:.1%} | {r['eq6_ratio']:.1%} | "
            f"{'yes' if r['fits_80GB'] else 'OOM'} | {'yes' if r['fits_40GB'] else 'OOM'} |"
        )
    out += [
        "",
        "## Reuse strategies across cluster sizes (Fig. 13)",
        "",
        f"B = 8k tokens per GPU, n = 4, {FIG13_DTYPE}, one expert per GPU. Times in ms; "
        "`eq10` is the "
        "strategy the Eq. 10 selector picks from the cost model (alpha = t_comm / t_comp, "
        "beta = t_mem / t_comp per micro-batch unit; eta_all = copy speed beside "
        "communication, from the PCIe link the copies share with the NIC traffic).",
        "",
        "| model | GPUs | none | S1 | S2 | S3 | S4 | sim best | eq10 | eq10 vs best | alpha "
        "| beta | eta_all |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in d["fig13"]:
        out.append(
            f"| {r['model']} | {r['gpus']} | "
            + " | ".join(f"{r[f'{s}_ms']:.2f}" for s in REUSE)
            + f" | {r['sim_best']} | {r['eq10']} | {r['eq10_slowdown']:+.1%} | "
            f"{r['alpha']:.2f} | {r['beta']:.2f} | {r['eta_all']:.2f} |"
        )
    out += [
        "",
        "## Granularity search (Algorithm 1, Fig. 12)",
        "",
        "GPT-XL, fp16, 8 GPUs, no reuse; batch sizes in arrival order; trials are simulated "
        "steps at the n the ranges around B allow.",
        "",
        "| iteration | B | n | trials | simulated ms per n tried (this B) |",
        "|---:|---:|---:|---:|---|",
    ]
    for h in d["fig12"]:
        tried = ", ".join(f"{n}: {t:.2f}" for n, t in h["times_ms"].items())
        out.append(f"| {h['iteration']} | {h['B']} | {h['n']} | {h['trials']} | {tried} |")
    out += ["", READING]
    return "\n".join(out) + "\n"


READING = """Reading:
- Memory: for n >= 4 the engine's peaks equal Eq. 1-6 (the builder allocates what the model
  counts, B divides evenly into micro-batches; the model states add the experts' biases,
  0.16 MB, which Eq. 1 leaves out), so the saving ratio is Eq. 6's phi for every reuse
  strategy; the paper measured about 95% of it on GPUs, where the allocator and small
  tensors (routing data) add what the model leaves out. The four strategies save the same
  memory and differ only in time. Every builder frees a gradient after its last reader
  (`sim/strategies/activations.py`), so small n hold less than Eq. 4's every gradient at
  once: n = 1 holds Eq. 2 + Eq. 3 (sequential) and dT_I, which arrives while fc1's weight
  gradient still holds dT_M (MPipeMoE sends the dispatch gradient right after fc1's input
  gradient), 2BM below Eq. 4; at n = 2 the last combine gradient leaves before the first
  dispatch gradient (S1 S2 R1 R2), so dT_O is gone before dT_I comes (BM below), and each
  ring slot has one tenant, freed after its reader, so reuse saves more than Eq. 5. At 320k
  tokens per GPU the pipeline without reuse (n >= 2) outgrows the paper's 40 GB A100, the
  sequential layer (n = 1) just fits, and every reuse strategy with n >= 2 fits.
- Memory against the paper's ~95%: the engine's saving equals Eq. 6 by construction (the
  builder allocates what the formulas count). What the paper's GPUs add is not modelled: the
  caching allocator's rounding and fragmentation and the gate's routing tensors (indices,
  locations, scores: a few bytes per token, Sec. V-C leaves them out too).
- Fig. 13, in TF32 as the paper's A100s under torch 1.9.0 ran its fp32 models: offloading
  (S1/S2) is the slowest choice at every size, on one node too: a T_M copy over PCIe takes
  several TF32 GEMMs and only fc2 can hide it before the next micro-batch needs the slot. The
  paper's "S1 and S2 perform better when N is small" does not reproduce; recomputation (S4,
  then S3) wins everywhere, S4 beats S2 on 32-64 GPUs as the paper says, and Eq. 10 picks the
  simulated best in every setting. (In fp32 on CUDA cores, the reading recorded before issue
  26, the slow GEMMs hide the copies and offload ties or wins on one node.) Interference
  stays at the preset's 1.0: of Fig. 3 the text gives only sigma = 1 and mu, sigma > 0.5.
- Fig. 12: the best n grows with B (n = 1-2 up to 4k tokens, 4 for 8k-16k, 8 from 24k; the
  paper's Fig. 12: 2 below 8k, 4 for 8k-22k, 8 above), and Algorithm 1 needs fewer trials per
  new B as its ranges fill in; a B inside a range or seen before costs none.
"""


if __name__ == "__main__":
    main()
