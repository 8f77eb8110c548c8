"""A GEMM's share of peak against its reduction length K, from a recorded GPU-suite run
(issue 23: the FP8 expert GEMMs of DeepSeek-V3 reach 0.50-0.60 where 8192^3 reaches 0.69).

    python benchmarks/gemm_k.py reports/gpu-h200-2026-11-27 [--sms 132]

Each output tile does fixed work (prologue, epilogue) beside its loop over K, so a GEMM's
share falls as 1 / (1 + k0 / K) (sim.training.kernels.GpuKernels.k_share). This takes the
dense GEMMs, the fastest implementation of each grouped expert GEMM and the FP8 GEMMs of the
folder (benchmarks/suite_models_score.kernel_cases reads them as the step model builds its
GEMMs), divides each one's achieved share by the share of SM waves its tiles fill, and fits
per dtype one k0 with one long-K share for the dense and one for the grouped GEMMs (least
squares on log shares, k0 on a grid). It prints and records
(`results/gemm_k_<device>.{json,md}`) the fits, the error of one share per part against the
law's, and the grouped share the law implies (the median over the cases with >= 2048 tokens
per expert of each case's share over gemm[bf16] x k_share, as `gpu.kernels.grouped_gemm`).
Fitted to this run: in-sample; its test out of sample is the whole-step prediction.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_tag, machine, record  # noqa: E402
from benchmarks.suite_models_score import kernel_cases, read_kernels  # noqa: E402
from sim.training.kernels import K_REF, TILE  # noqa: E402

GRID = np.arange(0.0, 6000.0, 10.0)
PARTS = {"gemm (dense)": "dense", "grouped (best impl)": "grouped", "fp8": "dense"}
PARTS["fp8 grouped"] = "grouped"


def wave(m: float, n: float, experts: int, sms: int) -> float:
    tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1]) * max(1, experts)
    return tiles / (math.ceil(tiles / sms) * sms)


def cases(folder: Path, sms: int, peaks: dict[str, float]) -> list[dict]:
    out = []
    for group, r, w, kernels, _ in kernel_cases(read_kernels(folder)):
        if group not in PARTS or w.shape is None or w.dtype not in peaks or kernels != 1:
            continue
        m, n, k = w.shape
        share = w.flops / (peaks[w.dtype] * float(r.median_s))
        out.append(
            {
                "part": PARTS[group],
                "dtype": w.dtype,
                "name": f"{r.name} {r.impl} {r.layout}",
                "m": m,
                "n": n,
                "k": k,
                "experts": w.experts,
                "share": share / wave(m, n, w.experts, sms),
            }
        )
    return out


def fit(rows: list[dict]) -> tuple[float, dict[str, float]]:
    """(k0, {part: long-K share}) minimising the squared log residuals."""
    k = np.array([r["k"] for r in rows], dtype=float)
    logs = np.log([r["share"] for r in rows])
    parts = np.array([r["part"] for r in rows])
    best: tuple[float, float, dict[str, float]] = (np.inf, 0.0, {})
    for k0 in GRID:
        implied = logs + np.log1p(k0 / k)
        s = {p: float(implied[parts == p].mean()) for p in sorted(set(parts.tolist()))}
        err = float(sum(((implied[parts == p] - s[p]) ** 2).sum() for p in s))
        if err < best[0]:
            best = (err, float(k0), s)
    return best[1], {p: float(np.exp(v)) for p, v in best[2].items()}


def mape(rows: list[dict], k0: float, s: dict[str, float]) -> float:
    return float(np.mean([abs(s[r["part"]] / (1 + k0 / r["k"]) / r["share"] - 1) for r in rows]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--sms", type=int, default=0, help="SMs (default: the suite's env.json)")
    a = ap.parse_args(argv)
    env_path = a.folder / "env.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    sms = a.sms or int(env.get("sms") or 0)
    peaks = {d: float(v) for d, v in (env.get("preset", {}).get("peak_flops") or {}).items()}
    if sms < 1 or not peaks:
        raise SystemExit(f"gemm_k: {a.folder}: env.json names no SMs or preset peaks")
    rows = cases(a.folder, sms, peaks)
    if not rows:
        raise SystemExit(f"gemm_k: {a.folder}: no GEMM rows with a shape")
    device = str(env.get("device") or "device")
    tag = device_tag(device)
    result: dict = {"source": str(a.folder), "device": device, "sms": sms, "dtypes": {}}
    lines = [
        f"# A GEMM's share of peak against its reduction length K: {device}",
        "",
        f"Source: `{a.folder}`. Made by `python benchmarks/gemm_k.py {a.folder}` on "
        f"{machine()}. Law: share = s[part] x wave / (1 + k0 / K), wave the share of SM "
        f"waves the tiles fill ({TILE[0]} x {TILE[1]} tiles, {sms} SMs). Fitted to these "
        "rows: in-sample.",
        "",
        "| dtype | rows | k0 | long-K share dense / grouped | MAPE one share | MAPE law |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for dtype in sorted({r["dtype"] for r in rows}):
        dr = [r for r in rows if r["dtype"] == dtype]
        k0, s = fit(dr)
        s0 = {
            p: float(np.exp(np.mean(np.log([r["share"] for r in dr if r["part"] == p])))) for p in s
        }
        one, law = mape(dr, 0.0, s0), mape(dr, k0, s)
        result["dtypes"][dtype] = {"rows": len(dr), "k0": k0, "share_inf": s, "mape_one": one}
        result["dtypes"][dtype]["mape_law"] = law
        parts = " / ".join(f"{s.get(p, float('nan')):.3f}" for p in ("dense", "grouped"))
        lines.append(
            f"| {dtype} | {len(dr)} | {k0:.0f} | {parts} | {100 * one:.1f}% | {100 * law:.1f}% |"
        )
    bf = result["dtypes"].get("bf16")
    if bf:
        k0 = bf["k0"]
        dense = [r for r in rows if r["dtype"] == "bf16" and r["part"] == "dense"]
        big = max(dense, key=lambda r: r["m"] * r["n"] * r["k"], default=None)
        if big is not None:
            ref = big["share"] / ((1 + k0 / K_REF) / (1 + k0 / big["k"]))
            per = [
                r["share"] / (ref * (1 + k0 / K_REF) / (1 + k0 / r["k"]))
                for r in rows
                if r["dtype"] == "bf16" and r["part"] == "grouped" and min(r["m"], r["k"]) >= 2048
            ]
            if per:
                g = statistics.median(per)
                result["grouped_gemm"] = g
                lines += [
                    "",
                    f"Grouped share at the law's K (cases with >= 2048 tokens per expert, over "
                    f"the largest dense GEMM's share carried to K = {K_REF:.0f}): median "
                    f"{g:.3f} (range {min(per):.2f}-{max(per):.2f}, {len(per)} cases).",
                ]
    record(f"gemm_k_{tag}", result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
