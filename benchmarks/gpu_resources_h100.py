# ruff: noqa: E501  (markdown table rows are kept one line each)
"""GPU-internal resources (SMs, HBM bandwidth, copy engines) against one measured H100 SXM.

Simulates, with the `dgx-h100` preset's `gpu.resources` (sim.hardware.costs.resources), a bf16
GEMM ([2,8192,4096] x [2,4096,14336]) beside
- a kernel that holds k SMs and touches no memory, every row of `sm_spin.csv`;
- a copy kernel on k SMs (one block per SM, streaming memory), every row of `sm_contention.csv`;
- a pinned 512 MiB d2h on the copy engine, and a 512 MiB device copy kernel: the
  `overlap_gemm_with_*` rows of `h100_micro.csv`. PyTorch's copy kernel reserves no SMs: it
  gets the SMs the GEMM's blocks leave. Its share is inferred from the copy's own overlapped
  time (the fewest SMs at which the model's copy is no faster than measured), so the copy's
  time is fitted there and only the GEMM's speed in that row is a prediction.
and reports the GEMM's simulated speed (alone time over overlapped time) against the measured.

    python benchmarks/gpu_resources_h100.py          # score the preset; write the results
    python benchmarks/gpu_resources_h100.py --fit    # refit sm_penalty, sm_share, sm_bw, mem_*

The fit: sm_penalty and sm_share by least squares of relative errors over sm_spin.csv;
sm_bw through the origin over the copy's alone bandwidth at k <= 24 (below the HBM limit);
mem_knee and mem_slope by least squares over sm_contention.csv rows with k <= 48 (the rows
sm_spin.csv also covers), given the SM part. Results: benchmarks/results/gpu_resources_h100.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.graph import Task, TaskGraph
from sim.core.io import atomic_write_text
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared/reference/measurements/h100-sxm-2026-11-23"
OUT = ROOT / "benchmarks/results"
MACHINE = "2-core CI-class container (simulation); measurements: one H100 80GB HBM3 SXM"
SHAPE = {"batch": 2, "m": 8192, "n": 14336, "k": 4096}
FLOPS = 2.0 * 2 * 8192 * 4096 * 14336
MIB512 = 512 * 2**20


def _gemm() -> Task:
    return Task(
        "gemm", 0, "compute", "gemm", flops=FLOPS, shape=dict(SHAPE), tags={"dtype": "bf16"}
    )


def _run(tasks: list[Task], costs_spec: dict | None = None) -> dict[str, float]:
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, costs_spec or {})
    g = TaskGraph(1)
    for t in tasks:
        g.add(t)
    r = simulate(g, topo, costs)
    return {t.id: float(r.end[i] - r.start[i]) for i, t in enumerate(g)}


def gemm_alone(spec: dict | None = None) -> float:
    return _run([_gemm()], spec)["gemm"]


def beside_spin(k: int, spec: dict | None = None) -> float:
    """GEMM speed beside a kernel holding k SMs, no memory traffic, outlasting the GEMM."""
    t0 = gemm_alone(spec)
    spin = Task("spin", 0, "compute.1", "elementwise", flops=1e17, sms=k, tags={"dtype": "bf16"})
    return t0 / _run([spin, _gemm()], spec)["gemm"]


def beside_copy(k: int, nbytes: float, spec: dict | None = None) -> tuple[float, float, float]:
    """(GEMM speed, copy's time, copy's time alone) beside a copy kernel on k SMs."""
    t0 = gemm_alone(spec)
    copy = Task("copy", 0, "compute.1", "d2d", bytes=nbytes, sms=k, tags={"dtype": "bf16"})
    alone = _run([copy], spec)["copy"]
    both = _run([copy, _gemm()], spec)
    return t0 / both["gemm"], both["copy"], alone


def beside_d2h(spec: dict | None = None) -> tuple[float, float, float]:
    t0 = gemm_alone(spec)
    d2h = Task("d2h", 0, "copy", "d2h", bytes=float(MIB512))
    alone = _run([d2h], spec)["d2h"]
    both = _run([d2h, _gemm()], spec)
    return t0 / both["gemm"], alone / both["d2h"], alone


# -- fit -------------------------------------------------------------------------------------
def fit(spin: pd.DataFrame, cont: pd.DataFrame, S: int = 132, mem_bw: float = 3.35e12) -> dict:
    k, y = spin["sms_spinning"].to_numpy(float), spin["gemm_speed"].to_numpy(float)
    best = (math.inf, 0.0, 0.0)
    for p in np.linspace(0.85, 1.0, 301):
        for b in np.linspace(0.3, 1.0, 701):
            e = float(np.sum((p / ((1 - b) + b * S / (S - k)) / y - 1) ** 2))
            best = min(best, (e, p, b))
    _, p, b = best
    low = cont[cont["sms"] <= 24]
    kk, bw = low["sms"].to_numpy(float), low["copy_alone_GBps"].to_numpy(float) * 1e9
    sm_bw = float(np.sum(kk * bw) / np.sum(kk * kk))
    c = cont[cont["sms"] <= 48]
    kc, yc = c["sms"].to_numpy(float), c["gemm_speed"].to_numpy(float)
    u = np.minimum(kc * sm_bw, 0.9 * mem_bw) / mem_bw  # the model's copy: SM-bound, then HBM
    sm = p / ((1 - b) + b * S / (S - kc))
    best = (math.inf, 0.0, 0.0)
    for u0 in np.linspace(0, 0.6, 601):
        for mu in np.linspace(0, 3, 301):
            pred = sm * np.maximum(0.05, 1 - mu * np.maximum(0, u - u0))
            e = float(np.sum((pred / yc - 1) ** 2))
            best = min(best, (e, u0, mu))
    return {
        "sm_penalty": round(float(p), 3),
        "sm_share": round(float(b), 3),
        "sm_bw": float(f"{sm_bw:.3g}"),
        "mem_knee": round(float(best[1]), 3),
        "mem_slope": round(float(best[2]), 3),
    }


# -- score -----------------------------------------------------------------------------------
def score() -> dict:
    spin = pd.read_csv(DATA / "sm_spin.csv")
    cont = pd.read_csv(DATA / "sm_contention.csv")
    micro = pd.read_csv(DATA / "h100_micro.csv").set_index("bench")
    rows = []
    for _, r in spin.iterrows():
        k = int(r["sms_spinning"])
        rows.append(
            {
                "file": "sm_spin.csv",
                "case": f"spin on {k} SMs",
                "sms": k,
                "measured": float(r["gemm_speed"]),
                "simulated": beside_spin(k),
            }
        )
    for _, r in cont.iterrows():
        k = int(r["sms"])
        nbytes = 2 * 256 * 2**20 * 400.0  # outlasts the GEMM at any k
        sp, t_both, t_alone = beside_copy(k, nbytes)
        rows.append(
            {
                "file": "sm_contention.csv",
                "case": f"copy kernel on {k} SMs",
                "sms": k,
                "measured": float(r["gemm_speed"]),
                "simulated": sp,
                "copy_alone_GBps_measured": float(r["copy_alone_GBps"]),
                "copy_alone_GBps_simulated": nbytes / t_alone / 1e9,
                "copy_with_gemm_GBps_measured": float(r["copy_with_gemm_GBps"]),
                "copy_with_gemm_GBps_simulated": nbytes / t_both / 1e9,
            }
        )
    g_d2h, c_d2h, _ = beside_d2h()
    m_alone = float(micro.loc["alone_gemm", "t_med_s"])
    m_d2h = micro.loc["overlap_gemm_with_d2h"]
    rows.append(
        {
            "file": "h100_micro.csv",
            "case": "pinned d2h 512 MiB (copy engine): GEMM",
            "sms": 0,
            "measured": m_alone / float(m_d2h["t_med_s"]),
            "simulated": g_d2h,
        }
    )
    rows.append(
        {
            "file": "h100_micro.csv",
            "case": "pinned d2h 512 MiB (copy engine): d2h",
            "sms": 0,
            "measured": float(micro.loc["alone_d2h", "t_med_s"]) / float(m_d2h["t_min_s"]),
            "simulated": c_d2h,
        }
    )
    m_d2d = micro.loc["overlap_gemm_with_d2d"]
    d2d_bytes = 2.0 * MIB512  # read + write
    slow_meas = float(m_d2d["t_min_s"]) / float(micro.loc["alone_d2d", "t_med_s"])
    k = 1
    while k < 132 and beside_copy(k, d2d_bytes)[1] > float(m_d2d["t_min_s"]):
        k += 1
    sp, t_both, t_alone = beside_copy(k, d2d_bytes)
    rows.append(
        {
            "file": "h100_micro.csv",
            "case": f"device copy 512 MiB (kernel, inferred {k} SMs): GEMM",
            "sms": k,
            "measured": m_alone / float(m_d2d["t_med_s"]),
            "simulated": sp,
        }
    )
    rows.append(
        {
            "file": "h100_micro.csv",
            "case": f"device copy 512 MiB (kernel, inferred {k} SMs): copy slowdown x",
            "sms": k,
            "measured": slow_meas,
            "simulated": t_both / gemm_copy_alone(d2d_bytes),
            "fitted": True,
        }
    )
    for r in rows:
        r["error_pct"] = 100.0 * (r["simulated"] / r["measured"] - 1)
    return {
        "machine": MACHINE,
        "preset": "dgx-h100",
        "resources": Topology.load("dgx-h100", nodes=1).gpu.get("resources"),
        "fit": fit(spin, cont),
        "rows": rows,
    }


def gemm_copy_alone(nbytes: float) -> float:
    """The device copy kernel alone, on every SM (what `alone_d2d` measured)."""
    return _run([Task("copy", 0, "compute", "d2d", bytes=nbytes, tags={"dtype": "bf16"})])["copy"]


def write(data: dict) -> None:
    atomic_write_text(OUT / "gpu_resources_h100.json", json.dumps(data, indent=2) + "\n")
    errs = [abs(r["error_pct"]) for r in data["rows"] if not r.get("fitted")]
    inside = [abs(r["error_pct"]) for r in data["rows"] if not r.get("fitted") and r["sms"] <= 48]
    md = [
        "# GPU-internal resources: simulated vs measured GEMM slowdown on an H100 SXM",
        "",
        f"Machine: {MACHINE}. Data: `shared/reference/measurements/h100-sxm-2026-11-23`. "
        "Model: `dgx-h100` `gpu.resources` (sim.hardware.costs.resources). "
        "`python benchmarks/gpu_resources_h100.py`.",
        "",
        f"Preset parameters: `{data['resources']}`; a refit today gives `{data['fit']}`.",
        "",
        f"Mean |error| over the GEMM speeds: {np.mean(inside):.1f}% (worst {max(inside):.1f}%) over the "
        f"{len(inside)} rows with at most 48 SMs reserved (the fit's range); {np.mean(errs):.1f}% "
        f"(worst {max(errs):.1f}%) over all {len(errs)}.",
        "",
        "| file | case | measured | simulated | error |",
        "|---|---|---:|---:|---:|",
    ]
    for r in data["rows"]:
        tag = " (fitted)" if r.get("fitted") else ""
        md.append(
            f"| {r['file']} | {r['case']}{tag} | {r['measured']:.3f} | {r['simulated']:.3f} | {r['error_pct']:+.1f}% |"
        )
    md += [
        "",
        "Copy kernel bandwidth (sm_contention.csv; the model does not slow a reserving kernel, so its "
        "bandwidth beside the GEMM is its alone bandwidth):",
        "",
        "| SMs | alone measured GB/s | alone simulated | with GEMM measured | with GEMM simulated |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        if "copy_alone_GBps_measured" in r:
            md.append(
                f"| {r['sms']} | {r['copy_alone_GBps_measured']:.0f} | {r['copy_alone_GBps_simulated']:.0f} "
                f"| {r['copy_with_gemm_GBps_measured']:.0f} | {r['copy_with_gemm_GBps_simulated']:.0f} |"
            )
    md += [
        "",
        "Notes: rows of sm_contention.csv above 48 SMs are outside the fit (sm_spin.csv stops at 48): "
        "there the copy kernel holds more than a third of the SMs and the GEMM's measured speed flattens at "
        "~0.4 (the copy's blocks, one per SM with 120 KB of shared memory, leave the GEMM room it still uses) "
        "while the model's keeps falling with the SMs, to 0.04 when all 132 are taken (it caps the reservation "
        "at 131). The memory term is a knee: a streaming neighbour below ~6% of HBM bandwidth costs only its "
        "SMs, so the copy on 1-4 SMs slows the GEMM 4-6% less than measured. The model does not slow the "
        "reserving kernel itself (measured: the copy loses 10-35% beside the GEMM).",
        "",
    ]
    atomic_write_text(OUT / "gpu_resources_h100.md", "\n".join(md) + "\n")
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="print the refitted parameters only")
    a = ap.parse_args()
    if a.fit:
        print(fit(pd.read_csv(DATA / "sm_spin.csv"), pd.read_csv(DATA / "sm_contention.csv")))
        return
    write(score())


if __name__ == "__main__":
    main()
