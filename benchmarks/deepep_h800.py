# ruff: noqa: E501  (markdown table rows are kept one line each)
"""DeepEP normal kernels on the h800 preset vs DeepEP's published H800 figures (docs/legacy.md:
4096 tokens, hidden 7168, top-8 of 256 experts, top-min(nodes,4) node groups, FP8 dispatch,
BF16 combine), plus NCCL all-to-all (`sequential`) vs DeepEP with and without skew.

Bandwidth is computed as DeepEP's tests do: RDMA = (token, node) pairs, the own node included,
times row bytes, over the kernel time; NVL (intranode) = rows received, own included.
Every run has the host launch thread on (`costs.resources.launch_s` = 5 us a task, assumed;
DeepEP's notify wait and Megatron's split-size sync are host syncs in the graphs).

    python benchmarks/deepep_h800.py
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from sim.core.io import atomic_write_text
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.resources import LAUNCH_S
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.deepep.volumes import row_bytes, volumes
from sim.workload.moe import MoELayer

OUT = Path(__file__).resolve().parent / "results"
PUBLISHED = {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}  # GB/s dispatch, combine
MACHINE = "2-core CI-class container"


def _times(name, params, layer, nodes, resources=None):
    topo = Topology.load("h800", nodes=nodes)
    costs = CostModel.build(topo, {"resources": {"launch_s": LAUNCH_S, **(resources or {})}})
    g = build(name, layer, params, ("fwd",), Cluster(topo, costs))
    r = simulate(g, topo, costs)
    out = {"overlap_s": _overlap(g, r)}
    for step in ("dispatch", "combine"):
        idx = [i for i, t in enumerate(g) if t.tags.get("step") == step]
        out[step] = float(r.end[idx].max() - r.start[idx].min())
    return out


def _overlap(g, r) -> float:
    """Seconds of compute that ran beside a kernel holding SMs on its GPU (summed over ranks):
    what DeepEP's SM reservation can cost in this graph."""
    tasks = list(g)
    total = 0.0
    for i, h in enumerate(tasks):
        if h.sms <= 0:
            continue
        for j, c in enumerate(tasks):
            if c.rank == h.rank and c.sms == 0 and not c.is_comm and c.kind not in ("d2h", "h2d"):
                total += max(0.0, min(r.end[i], r.end[j]) - max(r.start[i], r.start[j]))
    return float(total)


# Megatron-LM #1456's attention as its config gives it (DeepSeek-V3's MLA at hidden 2048)
MLA_1456 = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}


def megatron_1456() -> list[dict]:
    """Megatron-LM issue #1456's setting as a training schedule: hidden 2048, 32 experts top-8
    of MOE_INTERMEDIATE_SIZE 2048 (SwiGLU: three 2048-wide matrices, modelled as the two-matrix
    FFN of the same FLOPs and weights, 3072 wide), one shared expert, MLA attention of 128 heads
    (its config), 4,096 tokens per micro-batch, two MoE layers and two micro-batches
    (assumed), `megatron_ep` without overlap; dispatchers alltoall (NCCL all-to-allv,
    dropless, a copy per (token, expert)) and allgather (NCCL all-gather of every token,
    reduce-scatter back: no count exchange, no host sync) vs flex (DeepEP, its kernels on 24
    SMs), on h800 and on dgx-h100 (the report names no GPU); also with a plain 16-head
    attention (`attention: mha`) to show what the attention's share does, and with
    Megatron-Core's EP overlap on (`overlap: true`, the forward of one micro-batch merged with
    the backward of the other)."""
    out = []
    cases = itertools.product(("mla", "mha"), (False, True), ("h800", "dgx-h100"), (4, 8, 16, 32))
    for attn, overlap, preset, ep in cases:
        if attn == "mha" and (ep > 16 or overlap):
            continue
        topo = Topology.load(preset, nodes=max(1, ep // 8))
        costs = CostModel.build(topo, {"resources": {"launch_s": LAUNCH_S}})
        layer = MoELayer(
            batch=1,
            seq_len=4096,
            model_dim=2048,
            hidden_dim=3072,
            experts=max(32, 4 * ep),
            world=ep,
            top_k=8,
        )
        ms = {}
        for disp in ("alltoall", "allgather", "flex"):
            params = {
                "dispatcher": disp,
                "overlap": overlap,
                "micro": 2,
                "layers": 2,
                "shared": 1,
                "heads": 128 if attn == "mla" else 16,
                "mla": MLA_1456 if attn == "mla" else None,
            }
            g = build("megatron_ep", layer, params, ("fwd", "bwd"), Cluster(topo, costs))
            ms[disp] = simulate(g, topo, costs).makespan * 1e3
        out.append(
            {
                "attention": attn,
                "overlap": overlap,
                "preset": preset,
                "ep": ep,
                "nodes": topo.nodes,
                "experts": layer.experts,
                "alltoall_ms": ms["alltoall"],
                "allgather_ms": ms["allgather"],
                "flex_ms": ms["flex"],
            }
        )
    return out


DIFFERS = """## Where the simulation differs, and why

- Calibration: one figure, `comm_sm_efficiency`, for what DeepEP's kernels lose beside the
  line rate (chunked ring buffers, signalling, per-token metadata), fitted over all eight
  published numbers; the residuals (EP16 about +9%, EP64 about -6%) are the shape one figure
  cannot follow. EP8's NVL figure counts the own-GPU rows (1/8) as DeepEP's test does.
- Claim "DeepEP does not win at EP <= 8 on one node": reproduced at EP4 (the report's) in the
  plain schedule, and at EP4 and EP8 with Megatron-Core's EP overlap on (DeepEP's SMs cost
  the overlapped compute more than its bytes save); at EP8 in the plain schedule DeepEP keeps
  an edge of a few percent (see the #1456 reading above). The SM reservation is honoured (`Task.sms`) but
  nothing in this plain schedule runs beside the reserving kernels, so it changes no number
  here.
- Skew: see `deepep_skew.md` (DeepSpeed PR #8213's setting, each exchange timed alone). The
  tables here time the exchanges inside a layer graph, where a skewed layer's combine also
  waits for its hottest GPU's experts, so they carry no skew rows."""


def calibration(resources: dict | None = None) -> list[dict]:
    """DeepEP's published H800 settings, simulated; `resources` overrides the preset's."""
    rows = []
    for ep, (pd, pc) in PUBLISHED.items():
        nodes = max(1, ep // 8)
        layer = MoELayer(
            batch=1, seq_len=4096, model_dim=7168, hidden_dim=2048, experts=256, world=ep, top_k=8
        )
        mn = min(nodes, 4)
        t = _times("deepep", {"max_nodes": mn}, layer, nodes, resources)
        v = volumes(layer, 8, mn)
        count = v.node_tokens.sum(axis=1).mean() if nodes > 1 else v.gpu_tokens.sum(axis=0).mean()
        sim_d = count * row_bytes(7168, "fp8") / t["dispatch"] / 1e9
        sim_c = count * row_bytes(7168, "bf16") / t["combine"] / 1e9
        rows.append(
            {
                "ep": ep,
                "link": "RDMA" if nodes > 1 else "NVLink",
                "dispatch_us": t["dispatch"] * 1e6,
                "combine_us": t["combine"] * 1e6,
                "sim_dispatch_GBs": sim_d,
                "pub_dispatch_GBs": pd,
                "sim_combine_GBs": sim_c,
                "pub_combine_GBs": pc,
            }
        )
    return rows


def _ratios(rows: list[dict]) -> np.ndarray:
    return np.array(
        [r[f"sim_{d}_GBs"] / r[f"pub_{d}_GBs"] for r in rows for d in ("dispatch", "combine")]
    )


def fit_efficiency() -> tuple[float, list[dict]]:
    """`comm_sm_efficiency` fitted to the published figures: the inverse of the geometric mean
    of simulated over published bandwidth with the kernels at line rate (efficiency 1). Their
    time is nearly all bytes over links, so scaling the link time per byte by 1/e moves every
    figure by about e; the residuals are re-measured at the preset's value."""
    line = calibration({"comm_sm_efficiency": 1.0})
    return float(1.0 / np.exp(np.log(_ratios(line)).mean())), line


def cross_fit(line: list[dict]) -> dict:
    """Held-out checks of the one-parameter fit: `comm_sm_efficiency` fitted on the intranode
    figures (EP8, NVLink) predicts the internode ones (EP16-64, RDMA), and the reverse; each
    prediction re-simulated at the fitted value."""
    out = {}
    for fit_on, test_on in (("NVLink", "RDMA"), ("RDMA", "NVLink")):
        part = [r for r in line if r["link"] == fit_on]
        e = float(1.0 / np.exp(np.log(_ratios(part)).mean()))
        pred = [r for r in calibration({"comm_sm_efficiency": e}) if r["link"] == test_on]
        res = _ratios(pred) - 1
        out[f"{fit_on}->{test_on}"] = {
            "efficiency": e,
            "residual_min_pct": 100 * float(res.min()),
            "residual_max_pct": 100 * float(res.max()),
        }
    return out


def main() -> None:
    eff, line = fit_efficiency()
    cross = cross_fit(line)
    rows = calibration()
    preset_eff = CostModel.build(Topology.load("h800", nodes=1), {}).resources.comm_sm_efficiency
    claims = []
    for ep in (8, 16, 32):  # uniform routing
        layer = MoELayer(
            batch=1,
            seq_len=4096,
            model_dim=7168,
            hidden_dim=2048,
            experts=4 * ep,
            world=ep,
            top_k=8,
        )
        res = {"ep": ep}
        for label, name, params in (
            ("nccl_linear", "sequential", {}),
            ("nccl_rail_relay", "sequential", {"algo": "rail_relay"}),
            ("deepep_bf16", "deepep", {"dispatch_dtype": "bf16"}),
            ("deepep_fp8", "deepep", {}),
        ):
            t = _times(name, params, layer, max(1, ep // 8))
            res[label + "_ms"] = (t["dispatch"] + t["combine"]) * 1e3
            if name == "deepep":
                res[label + "_overlap_ms"] = t["overlap_s"] * 1e3
        claims.append(res)
    step = megatron_1456()
    resid = _ratios(rows) - 1
    data = {
        "machine": MACHINE,
        "preset": "h800",
        "fitted_comm_sm_efficiency": eff,
        "preset_comm_sm_efficiency": preset_eff,
        "line_rate": line,
        "calibration": rows,
        "cross_fit": cross,
        "claims": claims,
        "megatron_1456": step,
    }
    atomic_write_text(OUT / "deepep_h800.json", json.dumps(data, indent=2) + "\n")
    md = [
        "# DeepEP normal kernels on h800: simulated vs published",
        "",
        f"Machine: {MACHINE} (simulation). `python benchmarks/deepep_h800.py`.",
        "",
        "Calibration: `costs.resources.comm_sm_efficiency` (the share of its links' rate a kernel"
        " holding its own SMs reaches) fitted to DeepEP's published figures: with the kernels at"
        f" line rate the simulation is {100 * (_ratios(line).min() - 1):+.0f} to"
        f" {100 * (_ratios(line).max() - 1):+.0f}% above them; the fit (inverse geometric mean of"
        f" sim / published) is {eff:.3f}, the Hopper presets carry {preset_eff}, and with it the"
        f" simulation is {100 * resid.min():+.0f} to {100 * resid.max():+.0f}% off the published"
        " figures:",
        "",
        "| EP | link | dispatch sim / line-rate sim / published GB/s | combine sim / line-rate sim / published GB/s | dispatch us | combine us |",
        "|---|---|---|---|---|---|",
    ]
    cross_md = [
        "",
        "Held out (issue 26: the fit above uses all eight figures): fitted on one link's figures,"
        " the efficiency predicts the other's as",
        "",
        "| fitted on -> predicted | efficiency | predicted vs published |",
        "|---|---:|---|",
    ] + [
        f"| {k} | {v['efficiency']:.3f} | {v['residual_min_pct']:+.1f} to {v['residual_max_pct']:+.1f}% |"
        for k, v in cross.items()
    ]
    for r, lr in zip(rows, line, strict=True):
        md.append(
            f"| {r['ep']} | {r['link']} | {r['sim_dispatch_GBs']:.0f} / {lr['sim_dispatch_GBs']:.0f} / {r['pub_dispatch_GBs']} "
            f"| {r['sim_combine_GBs']:.0f} / {lr['sim_combine_GBs']:.0f} / {r['pub_combine_GBs']} | {r['dispatch_us']:.0f} "
            f"| {r['combine_us']:.0f} |"
        )
    md += cross_md
    md += [
        "",
        "Dispatch + combine time (ms), 4096 tokens x 7168, top-8, 4 experts per GPU, uniform routing:",
        "",
        "| EP | NCCL linear | NCCL rail_relay | DeepEP bf16 | DeepEP fp8 |",
        "|---|---|---|---|---|",
    ]
    for c in claims:
        md.append(
            f"| {c['ep']} | {c['nccl_linear_ms']:.2f} "
            f"| {c['nccl_rail_relay_ms']:.2f} | {c['deepep_bf16_ms']:.2f} | {c['deepep_fp8_ms']:.2f} |"
        )
    sms = 24
    res = CostModel.build(Topology.load("h800", nodes=1), {}).resources
    overlap = max(c["deepep_fp8_overlap_ms"] for c in claims)
    md += [
        "",
        f"SMs: DeepEP's kernels reserve `Task.sms` = {sms} of {res.sms}; on h800 a kernel beside "
        f"them runs at {res.sm_speed(sms):.3f} of its speed (sim.hardware.costs.resources, fitted to an "
        f"H100). In this layer graph compute overlapping the reserving kernels totals {overlap:.3f} ms "
        "(every step waits on the one before), so the reservation costs nothing here. The cost appears "
        "where compute overlaps the kernels (another micro-batch, a shared expert, Megatron-Core's EP "
        "overlap: `comm_sms.md`). The kernels also send no faster than their SMs allow "
        "(`comm_sm_bw`, 14 GB/s per SM: 336 GB/s, above h800's NVLink, so it binds nothing here).",
    ]
    md += [
        "",
        "Skewed routing (DeepSpeed PR #8213: NCCL 99.7 -> 115.8 ms vs DeepEP ~46-48 ms on 16"
        " H100): `deepep_skew.md`.",
        "",
    ]
    md += [
        "Megatron-LM #1456's layer as a training step (`megatron_ep`, no overlap; its config:"
        " hidden 2048, 32 experts top-8 of SwiGLU 2048, 1 shared expert, MLA of 128 heads; 2"
        " layers x 2 micro-batches of 4,096 tokens assumed; `mha`: a plain 16-head attention"
        " instead): step time (ms)",
        "",
        "| attention | EP overlap | preset | EP | nodes | experts | NCCL alltoall | NCCL allgather | DeepEP (flex) | DeepEP / alltoall | DeepEP / best NCCL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in step:
        best = min(r["alltoall_ms"], r["allgather_ms"])
        md.append(
            f"| {r['attention']} | {'on' if r['overlap'] else 'off'} | {r['preset']} | {r['ep']} | {r['nodes']} | {r['experts']} | "
            f"{r['alltoall_ms']:.2f} | {r['allgather_ms']:.2f} | {r['flex_ms']:.2f} | "
            f"{r['flex_ms'] / r['alltoall_ms']:.3f} | {r['flex_ms'] / best:.3f} |"
        )

    def rows(attn: str, preset: str, one_node: bool, overlap: bool) -> list[dict]:
        return [
            r
            for r in step
            if r["attention"] == attn
            and r["preset"] == preset
            and (r["nodes"] == 1) == one_node
            and r["overlap"] == overlap
        ]

    def edge(
        attn: str, preset: str, one_node: bool, key: str = "best", overlap: bool = False
    ) -> str:
        v = [
            1
            - r["flex_ms"] / (min(r["alltoall_ms"], r["allgather_ms"]) if key == "best" else r[key])
            for r in rows(attn, preset, one_node, overlap)
        ]
        return f"{100 * min(v):+.1f} to {100 * max(v):+.1f}%"

    def row(attn: str, preset: str, ep: int) -> dict:
        return next(
            r
            for r in step
            if (r["attention"], r["preset"], r["ep"], r["overlap"]) == (attn, preset, ep, False)
        )

    r4, h4 = row("mla", "h800", 4), row("mla", "dgx-h100", 4)
    far = [r["allgather_ms"] / r["flex_ms"] for r in step if r["nodes"] > 1 and not r["overlap"]]
    md += [
        "",
        "Reading, computed from the rows. With the report's MLA attention, against the best"
        f" NCCL dispatcher DeepEP's edge on one node (EP <= 8) is {edge('mla', 'h800', True)}"
        f" on h800 and {edge('mla', 'dgx-h100', True)} on dgx-h100; across nodes"
        f" {edge('mla', 'h800', False)} and {edge('mla', 'dgx-h100', False)}. At the report's"
        f" EP4 DeepEP does not win: {r4['flex_ms']:.2f} against the allgather dispatcher's"
        f" {r4['allgather_ms']:.2f} ms on h800, {h4['flex_ms']:.2f} against"
        f" {h4['allgather_ms']:.2f} on dgx-h100. There top-8 over 4 GPUs gives 90% of the"
        " tokens an expert on every GPU, so DeepEP's per-GPU dedup saves little of the"
        " allgather's bytes, while its kernels reach 0.865 of the links' rate (the fit above)"
        " and it needs a count exchange and a host sync the allgather does not. At EP8 (66%)"
        " the dedup keeps a small edge: the claim holds there only in that the edge is a few"
        " percent. Across nodes the allgather moves every token to every GPU and takes"
        f" {min(far):.1f}-{max(far):.1f}x DeepEP's time. Against the report's \"origin all-to-all\" (the alltoall dispatcher, a copy"
        " per (token, expert)) DeepEP's edge on one node is"
        f" {edge('mla', 'h800', True, 'alltoall_ms')} (h800) and"
        f" {edge('mla', 'dgx-h100', True, 'alltoall_ms')} (dgx-h100): not the loss the report"
        " saw, but small. The attention's share decides how small: with a plain 16-head"
        " attention (about a seventh of MLA's FLOPs here) the same edges are"
        f" {edge('mha', 'h800', True, 'alltoall_ms')} and"
        f" {edge('mha', 'dgx-h100', True, 'alltoall_ms')}. With Megatron-Core's EP overlap on,"
        " DeepEP loses on one node: against the best NCCL dispatcher its edge is"
        f" {edge('mla', 'h800', True, overlap=True)} on h800 and"
        f" {edge('mla', 'dgx-h100', True, overlap=True)} on dgx-h100 (across nodes"
        f" {edge('mla', 'h800', False, overlap=True)} and"
        f" {edge('mla', 'dgx-h100', False, overlap=True)}): the merged schedule hides most of"
        " the exchanges, so DeepEP's fewer bytes buy little, while its 24 SMs slow the"
        " attention and expert GEMMs running beside them. The report gives no profile; a"
        " cost it had that the model lacks: Megatron-Core's flex path of that time turned"
        " DeepEP's indices into a multi-hot map by boolean indexing (`_indices_to_multihot`:"
        " `indices[mask]`, `repeat_interleave`, each a host sync). Megatron-Core passes DeepEP"
        " its BF16 hidden states (`fused_a2a.FusedDispatch`), so the flex rows here are BF16"
        " (`dispatch_dtype`). The host launch thread is modelled (5 us a launch, assumed;"
        " DeepEP's notify wait and the alltoall dispatcher's split-size sync are host syncs).",
        "",
        DIFFERS,
    ]
    atomic_write_text(OUT / "deepep_h800.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
