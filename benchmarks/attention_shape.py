"""The attention kernels' share of peak against their shape, from a recorded GPU-suite sweep
(issue 23: "attention's share depends on sequence length and head dim").

    python benchmarks/attention_shape.py reports/gpu-h200-2026-11-27

Reads `kernels/attention.csv` of a folder `benchmarks/gpu_suite.py` wrote, takes the fastest
backend per shape and pass (what Transformer Engine's backend selection aims for), and fits
per pass the law of sim.training.attention_shape: share = s[d] / (1 + len0 / L), one len0 per
pass and one long-sequence share s[d] per head dim (least squares on log shares: len0 on a grid,
each s[d] the geometric mean its rows imply). Prints and records
(`results/attention_shape_<device>.{json,md}`) the fitted figures, every row's residual and the
`gpu.kernels.attention_shape` block for a preset (head dims relative to 128). The figures are
fitted to this sweep: scoring the law on the same rows is in-sample; its test out of sample is
the whole-step prediction (benchmarks/published_runs.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_tag, machine, record  # noqa: E402

LEN0_GRID = np.arange(20.0, 8000.0, 5.0)


def rows(folder: Path) -> list[dict]:
    """The fastest backend's row per (model, pass, shape), with L and the head dim parsed."""
    path = folder / "kernels" / "attention.csv"
    if not path.is_file():
        raise SystemExit(f"attention_shape: {path}: no such file (a GPU suite's folder?)")
    best: dict[tuple[str, str, str], dict] = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            if r.get("status", "ok") != "ok" or not r.get("peak_share"):
                continue
            key = (r["name"], r["layout"], r["shape"])
            if key not in best or float(r["peak_share"]) > float(best[key]["peak_share"]):
                best[key] = r
    out = []
    for (name, layout, shape), r in sorted(best.items()):
        length = re.search(r"\bL=(\d+)", shape)
        dim = re.search(r"\bd_qk=(\d+)", shape)
        if not (length and dim):
            continue
        out.append(
            {
                "name": name,
                "pass": layout,
                "impl": r["impl"],
                "L": int(length.group(1)),
                "d": int(dim.group(1)),
                "share": float(r["peak_share"]),
            }
        )
    return out


def fit(pass_rows: list[dict]) -> tuple[float, dict[int, float]]:
    """(len0, {head dim: long-sequence share}) minimising the squared log residuals."""
    L = np.array([r["L"] for r in pass_rows], dtype=float)
    d = np.array([r["d"] for r in pass_rows])
    logs = np.log([r["share"] for r in pass_rows])
    dims = sorted(set(d.tolist()))
    best: tuple[float, float, dict[int, float]] = (np.inf, 0.0, {})
    for len0 in LEN0_GRID:
        implied = logs + np.log1p(len0 / L)  # log s[d] each row implies
        s = {k: float(implied[d == k].mean()) for k in dims}
        err = float(sum(((implied[d == k] - s[k]) ** 2).sum() for k in dims))
        if err < best[0]:
            best = (err, float(len0), s)
    return best[1], {k: float(np.exp(v)) for k, v in best[2].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    data = rows(args.folder)
    if not data:
        raise SystemExit(f"attention_shape: {args.folder}: no attention rows with L and d_qk")
    env = args.folder / "env.json"
    device = (
        str(json.loads(env.read_text()).get("device") or "device") if env.is_file() else "device"
    )
    tag = device_tag(device)
    result: dict = {"source": str(args.folder), "device": device, "passes": {}, "rows": []}
    lines = [
        f"# Attention's share of peak against its shape: {device}",
        "",
        f"Source: `{args.folder}` (kernels/attention.csv, the fastest backend per shape). Made by "
        f"`python benchmarks/attention_shape.py {args.folder}` on {machine()}. Law "
        "(sim.training.attention_shape): share = s[d] / (1 + len0 / L). Fitted to these rows: "
        "the residuals are in-sample.",
        "",
        "| pass | len0 (tokens) | head dim: long-sequence share (relative to 128) | MAPE | worst |",
        "|---|---:|---|---:|---:|",
    ]
    table = ["", "| pass | model | backend | L | head dim | measured | law | error |"]
    table.append("|---|---|---|---:|---:|---:|---:|---:|")
    for p in ("fwd", "bwd"):
        pr = [r for r in data if r["pass"] == p]
        if not pr:
            continue
        len0, s = fit(pr)
        errs = []
        for r in pr:
            law = s[r["d"]] / (1.0 + len0 / r["L"])
            e = law / r["share"] - 1.0
            errs.append(abs(e))
            result["rows"].append({**r, "law": law, "error": e})
            table.append(
                f"| {p} | {r['name']} | {r['impl']} | {r['L']} | {r['d']} | {r['share']:.3f} "
                f"| {law:.3f} | {100 * e:+.1f}% |"
            )
        base = s.get(128)
        rel = {k: (v / base if base else None) for k, v in s.items()}
        result["passes"][p] = {"len0": len0, "share_inf": s, "relative_to_128": rel}
        heads = ", ".join(
            f"{k}: {v:.3f} ({rel[k]:.2f})" if rel[k] else f"{k}: {v:.3f}" for k, v in s.items()
        )
        lines.append(
            f"| {p} | {len0:.0f} | {heads} | {100 * np.mean(errs):.1f}% | {100 * max(errs):.1f}% |"
        )
    if all(128 in result["passes"].get(p, {}).get("share_inf", {}) for p in ("fwd", "bwd")):
        fw, bw = result["passes"]["fwd"], result["passes"]["bwd"]
        dims = sorted(set(fw["share_inf"]) & set(bw["share_inf"]))
        block = ", ".join(
            f"{k}: {{fwd: {fw['relative_to_128'][k]:.2f}, bwd: {bw['relative_to_128'][k]:.2f}}}"
            for k in dims
        )
        yaml = (
            f"attention_shape: {{len0: {{fwd: {fw['len0']:.0f}, bwd: {bw['len0']:.0f}}}, "
            f"head_dim: {{{block}}}}}"
        )
        result["preset_block"] = yaml
        lines += ["", "For a preset's `gpu.kernels`:", "", f"    {yaml}"]
    record(f"attention_shape_{tag}", result, lines + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
