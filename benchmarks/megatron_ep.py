"""Megatron-Core EP overlap (megatron_ep) vs the plain 1F1B order on dgx-h100, next to the
published gains (Megatron-Core MoE docs: +7.8% with 32 hardware queues vs +3.7% with 1 on a
64-H100 DeepSeek-V3 proxy; 1.18x on 16 H100 for a Qwen-like model), and the DualPipe bubble
table. Run: PYTHONPATH=. python benchmarks/megatron_ep.py (machine named in the output).

Each gain is taken with 32 and with 1 hardware queue (`costs.resources.max_connections`) and
with NCCL's kernels holding no SMs or 24 (`costs.resources.comm_sms`), every run with the
host launch thread on (`costs.resources.launch_s` = 5 us, assumed; the graphs carry the host
sync on each forward dispatch's split sizes). Models: DeepSeek-V3
proxy = hidden 7168, 256 SwiGLU experts of 2048 top-8 (as two-matrix FFNs of equal FLOPs,
3072 wide), one shared expert, DeepSeek-V3's MLA of 128 heads, sequence 4096;
Qwen-like = hidden 4096, 128 SwiGLU experts of 1536 top-8 (as two-matrix FFNs of equal
FLOPs, 2304 wide), no shared expert, 64 query heads of 128 dims and 4 key / value heads
(Qwen3-235B-A22B's sizes), sequence 4096. Two MoE layers per stage, 4 micro-batches
(assumed: the published runs' depth and counts are not given). Each setup runs with its EP
group inside one node (EP8: the 64 or 16 GPUs as 8-GPU EP groups, the rest of the world in
pipeline / data parallelism, which the graph of one EP group leaves out) and across all its
nodes (EP64 / EP16): the published EP layout is not given either.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from sim.core.io import atomic_write_text
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.resources import LAUNCH_S
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.dualpipe.schedule import table
from sim.workload.blocks import PRESETS
from sim.workload.moe import MoELayer

OUT = Path(__file__).resolve().parent / "results"


def reading(rows: list[dict]) -> str:
    """The hand-written reading, its numbers taken from this run's rows."""

    def pick(
        setup: str, disp: str | None = None, queues: int | None = None, sms: int | None = None
    ) -> list[float]:
        return [
            r["gain"]
            for r in rows
            if r["setup"].startswith(setup)
            and disp in (None, r["dispatcher"])
            and queues in (None, r["queues"])
            and sms in (None, r["comm_sms"])
        ]

    def span(v: list[float]) -> str:
        return f"{min(v):.2f}-{max(v):.2f}x"

    def inside(v: list[float]) -> str:
        n = sum(1.1 <= g <= 1.35 for g in v)
        return "all in" if n == len(v) else f"{n} of {len(v)} in"

    def pct(one: float, many: float) -> str:
        return f"{100 * (one - 1) / (many - 1):.0f}%"

    def pct_pair(many: float, one: float) -> str:
        return (
            f"+{100 * (many - 1):.1f}% against +{100 * (one - 1):.1f}%, one queue "
            f"keeping {pct(one, many)}"
        )

    ds, qw = "deepseek-v3 proxy, 64 H100, EP8", "qwen-like, 16 H100, EP8"
    far = ("deepseek-v3 proxy, 64 H100, EP64", "qwen-like, 16 H100, EP16")
    shrink = [a - b for f in far for a, b in zip(pick(f, queues=32), pick(f, queues=1))]
    ep8 = [
        a - b
        for a, b in zip(
            pick(ds, queues=32) + pick(qw, queues=32), pick(ds, queues=1) + pick(qw, queues=1)
        )
    ]
    across = pick(far[0]) + pick(far[1])
    f32, f1 = pick(ds, "flex", 32, 0)[0], pick(ds, "flex", 1, 0)[0]
    a32, a1 = pick(ds, "alltoall", 32, 0)[0], pick(ds, "alltoall", 1, 0)[0]
    a24, a24q = pick(ds, "alltoall", 32, 24)[0], pick(ds, "alltoall", 1, 24)[0]
    return f"""Reading:

- With the EP group inside one node (EP8) and 32 hardware queues, the simulated gains are
  DeepSeek-V3 proxy {span(pick(ds, queues=32))}, Qwen-like {span(pick(qw, queues=32))}
  ({inside(pick(ds, queues=32) + pick(qw, queues=32))} the issue's 1.1-1.35x band; published
  1.078x and 1.18x), and one hardware queue shrinks every one of them (by
  {min(ep8):.3f}-{max(ep8):.3f}x, to DeepSeek-V3 proxy {span(pick(ds, queues=1))}, Qwen-like
  {span(pick(qw, queues=1))}).
  NCCL kernels holding 24 SMs shrink the alltoall dispatcher's gains further (DeepSeek-V3
  proxy {a32:.3f}x -> {a24:.3f}x, and {a24q:.3f}x with one queue too): inside a node the
  all-to-all is shorter than a layer's compute, so the merged schedule's gain is the
  communication it hides, and what slows the compute beside it (SMs held, launches
  serialised behind a waiting kernel) takes from it. DeepEP's kernels send no faster than
  their 24 SMs allow (`comm_sm_bw`, 14 GB/s per SM on dgx-h100).
- Partly reached: the size of the queue effect. Published: +7.8% with 32 queues against +3.7%
  with one (one queue keeps {pct(1.037, 1.078)} of the gain); simulated at EP8:
  {pct_pair(f32, f1)} (flex), {pct_pair(a32, a1)} (alltoall). With one queue a
  kernel waits until every block of the kernels issued before it is on an SM
  (`sim.engine.queues`): a GEMM of many waves holds the queue to its end, so the shared
  experts' stream and the dispatcher's kernels queue behind the other stream's GEMMs. The
  published proxy's depth, micro-batch size, recomputation and EP / PP layout are not given
  (two MoE layers and four micro-batches here are assumed).
- With the EP group across nodes (EP64, EP16) the simulated gains are {span(across)}
  ({sum(g > 1.35 for g in across)} of {len(across)} above the band): top-8 of 4,096 tokens
  crosses InfiniBand at ~50 GB/s per GPU, the dispatch and combine take longer than the
  compute, and the merged schedule hides the compute behind
  them (gain about (compute + comm) / comm); one queue takes up to {max(shrink):.3f}x off a
  gain there.
- The host launch thread is modelled (5 us a launch, assumed, and a host sync on each forward
  dispatch's split sizes); it moves every gain by less than 0.01x."""


# DeepSeek-V3's MLA (sim.workload.blocks: its preset) and SwiGLU experts of 2048 as the
# two-matrix FFN of equal FLOPs and weights (3072)
DSV3 = dict(
    M=7168,
    H=3072,
    E=256,
    heads=128,
    shared=1,
    published=1.078,
    mla=PRESETS["deepseek-v3"]["blocks"]["mla"],
)
# Qwen3-235B-A22B's attention (the qwen3-235b-a22b preset: 64 query heads of 128 dims, 4 key /
# value heads) and its SwiGLU experts of 1536 as two-matrix FFNs of equal FLOPs (2304)
QWEN = dict(M=4096, H=2304, E=128, heads=64, shared=0, published=1.18, kv_heads=4, head_dim=128)
SETUPS = {
    "deepseek-v3 proxy, 64 H100, EP8": dict(DSV3, nodes=1),
    "deepseek-v3 proxy, 64 H100, EP64": dict(DSV3, nodes=8),
    "qwen-like, 16 H100, EP8": dict(QWEN, nodes=1),
    "qwen-like, 16 H100, EP16": dict(QWEN, nodes=2),
}


def gain(setup: dict, dispatcher: str, queues: int, comm_sms: int) -> dict:
    topo = Topology.load("dgx-h100", nodes=setup["nodes"])
    res = {"max_connections": queues, "comm_sms": comm_sms, "launch_s": LAUNCH_S}
    costs = CostModel.build(topo, {"resources": res})
    P = topo.world_size
    layer = MoELayer(
        batch=1,
        seq_len=4096,
        model_dim=setup["M"],
        hidden_dim=setup["H"],
        experts=setup["E"],
        world=P,
        top_k=8,
    )
    spans = {}
    for overlap in (False, True):
        params = {
            "dispatcher": dispatcher,
            "overlap": overlap,
            "micro": 4,
            "layers": 2,
            "heads": setup["heads"],
            "shared": setup["shared"],
            "mla": setup.get("mla"),
            "kv_heads": setup.get("kv_heads"),
            "head_dim": setup.get("head_dim"),
        }
        g = build("megatron_ep", layer, params, ("fwd", "bwd"), Cluster(topo, costs))
        spans[overlap] = simulate(g, topo, costs).makespan
    return {"plain_s": spans[False], "overlap_s": spans[True], "gain": spans[False] / spans[True]}


def dualpipe_bubble(pp: int) -> tuple[float, float]:
    """Simulated idle time of a DualPipe device against the published formula, under the
    formula's assumptions (`tests/test_dualpipe.py`'s setting)."""
    from sim.engine.engine import simulate
    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology
    from sim.strategies import build
    from sim.strategies.dualpipe.schedule import Pipeline, table
    from sim.workload.moe import MoELayer

    zero = {"alpha": 0.0, "beta": 0.0}
    kinds = ("layernorm", "softmax", "elementwise", "attention", "gate", "encode", "decode")
    layer = MoELayer(batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=2, world=1)
    params = {"variant": "dualpipe", "pp": pp, "micro": 2 * pp, "layers": 2, "shared": 0}
    g = build("dualpipe", layer, params, ("fwd", "bwd"))
    topo = Topology.load("flat-switch", nodes=g.world_size)
    costs = CostModel.build(
        topo,
        {
            "compute": "alpha_beta",
            "network": "collective",
            "alpha_beta": {"gemm": {"alpha": 3e-6, "beta": 2e-12}} | {k: zero for k in kinds},
            "collectives": {"all_to_all": zero, "all_gather": zero, "send": zero},
        },
    )
    r = simulate(g, topo, costs)
    dur, tasks = r.end - r.start, list(g)
    chunk = {"fwd": 0.0, "dX": 0.0, "dW": 0.0}
    busy = [0.0] * g.world_size
    for i, t in enumerate(tasks):
        if t.stream.startswith("compute"):
            busy[t.rank] += dur[i]
            if t.rank == 0:
                chunk[t.tags.get("role", "fwd")] += dur[i]
    n = 2 * Pipeline("dualpipe", pp, 2 * pp).per_phase
    F, Bi, W = (chunk[k] / n for k in ("fwd", "dX", "dW"))
    want = table(pp, F, Bi + W, W, F + Bi + W)["dualpipe"]["bubble"]
    return max(r.makespan - b for b in busy), want


def main() -> None:
    t0 = time.time()
    rows = []
    for name, s in SETUPS.items():
        for disp in ("alltoall", "flex"):
            for queues, comm_sms in ((32, 0), (1, 0), (32, 24), (1, 24)):
                r = gain(s, disp, queues, comm_sms)
                rows.append(
                    {
                        "setup": name,
                        "dispatcher": disp,
                        "queues": queues,
                        "comm_sms": comm_sms,
                        **r,
                        "published": s["published"],
                    }
                )
    bubbles = []
    F, B, W = 1.0, 2.0, 1.0  # a forward, a full backward (input + weight parts), its weight part
    for pp in (4, 8, 16):
        t = table(pp, F, B, W, F + B)
        bubbles.append({"pp": pp, **{k: v["bubble"] for k, v in t.items()}})
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    doc = {
        "machine": machine,
        "rows": rows,
        "bubbles_F1_B2_W1": bubbles,
        "seconds": time.time() - t0,
    }
    OUT.mkdir(exist_ok=True)
    atomic_write_text(OUT / "megatron_ep.json", json.dumps(doc, indent=1) + "\n")
    lines = [
        "# megatron_ep: simulated EP-overlap gain vs published",
        "",
        f"machine: {doc['machine']}",
        "",
        "| setup | dispatcher | queues | NCCL SMs | plain (s) | overlap (s) | gain | published |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['dispatcher']} | {r['queues']} | {r['comm_sms']} | "
            f"{r['plain_s']:.4f} | {r['overlap_s']:.4f} | {r['gain']:.3f}x | "
            f"{r['published']}x |"
        )
    lines += ["", reading(rows)]
    lines += [
        "",
        "DualPipe table (F=1, B=2, W=1, F&B=F+B; the closed-form test checks the "
        "simulated bubble equals it exactly when F equals B's input part):",
        "",
        "| PP | 1F1B | ZB1P | DualPipe | DualPipeV |",
        "|---|---|---|---|---|",
    ]
    for b in bubbles:
        lines.append(
            f"| {b['pp']} | {b['1F1B']} | {b['ZB1P']} | {b['dualpipe']} | {b['dualpipev']} |"
        )
    atomic_write_text(OUT / "megatron_ep.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
