"""Where Tutel's 2DH all-to-all starts to beat the linear one on dgx-a100 (Tutel Fig. 20).

For each per-GPU all-to-all size and GPU count, the simulated time of both algorithms; the
crossover per size is the smallest GPU count from which 2DH stays faster. Tutel's own issue
#214 places the crossover for their workload beyond ~256 A100s. Results go to
benchmarks/results/tutel_2dh_crossover.{json,md}.

    python benchmarks/tutel_2dh_crossover.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine  # noqa: E402
from sim.analysis.collbench import graph_for  # noqa: E402
from sim.core.graph import Task  # noqa: E402
from sim.core.io import atomic_write_text  # noqa: E402
from sim.engine.engine import simulate  # noqa: E402
from sim.hardware.costs import CostModel  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from sim.hardware.topology.spec import read_spec  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
GPUS = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
SIZES = [2**k for k in range(16, 31, 2)]  # 64 KiB .. 1 GiB per GPU
# Tutel (paper): 2DH over linear for small messages 10x at 1,024 and 20.7x at 2,048 A100s;
# Table 1 (as quoted in issue 26): the all-to-all grows 52% from 64 to 256 GPUs.
PAPER_GAIN_2048 = 20.7
PAPER_T1_GROWTH_64_256 = 0.52
# The recorded results before the per-connection cost (commit afaee0f), and with it but no
# bound on the connections served at once (commit 432d73b), for the reading.
BEFORE_GAIN_1MIB = {1024: 6.80, 2048: 7.35, 4096: 7.66}
UNBOUNDED_GAIN_1MIB = {1024: 23.39, 2048: 34.42, 4096: 44.86}
# Bounds on the connections an HDR port serves at once, for the sensitivity table: NCCL's
# 128 (16 p2p channels) and 256 (32), then larger ones no source gives; 0 is no bound.
BOUNDS = [128, 256, 512, 1024, 0]


def fmt(n: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n // f} {unit}"
    return f"{n} B"


def stride_copy_s(costs: CostModel, size: int) -> float:
    """One of 2DH's two stride copies (Tutel Alg. 3) as the engine times it (a d2d copy that
    reads and writes the per-GPU buffer: sim.engine.comm, LocalPhase)."""
    return costs.compute.duration(Task("copy", 0, "copy", "d2d", bytes=2.0 * size))


def gain_with_bound(gpus: int, size: int, bound: int) -> float:
    """2DH's gain over linear on dgx-a100 with the HDR class's conn_inflight set to `bound`."""
    spec, source = read_spec("dgx-a100")
    spec["link_classes"]["hdr"]["conn_inflight"] = bound
    topo = Topology(spec, nodes=gpus // 8, source=source)
    costs = CostModel.build(topo, {})
    t = {
        a: simulate(graph_for("all_to_all", a, gpus, size), topo, costs).makespan
        for a in ("linear", "2dh")
    }
    return t["linear"] / t["2dh"]


def main() -> None:
    cells = {}
    copy_s = {}
    for gpus in GPUS:
        topo = Topology.load("dgx-a100", nodes=gpus // 8)
        costs = CostModel.build(topo, {})
        for size in SIZES:
            copy_s[size] = stride_copy_s(costs, size)  # the GPU's, the same at every count
            t = {
                a: simulate(graph_for("all_to_all", a, gpus, size), topo, costs).makespan
                for a in ("linear", "2dh")
            }
            cells[(size, gpus)] = t
            print(
                f"{gpus:5d} GPUs {fmt(size):>8s}: linear {t['linear'] * 1e3:9.3f} ms, "
                f"2dh {t['2dh'] * 1e3:9.3f} ms, speed-up {t['linear'] / t['2dh']:5.2f}",
                flush=True,
            )
    # Tutel Sec. 3.4: an intra-node all-to-all of S = 128 MiB among m = 8 GPUs (n = 8) takes
    # ~600 us on their A100s; 2DH's intra-node phase moves the same bytes over the same links
    one_node = Topology.load("dgx-a100", nodes=1)
    intra_s = simulate(
        graph_for("all_to_all", "linear", 8, 128 << 20), one_node, CostModel.build(one_node, {})
    ).makespan
    crossover = {}
    for size in SIZES:
        wins = [g for g in GPUS if cells[(size, g)]["2dh"] < cells[(size, g)]["linear"]]
        # smallest count from which 2DH wins at every larger count
        cross = next((g for g in GPUS if all(h in wins for h in GPUS if h >= g)), None)
        crossover[size] = cross
    sens = {b: {g: gain_with_bound(g, 2**20, b) for g in (256, 1024, 2048, 4096)} for b in BOUNDS}
    rows = [
        {"size": s, "gpus": g, "linear_s": t["linear"], "2dh_s": t["2dh"]}
        for (s, g), t in cells.items()
    ]
    growth = {
        s: {
            "16_256": cells[(s, 256)]["linear"] / cells[(s, 16)]["linear"] - 1,
            "64_256": cells[(s, 256)]["linear"] / cells[(s, 64)]["linear"] - 1,
        }
        for s in SIZES
    }
    atomic_write_text(
        OUT / "tutel_2dh_crossover.json",
        json.dumps(
            {
                "topology": "dgx-a100",
                "machine": machine(),
                "rows": rows,
                "crossover_gpus": {str(k): v for k, v in crossover.items()},
                "linear_growth": {str(k): v for k, v in growth.items()},
                "2dh_stride_copy_s": {str(k): v for k, v in copy_s.items()},
                "gain_1mib_by_conn_inflight": {
                    str(b): {str(g): v for g, v in by.items()} for b, by in sens.items()
                },
                "intra_node_128mib_8gpus_s": intra_s,
            },
            indent=2,
        ),
    )
    lines = [
        "# 2DH vs linear all-to-all on dgx-a100 (simulated)",
        "",
        "Speed-up of Tutel's 2DH over linear (linear time / 2DH time; > 1 means 2DH wins) per "
        "per-GPU all-to-all size and GPU count, and the crossover: the smallest GPU count from "
        "which 2DH wins at every larger count. Generated by "
        "`python benchmarks/tutel_2dh_crossover.py`; the model's per-message costs are derived "
        "in topologies/dgx-a100.yaml. Machine: " + machine() + " (simulation; timings of the "
        "machine play no part).",
        "",
        "| size per GPU | " + " | ".join(str(g) for g in GPUS) + " | crossover (GPUs) |",
        "|---:|" + "---:|" * len(GPUS) + "---:|",
    ]
    for size in SIZES:
        speed = [cells[(size, g)]["linear"] / cells[(size, g)]["2dh"] for g in GPUS]
        cross = crossover[size]
        lines.append(
            f"| {fmt(size)} | "
            + " | ".join(f"{x:.2f}" for x in speed)
            + f" | {cross if cross else 'none up to 4096'} |"
        )
    g2048 = cells[(2**20, 2048)]["linear"] / cells[(2**20, 2048)]["2dh"]
    g1024 = cells[(2**20, 1024)]["linear"] / cells[(2**20, 1024)]["2dh"]
    # the share of 2DH's time its two stride copies take, small and large messages
    c1 = 2 * copy_s[2**20] / cells[(2**20, 2048)]["2dh"]
    c256 = 2 * copy_s[2**28] / cells[(2**28, 64)]["2dh"]
    s64 = cells[(2**28, 64)]["linear"] / cells[(2**28, 64)]["2dh"]
    lines += [
        "",
        "Growth of the linear all-to-all's time with the GPU count, per size (Tutel Table 1 "
        "reports +52% from 64 to 256 GPUs, as quoted in issue 26; its size per GPU is not "
        "restated here):",
        "",
        "| size per GPU | 16 -> 256 GPUs | 64 -> 256 GPUs |",
        "|---:|---:|---:|",
    ]
    for size in SIZES:
        gr = growth[size]
        lines.append(f"| {fmt(size)} | {gr['16_256']:+.0%} | {gr['64_256']:+.0%} |")
    hdr = Topology.load("dgx-a100").link_classes["hdr"]
    K = hdr.conn_inflight
    peak = max(GPUS, key=lambda g: cells[(2**20, g)]["linear"] / cells[(2**20, g)]["2dh"])
    gpeak = cells[(2**20, peak)]["linear"] / cells[(2**20, peak)]["2dh"]
    lines += [
        "",
        "Gain for 1 MiB per GPU against the bound on the connections an HDR port serves at once "
        "(`conn_inflight`; the preset's is " + str(K) + ", 0 is no bound, 128 is NCCL's "
        "with 16 p2p channels):",
        "",
        "| conn_inflight | " + " | ".join(f"{g} GPUs" for g in sens[BOUNDS[0]]) + " |",
        "|---:|" + "---:|" * len(sens[BOUNDS[0]]),
    ]
    for b in BOUNDS:
        lines.append(
            f"| {b if b else 'none'} | " + " | ".join(f"{v:.2f}" for v in sens[b].values()) + " |"
        )
    lines += [
        "",
        f"Reading: 2DH wins for small per-peer messages on many GPUs and loses for large "
        f"messages on few GPUs, Tutel Fig. 20's shape. For 1 MiB per GPU the gain is "
        f"{g1024:.1f}x at 1,024 GPUs and {g2048:.1f}x at 2,048 (Tutel: ~10x and "
        f"{PAPER_GAIN_2048}x), {g2048 / PAPER_GAIN_2048:.2f}x the paper's at 2,048 (target: "
        f"within 1.5x, not reached); it peaks at {gpeak:.1f}x on {peak} GPUs. Before the "
        f"per-connection cost it was {BEFORE_GAIN_1MIB[1024]}x and {BEFORE_GAIN_1MIB[2048]}x; "
        f"with the cost unbounded {UNBOUNDED_GAIN_1MIB[1024]}x and "
        f"{UNBOUNDED_GAIN_1MIB[2048]}x. The NIC's per-message cost grows by `conn_cost` "
        f"({hdr.conn_cost * 1e9:.1f} ns, PipeMoE Fig. 6's all-to-all alpha at 32 and 64 GPUs) "
        f"per message sharing the NIC in a step, up to `conn_inflight` = {K} messages: NCCL "
        f"2.10.3, Tutel's version, runs a grouped send/recv in rounds of one work of 8 peers "
        f"per p2p channel, one channel per remote peer, at most 32 channels (sources in "
        f"topologies/dgx-a100.yaml). Past {K} peers the linear algorithm's messages cost "
        f"{(hdr.msg_cost + K * hdr.conn_cost) * 1e6:.2f} us each, as 2DH's 255 nearly do "
        f"({(hdr.msg_cost + 255 * hdr.conn_cost) * 1e6:.2f} us), so the gain falls back to "
        f"about the 8 GPUs per node whose messages 2DH merges, and falls from 1,024 to "
        f"2,048 GPUs where the paper's doubles. No cost bounded by the peers in flight can "
        f"double it there: that needs the linear algorithm's per-message cost at 2,040 peers "
        f"~2.6x 2DH's at 255, i.e. a cost growing with every connection a NIC holds over the "
        f"collective (NCCL keeps a queue pair per peer and channel), which no source found "
        f"here sizes. In the table, a bound of 1,024 (four times NCCL's) would give "
        f"{sens[1024][2048]:.1f}x at 2,048 but {sens[1024][1024]:.1f}x at 1,024, and no bound "
        f"gives both the paper's ~10x and ~20x. 2DH's two stride copies (Tutel Alg. 3, each a "
        f"read and write of the per-GPU buffer at the A100's memory bandwidth plus a kernel "
        f"launch) take {2 * copy_s[2**20] * 1e6:.1f} us of its "
        f"{cells[(2**20, 2048)]['2dh'] * 1e3:.2f} ms for 1 MiB at 2,048 GPUs ({c1:.1%}): the "
        f"gain is the inter-node exchange's. At "
        f"256 MiB on 64 GPUs they take {c256:.0%} of 2DH's time; with the intra-node exchange "
        f"(7/8 of the buffer once more, over NVLink) they are the extra data movement that "
        f"makes 2DH lose for large sizes on few GPUs ({s64:.2f}x there; Tutel Sec. 5.1.1: "
        f"'higher latency caused by extra data copies'). The intra-node all-to-all of 128 MiB "
        f"among 8 GPUs takes {intra_s * 1e6:.0f} us (Tutel Sec. 3.4: ~600 us).",
    ]
    atomic_write_text(OUT / "tutel_2dh_crossover.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
