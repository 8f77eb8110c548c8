"""What paces each predicted training step, and where the errors lie by it (issue 23): every row
of the shared published table and of the held-out later releases predicted with
`moesim predict --sensitivity` (`sim.training.sensitivity`: the step's elasticity to the GPU,
the host's launches and the links' bandwidth, each made 25% faster in turn).

Records, in benchmarks/results/step_sensitivity.{json,md}: per row the resource that paces
it, the three elasticities and the signed error against the published tokens/s/GPU; the MAPE
and the mean signed error of the rows each resource paces, per table and system; and whether
any elasticity is negative (a faster resource slowing the step: a modelling defect).

    python benchmarks/step_sensitivity.py [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, record  # noqa: E402
from sim.training.predict import predict_rows, read_table  # noqa: E402
from sim.training.sensitivity import FASTER, RESOURCES  # noqa: E402

TABLES = {
    "shared": ROOT.parent / "shared" / "reference" / "published-runs" / "megatron_bridge_perf.csv",
    "held-out": ROOT / "benchmarks" / "heldout" / "megatron_bridge_later.csv",
}


def by_bound(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per resource that paces a row: rows, MAPE and mean signed error (measured rows only)."""
    out: dict[str, dict[str, float]] = {}
    for k in RESOURCES:
        errs = [r["error"] for r in rows if r.get("bound_by") == k and r.get("error") is not None]
        if errs:
            out[k] = {
                "rows": len(errs),
                "mape": sum(abs(e) for e in errs) / len(errs),
                "mean_error": sum(errs) / len(errs),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="local processes")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    t0 = time.time()
    data: dict[str, Any] = {"machine": machine(), "faster": FASTER, "tables": {}}
    lines = [
        "# What paces each predicted step (`moesim predict --sensitivity`)",
        "",
        "",  # the machine line, once the wall time is known
        "",
        f"Each resource is made {FASTER:g}x faster in turn (the GPU: every dtype's peak, HBM and "
        "its per-kernel floor; the host: its time per launched operation; the links: every link "
        f"class's bandwidth) and the step simulated again; the elasticity is ln(step / step') / "
        f"ln({FASTER:g}): 1 where the step scales fully with the resource, 0 where it does not "
        "depend on it. 'paced by' is the resource with the largest. Errors are the predicted "
        "tokens/s/GPU over the published ones, minus 1 (positive: the model is too fast).",
    ]
    negative: list[str] = []
    for name, path in TABLES.items():
        rows = read_table(path)
        res = predict_rows(rows, workers=a.workers, sensitivity=True)["rows"]
        data["tables"][name] = {
            "table": path.name,
            "rows": [
                {
                    k: r.get(k)
                    for k in ("release", "system", "model", "variant", "precision", "gpus")
                }
                | {k: r.get(k) for k in ("sensitivity", "bound_by", "error", "reason")}
                for r in res
            ],
            "by_bound": by_bound(res),
        }
        lines += [
            "",
            f"## {name}: `{path.name}`",
            "",
            "| paced by | rows | MAPE | mean signed error |",
            "|---|---|---|---|",
        ]
        for k, m in data["tables"][name]["by_bound"].items():
            mape, mean = 100 * m["mape"], 100 * m["mean_error"]
            lines.append(f"| {k} | {m['rows']:.0f} | {mape:.1f}% | {mean:+.1f}% |")
        lines += [
            "",
            "| # | release | system | model | prec | GPUs | paced by | gpu | host | links "
            "| error |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for n, r in enumerate(res, start=1):
            head = (
                f"| {n} | {r.get('release', '')} | {r['system']} | "
                f"{r['model']} {r.get('variant', '')} | {r['precision']} | {r['gpus']} |"
            )
            if r.get("reason"):
                lines.append(head + f" not built: {r['reason']} | | | | |")
                continue
            s, err = r["sensitivity"], r.get("error")
            negative += [f"{name} row {n}: {k} {v:.3f}" for k, v in s.items() if v < -1e-9]
            lines.append(
                head + f" {r['bound_by']} | {s['gpu']:.2f} | {s['host']:.2f} | {s['links']:.2f} | "
                f"{'' if err is None else f'{100 * err:+.1f}%'} |"
            )
    wall = time.time() - t0
    data["wall_s"], data["negative"] = wall, negative
    lines[2] = (
        f"Machine: {machine()}; load average {load:.1f} at the start; both tables in "
        f"{wall:.0f} s wall on {a.workers} process(es)."
    )
    lines += [
        "",
        "## A faster resource never slows a step",
        "",
        "Negative elasticities: " + ("; ".join(negative) if negative else "none."),
    ]
    record("step_sensitivity", data, lines)


if __name__ == "__main__":
    main()
