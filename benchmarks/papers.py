"""The founding papers' claims (PipeMoE, MPipeMoE, Tutel, Parm, Lancet; and DeepEP's, Megatron's
and DualPipe's published figures), claim by claim, against moesim on each paper's own
settings (issue 26): one table, `benchmarks/results/papers.md`: the paper's value, moesim's,
a verdict (reproduced / trend / not reproduced / not modelled) and why.

Each row comes from a benchmark module's functions: the cheap ones run here, the long sweeps
are read from the results their modules recorded on the paper's settings (the row names the
file; `pipemoe_selector.json`'s settings are checked). `--quick` skips MPipeMoE's memory
study and Fig. 13 (about two minutes).

    python benchmarks/papers.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    deepep_h800,
    megatron_ep,
    mpipemoe_memory,
    pipemoe_selector,
    tutel_parallel,
)
from benchmarks import parm as parm_bench  # noqa: E402
from benchmarks.common import RESULTS, machine, record  # noqa: E402

VERDICTS = ("reproduced", "trend", "not reproduced", "not modelled")


def row(paper: str, claim: str, value: str, sim: str, verdict: str, why: str) -> dict:
    assert verdict in VERDICTS, verdict
    keys = ("paper", "claim", "paper_value", "moesim", "verdict", "why")
    return dict(zip(keys, (paper, claim, value, sim, verdict, why), strict=True))


def _load(name: str) -> dict:  # a results file a module recorded
    return json.loads((RESULTS / f"{name}.json").read_text())


def pipemoe() -> list[dict]:
    d = _load("pipemoe_selector")
    if (d.get("dtype"), d.get("passes")) != ("fp16", ["fwd", "bwd"]):
        raise SystemExit("pipemoe_selector.json is not on the paper's settings: rerun it")
    c = d["settings"]["contention"]
    part = "the whole grid" if d["step"] == 1 else f"1 in {d['step']}"
    src = f"(pipemoe_selector.json: {d['cases']} layers of Table IV, {part})"
    rows_ = d["rows"]
    t = [{int(r): v for r, v in x["contention"].items()} | {0: x["chosen"]} for x in rows_]
    fixed = {r: sum(x[r] / x[x[0]] - 1 for x in t) / len(t) for r in pipemoe_selector.DEGREES}
    best = {k: v for k, v in c["best_histogram"].items() if v}
    out = [
        row(
            "PipeMoE",
            "Theorem 1's degree is as good as the best of {1, 2, 4, 8} (Sec. V-C)",
            "86.1% of 522 layers (real runs)",
            f"{c['within_0.5pct']:.1f}% within 0.5% of the simulated best, {c['agree_pct']:.1f}%"
            f" equal, worst {c['worst_slowdown_pct']:.1f}% slower {src}",
            "reproduced" if c["within_0.5pct"] >= 84 else "trend",
            "fp16 forward + backward on the preset's flows and 0.8x communication beside "
            "compute. Theorem 1 models the forward (Eq. 9-12) and the backward's pipeline "
            "differs: on the selector's own alpha-beta costs it matches in "
            f"{d['settings']['ideal']['within_0.5pct']:.0f}% (100% in forward only)",
        ),
        row(
            "PipeMoE",
            "the best degree varies: each of {1, 2, 4, 8} best somewhere (Fig. 4, Table VI)",
            "all four degrees best in some layers",
            "simulated best degree (layers): " + ", ".join(f"{k}: {v}" for k, v in best.items()),
            "reproduced" if len(best) == 4 else "trend" if len(best) > 1 else "not reproduced",
            "Fig. 6's fitted all-to-all start-up (0.02-0.78 ms) is paid per chunk, so degree "
            "8 rarely pays; in fp32 forward only (the reading before issue 26) the best was "
            "1 or 2 in every layer",
        ),
        row(
            "PipeMoE",
            "adaptive degree over each fixed degree, mean (Table VI)",
            "3.4-17.2% (16-64 GPUs)",
            ", ".join(f"r={r}: {100 * v:.1f}%" for r, v in fixed.items()) + f" {src}",
            "trend",
            "the adaptive degree gains over every fixed one, as in the paper, but over r = 8 "
            "far more (the fitted per-chunk all-to-all start-up makes fine chunks costly) "
            "and over r = 2, the grid's usual best, less",
        ),
    ]
    ve = pipemoe_selector.sec_ve()
    alone, ar = ve["contention"], ve["contention + DP all-reduce"]
    out.append(
        row(
            "PipeMoE",
            "Sec. V-E: beside the DP all-reduce, degree 8 beats the pick (2)",
            "r=2 289 ms, r=8 253 ms",
            f"pick {ve['chosen']}; alone r=2 {alone[2]:.0f} / r=8 {alone[8]:.0f} ms; beside a "
            f"4M^2 fp16 all-reduce r=2 {ar[2]:.0f} / r=8 {ar[8]:.0f} ms, best "
            f"{min(ar, key=ar.get)}",
            "reproduced" if min(ar, key=ar.get) == 8 else "not reproduced",
            "the all-reduce shares the NIC with every degree's all-to-all alike; finer chunks "
            "gain nothing from it in the flow model (the all-reduce's size is assumed)",
        )
    )
    return out


def mpipemoe(quick: bool) -> list[dict]:
    out = []
    if not quick:
        mem = mpipemoe_memory.memory_study()
        big = [r for r in mem if r["n"] >= 4 and r["reuse"] != "none"]
        share = [r["saving_ratio"] / r["eq6_ratio"] for r in big]
        out.append(
            row(
                "MPipeMoE",
                "memory saving of the reuse strategies against Eq. 6's bound (Fig. 10)",
                "about 95% of the bound",
                f"{100 * min(share):.1f}-{100 * max(share):.1f}% at n >= 4 (GPT-XL, 64 GPUs, "
                "16k and 320k tokens per GPU)",
                "not modelled",
                "by construction: the builder allocates what Eq. 1-6 count; the caching "
                "allocator's rounding and the routing tensors (the paper's missing ~5%) are "
                "not modelled",
            )
        )
        f13 = mpipemoe_memory.fig13_study()
        at = {g: [r for r in f13 if r["gpus"] == g] for g in (8, 16, 32, 64)}

        def offload_best(rs: list[dict]) -> int:
            return sum(min(r["S1_ms"], r["S2_ms"]) < min(r["S3_ms"], r["S4_ms"]) for r in rs)

        s4 = sum(r["S4_ms"] < r["S2_ms"] for g in (32, 64) for r in at[g])
        eq = sum(r["eq10"] == r["sim_best"] for r in f13)
        dt = mpipemoe_memory.FIG13_DTYPE
        out += [
            row(
                "MPipeMoE",
                "Fig. 13: offload (S1/S2) best at 8 GPUs, worse at 64",
                "S1/S2 better at N = 8",
                f"S1/S2 best in {offload_best(at[8])} of 3 models at 8 GPUs, "
                f"{offload_best(at[64])} of 3 at 64 ({dt}, B = 8k, n = 4)",
                "reproduced" if offload_best(at[8]) >= 2 else "not reproduced",
                "with TF32 GEMMs (torch 1.9 on A100) a T_M copy over PCIe takes several "
                "GEMMs, so offload stalls even on one node; only fp32 CUDA-core GEMMs (the "
                "old reading) hide it. Interference: the text gives sigma = 1 only",
            ),
            row(
                "MPipeMoE",
                "Fig. 13: S4 beats S2 on 32 and 64 GPUs",
                "S4 < S2 at N = 32, 64",
                f"{s4} of 6 (model, N) settings",
                "reproduced" if s4 >= 5 else "trend",
                "copies share each GPU's PCIe link with the NIC traffic (eta_all ~0.28)",
            ),
            row(
                "MPipeMoE",
                "Eq. 10 picks the best reuse strategy",
                "chosen online (no rate given)",
                f"Eq. 10 = simulated best in {eq} of {len(f13)}",
                "reproduced" if eq >= 0.8 * len(f13) else "trend",
                "the selector's cost model and the simulation agree where copies dominate",
            ),
        ]
    f12 = mpipemoe_memory.fig12_study()
    picks = {h["B"]: h["n"] for h in f12}
    out.append(
        row(
            "MPipeMoE",
            "Fig. 12: the granularity n found online grows with B",
            "n = 2 below 8k, 4 for 8k-22k, 8 above",
            ", ".join(f"{b // 1024}k: {n}" for b, n in sorted(picks.items())),
            "reproduced",
            "Algorithm 1 over simulated trials (GPT-XL, fp16, 8 GPUs); a start-up cost per "
            "micro-batch and the pipeline fill decide the same way",
        )
    )
    return out


def tutel() -> list[dict]:
    a, b = tutel_parallel.tables(per_gpu=True)
    ag = tutel_parallel.agreement(a, b)
    old = tutel_parallel.agreement(*tutel_parallel.tables(per_gpu=False))
    x = _load("tutel_2dh_crossover")
    gain = {r["gpus"]: r["linear_s"] / r["2dh_s"] for r in x["rows"] if r["size"] == 1 << 20}
    top = max(gain)
    g2k = gain.get(2048, gain[top])
    # 2DH's two stride copies (Alg. 3) against its whole time, 1 MiB at 2,048 GPUs
    two_dh = {r["gpus"]: r["2dh_s"] for r in x["rows"] if r["size"] == 1 << 20}
    intra = x["intra_node_128mib_8gpus_s"]
    copies = 2 * x["2dh_stride_copy_s"][str(1 << 20)] / two_dh.get(2048, two_dh[top])
    paper = {"16_256": 491.3 / 189.1 - 1, "64_256": 491.3 / 323.8 - 1}  # Table 1's ms
    fits = ", ".join(
        f"{int(size) >> 20} MiB"
        for size, grow in x["linear_growth"].items()
        if all(1 / 1.5 <= grow[k] / paper[k] <= 1.5 for k in paper)
    )
    return [
        row(
            "Tutel",
            "Table 5a: P2 for small f, P1 for large f (E2, S2K, V8K, one node)",
            "P2 at f = 1, 2; P1 at 4-16",
            f"best {'/'.join(ag['5a_best'])} at f = 1-16: {ag['5a'][0]} of {ag['5a'][1]} "
            f"(5b: {ag['5b'][0]} of {ag['5b'][1]}); S over 8 GPUs instead: {old['5a'][0]} of "
            f"{old['5a'][1]}",
            "not reproduced",
            "S (tokens/step) is tokens per GPU by Fig. 7's shapes (16384 tokens as "
            "B(2048, dE, 8, M) on 2,048 GPUs); at 2K tokens per GPU P1's all-to-all stays "
            "cheaper than P2's traffic at every f",
        ),
        row(
            "Tutel",
            "2DH over linear all-to-all, 1 MiB per GPU, 2,048 GPUs (Fig. 20)",
            "20.7x",
            f"{g2k:.2f}x at 2,048, {gain[top]:.2f}x at {top} (tutel_2dh_crossover.json)",
            "reproduced"
            if 1 / 1.5 <= g2k / 20.7 <= 1.5
            # the paper's shape: the gain grows from ~10x at 1,024 GPUs to 20.7x at 2,048
            else "trend"
            if g2k > gain.get(1024, g2k)
            else "not reproduced",
            "2DH wins from 32 GPUs up as in the paper; the NICs' per-connection cost (conn_cost, "
            "from PipeMoE Fig. 6) now stops growing at the 256 peers NCCL 2.10 serves at once "
            "(conn_inflight: 32 p2p channels x 8 peers per work), so past 256 GPUs the gain "
            f"stays near the 8 GPUs per node: {gain.get(1024, 0):.1f}x at 1,024 (paper ~10x), "
            f"{g2k / 20.7:.2f}x the paper's at 2,048 (issue 26 part 1's target: within 1.5x, "
            "missed: the paper's gain doubles from 1,024 to 2,048 GPUs, which no cost bounded by "
            "the peers in flight gives; unbounded it was 34.4x); 2DH's two stride copies "
            f"(Alg. 3) are modelled and take {copies:.1%} of its time there",
        ),
        row(
            "Tutel",
            "Sec. 3.4: intra-node all-to-all of S = 128 MiB, m = n = 8 (2DH's NVLink phase)",
            "~600 us",
            f"{intra * 1e6:.0f} us (tutel_2dh_crossover.json, dgx-a100)",
            "reproduced" if 1 / 1.5 <= intra / 600e-6 <= 1.5 else "not reproduced",
            "NVLink3 at its assumed 80% efficiency plus 1 us per message; the paper's growth to "
            "~5 ms at 2,048 GPUs is its naive aggregation's non-contiguous access, which 2DH's "
            "stride copies avoid and moesim does not model",
        ),
        row(
            "Tutel",
            "Table 1: all-to-all time grows with the GPUs (16, 64, 256)",
            "+160% (16 to 256), +52% (64 to 256)",
            f"within 1.5x of both at {fits} per GPU (linear algorithm, dgx-a100)"
            if fits
            else "no size within 1.5x of both",
            "trend",
            "the table does not state its all-to-all size; the growth at the sizes listed "
            "matches, smaller messages grow faster (the per-connection cost), larger slower",
        ),
    ]


def parm() -> list[dict]:
    d = _load("parm")
    tb = d["testbeds"]
    part = "the whole grid" if d["grid_step"] == 1 else f"1 layer in {d['grid_step']}"
    src = f"(parm.json: (N_MP, N_ESP) {', '.join(f'({m},{e})' for m, e in d['degrees'])}, {part})"
    lo = min(s["speedup"]["min"] for s in tb.values())
    hi = max(s["speedup"]["max"] for s in tb.values())
    never = min(min(s["s1_never_slower_pct"], s["s2_never_slower_pct"]) for s in tb.values())
    pick = min(s["selector_picks_faster_pct"] for s in tb.values())
    saa = {k.split(":")[0]: s["saa_gain_mp_pct"] for k, s in tb.items()}
    return [
        row(
            "Parm",
            "Parm over DeepSpeed-MoE's MP+EP+ESP baseline, whole Table III grid",
            "1.13-5.77x",
            f"{lo:.2f}-{hi:.2f}x {src}",
            "reproduced" if lo < 1.5 and hi > 4 else "trend",
            "with N_MP or N_ESP = 1 in the grid the floor comes down to the paper's; the "
            "model carries no framework overhead",
        ),
        row(
            "Parm",
            "S1 and S2 never slower than the baseline",
            "all cases",
            f"{never:.1f}% of layers",
            "reproduced" if never == 100 else "not reproduced",
            "PauseMP removes the duplicate expert work and the ESP collectives",
        ),
        row(
            "Parm",
            "Algorithm 1 picks the faster of S1 and S2",
            "selection 8-10.5% over the worse",
            f"faster one in {pick:.1f}% of layers",
            "reproduced" if pick >= 90 else "trend",
            "fits from simulated microbenchmarks plus each schedule's computation",
        ),
        row(
            "Parm",
            "SAA over AAS (the all-to-all and MP-AllGather in sequence), mean",
            "1.09% (A), 1.12% (B)",
            "; ".join(
                f"{k}: {v['mean']:+.1f}% ({v['min']:+.1f}..{v['max']:+.1f}%)"
                for k, v in saa.items()
            )
            + " over layers with N_MP > 1",
            "trend",
            "the paper gives a mean only. By (N_MP, N_ESP) the mean gain runs "
            + "; ".join(f"{k} {v}" for k, v in parm_bench.saa_by_degrees(tb).items())
            + ": SAA gains with the all-gather's share (N_MP = 4, small N_ESP) and with the "
            "tokens, and loses where the all-to-all split into one-peer rounds, each with "
            "its own start-up, costs more than the all-gather it hides. The flow model "
            "lets the all-gather (intra-node) and the all-to-all share only the links "
            "their routes share; the paper's two NCCL streams also contend for SMs, PCIe "
            "and proxy threads, which nothing here charges: likely why it measured ~1%",
        ),
    ]


def lancet() -> list[dict]:
    d = _load("lancet")
    rs = d["rows"]
    out = []
    for topo, paper_a2a, paper_up in (("p4de-a100", 66, 1.21), ("p3dn-v100", 77, 1.3)):
        mine = [r for r in rs if r["topology"] == topo]
        red = max(100 * r["both"]["a2a_reduction"] for r in mine)
        up = max(r["both"]["speedup"] for r in mine)
        floor = max(100 * (1 - r["both"]["a2a_floor_ms"] / r["tutel"]["a2a_ms"]) for r in mine)
        oom = [f"{r['model']} ({r['batch']})" for r in mine if r["tutel"]["oom"]]
        gpus = mine[0]["gpus"]
        out += [
            row(
                "Lancet",
                f"non-overlapped all-to-all vs Tutel, {topo} (Fig. 13)",
                f"down by up to {paper_a2a}%",
                f"down by up to {red:.0f}% on {gpus} GPUs (paper's batch sizes: "
                + ", ".join(f"{r['model']} {r['batch']}" for r in mine)
                + f"); no schedule can pass {floor:.0f}%",
                "trend" if red > 0 else "not reproduced",
                (
                    f"the paper's {paper_a2a}% is beyond the floor: on the modelled cluster "
                    "the all-to-alls outlast all of their phase's compute, so no schedule "
                    "hides that much; "
                    if paper_a2a > floor
                    else f"Lancet's passes reach {red:.0f}% of a possible {floor:.0f}%: "
                )
                + "the paper's all-to-all is shorter against compute (Fig. 2: up to 3.36x "
                "the experts) and Lancet's irregular all-to-all sends no padding, which "
                "uniform routing at capacity 1.0 does not have here",
            ),
            row(
                "Lancet",
                f"end-to-end speed-up vs Tutel, {topo} (Fig. 11)",
                f"up to {paper_up}x",
                f"up to {up:.2f}x"
                + (f"; OOM by moesim's flag: {', '.join(oom)}" if oom else "; every run fits"),
                "trend" if up > 1.05 else "not reproduced",
                "dW scheduling and the partition pass both help, as Fig. 16's ablation",
            ),
        ]
    return out + lancet_skew()


def lancet_skew() -> list[dict]:
    """Lancet against Tutel under skewed routing (the paper trains real gates): the same
    16-GPU settings recorded uniform and Zipf 1.2 (`lancet.py --nodes 2 [--zipf 1.2]`)."""
    if not (RESULTS / "lancet_zipf1.2_16gpus.json").exists():
        return []
    uni = {(r["topology"], r["model"]): r for r in _load("lancet_16gpus")["rows"]}
    skew = {(r["topology"], r["model"]): r for r in _load("lancet_zipf1.2_16gpus")["rows"]}
    out = []
    for topo, paper_a2a in (("p4de-a100", 66), ("p3dn-v100", 77)):
        keys = sorted(k for k in skew if k[0] == topo and k in uni)
        red = {
            n: [100 * d[k]["both"]["a2a_reduction"] for k in keys]
            for n, d in (("uniform", uni), ("zipf", skew))
        }
        tut = [skew[k]["tutel"]["step_ms"] / uni[k]["tutel"]["step_ms"] for k in keys]
        out.append(
            row(
                "Lancet",
                f"non-overlapped all-to-all vs Tutel under skewed routing, {topo} (Fig. 13)",
                f"down by up to {paper_a2a}%",
                f"Zipf 1.2: down by up to {max(red['zipf']):.0f}% (uniform: up to "
                f"{max(red['uniform']):.0f}%) on 16 GPUs; Tutel's step {min(tut):.2f}-"
                f"{max(tut):.2f}x its uniform one",
                "trend" if max(red["zipf"]) > 0 else "not reproduced",
                "Tutel exchanges its padded [E, C, M] buffers whatever the routing (its step "
                "does not change), Lancet's partitions send only the rows the gate keeps (its "
                "irregular all-to-all); "
                + (
                    "skew widens Lancet's lead here"
                    if max(red["zipf"]) > max(red["uniform"])
                    else "yet skew narrows Lancet's lead here (not traced; likely: hot "
                    "experts fill their capacity in the first partitions, whose all-to-all has "
                    "less to hide behind)"
                ),
            )
        )
    return out


def deepep() -> list[dict]:
    eff, line = deepep_h800.fit_efficiency()
    rows = deepep_h800.calibration()
    res = deepep_h800._ratios(rows) - 1
    cross = deepep_h800.cross_fit(line)
    out = [
        row(
            "DeepEP",
            "normal kernels' bandwidth, 8 H800 figures (EP8 NVLink, EP16-64 RDMA)",
            "153-158 GB/s NVLink, 43-58 GB/s RDMA",
            f"{100 * res.min():+.0f} to {100 * res.max():+.0f}% with one efficiency "
            f"({eff:.3f}) fitted to all eight",
            "reproduced",
            "one parameter fitted to the same eight figures: see the held-out rows",
        )
    ]
    for key, (n, m, pub) in {
        "NVLink->RDMA": ("2 intranode", "6 internode", "43-58 GB/s RDMA"),
        "RDMA->NVLink": ("6 internode", "2 intranode", "153-158 GB/s NVLink"),
    }.items():
        c = cross[key]
        lo, hi = c["residual_min_pct"], c["residual_max_pct"]
        out.append(
            row(
                "DeepEP",
                f"held out: fitted on the {n} figures, predict the {m}",
                pub,
                f"{lo:+.1f} to {hi:+.1f}% (efficiency {c['efficiency']:.3f})",
                "reproduced" if max(-lo, hi) < 15 else "trend",
                "one kernel efficiency for both links; the per-node dedup and forwarding "
                "volumes carry the scaling between them",
            )
        )
    return out


def megatron_dualpipe() -> list[dict]:
    d = _load("megatron_ep")
    out = []
    published = (("deepseek-v3 proxy, 64 H100, EP8", 1.078), ("qwen-like, 16 H100, EP8", 1.18))
    for setup, pub in published:
        g = [r["gain"] for r in d["rows"] if r["setup"] == setup and r["queues"] == 32]
        ok = min(g) <= pub * 1.05 and max(g) >= pub * 0.95
        out.append(
            row(
                "Megatron",
                f"EP-overlap gain, {setup}",
                f"{pub}x",
                f"{min(g):.2f}-{max(g):.2f}x (megatron_ep.json, 32 queues)",
                "reproduced" if ok else "trend",
                "the proxy's depth, micro-batches and layout are not published (assumed)",
            )
        )
    res = {pp: megatron_ep.dualpipe_bubble(pp) for pp in (4, 8)}
    off = max(abs(sim - want) / want for sim, want in res.values())
    out.append(
        row(
            "DualPipe",
            "DualPipe's bubble (PP/2-1)(F&B+B-3W), DeepSeek-V3 report Table 2",
            "the formula",
            ", ".join(f"PP {pp}: {1e6 * a:.1f} vs {1e6 * b:.1f} us" for pp, (a, b) in res.items())
            + f" (simulated idle vs formula, {100 * off:.1g}% off)",
            "reproduced" if off < 1e-6 else "not reproduced",
            "simulated schedule with GEMM-only alpha-beta costs and free communication (the "
            "formula's assumptions: F = B's input part, comm hidden); real F&B overlap is "
            "not part of the claim",
        )
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip MPipeMoE's memory and Fig. 13")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = pipemoe() + mpipemoe(a.quick) + tutel() + parm() + lancet() + deepep()
    rows += megatron_dualpipe()
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    lines = [
        "# The founding papers' claims in moesim, on the papers' own settings",
        "",
        f"Generated by `python benchmarks/papers.py{' --quick' if a.quick else ''}` on "
        f"{machine()} in {time.perf_counter() - t0:.0f} s (issue 26). Verdicts: "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
        + ". Rows naming a results file read the run its module recorded on the paper's "
        "settings; the others are simulated here.",
        "",
        "| paper | claim | paper | moesim (paper's settings) | verdict | why |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['paper']} | {r['claim']} | {r['paper_value']} | {r['moesim']} "
            f"| {r['verdict']} | {r['why']} |"
        )
    record("papers", {"machine": machine(), "counts": counts, "rows": rows}, lines)


if __name__ == "__main__":
    main()
