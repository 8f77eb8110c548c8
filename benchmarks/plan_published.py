"""`moesim plan` on the published runs (issue 24's check): for rows of
`shared/reference/published-runs/megatron_bridge_perf.csv`, plan the row's model on its system,
GPU count, batch, sequence and precision, with the published layout given, and record whether
the plan finds that layout feasible, its rank, and how far the plan's best is ahead of it (and
what the best changes). Results: benchmarks/results/plan_published.{json,md}.

    python benchmarks/plan_published.py --rows 4 14 15 20 [--workers 2] [--budget-s 1200]

The published layout is scored as the plan scores every candidate: the request's recipe
(the newest recorded for the model, system and precision) with the row's recipe's EP
overlap, dispatcher, recomputation and offloaded layers (PP 1 only: Megatron-Core offloads
nothing with a pipeline), the pipeline split evenly; it can differ from `moesim predict` of
the row (its release's recipe and layout string). `--budget-s`: no new row is started after
that many seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine, record  # noqa: E402
from sim.training.plan import plan  # noqa: E402
from sim.training.plan_report import why  # noqa: E402
from sim.training.plan_space import Candidate, Request  # noqa: E402
from sim.training.predict import read_table  # noqa: E402

TABLE = ROOT.parent / "shared" / "reference" / "published-runs" / "megatron_bridge_perf.csv"


def _int(v: str, default: int = 1) -> int:
    return int(float(v)) if str(v).strip() else default


def published(row: dict[str, str]) -> Candidate:
    """The row's layout with its recipe's EP overlap, recomputation and offloading
    (recipes.yaml)."""
    from sim.training.recipe import recipe_for

    rec = recipe_for(row["model"], row["system"], row["precision"], row["release"])
    recompute = "full" if rec.recompute_full else ("selective" if rec.recompute_modules else "none")
    return Candidate(
        tp=_int(row["tp"]),
        cp=_int(row["cp"]),
        pp=_int(row["pp"]),
        vp=_int(row["vp"]),
        ep=_int(row["ep"]),
        mbs=_int(row["mbs"]),
        ep_overlap=rec.ep_overlap and _int(row["ep"]) > 1,
        recompute=recompute,
        fsdp=_int(row["fsdp"], 0) > 0,
        dispatcher=""
        if _int(row["ep"]) <= 1
        else (rec.dispatcher if rec.dispatcher in ("alltoall", "deepep") else "alltoall"),
        offload=rec.offload_layers if _int(row["pp"]) == 1 and recompute == "none" else 0,
    )


def label_of(c: Candidate) -> str:
    return (
        f"TP{c.tp} CP{c.cp} PP{c.pp} VP{c.vp} EP{c.ep} MBS{c.mbs}"
        + (" FSDP" if c.fsdp else "")
        + (f" {c.dispatcher}" if c.ep > 1 else "")
        + (f" offload {c.offload}" if c.offload else "")
    )


def row_lines(n: int, r: dict[str, str], rec: dict[str, Any]) -> list[str]:
    """The table lines of a row's record (`rec`: its entry in plan_published.json)."""
    g, best, pr = rec["given"] or {}, rec["best"] or {}, rec["pruned"]
    gt = g.get("predicted_tokens_per_s_per_gpu")
    bt = best.get("predicted_tokens_per_s_per_gpu")
    ahead = (bt / gt - 1) if gt and bt else None
    best_label = (
        f"TP{best.get('tp')} CP{best.get('cp')} PP{best.get('pp')} VP{best.get('vp')} "
        f"EP{best.get('ep')} MBS{best.get('mbs')}"
        + (" FSDP" if best.get("fsdp") else "")
        + (f" {best.get('dispatcher')}" if int(best.get("ep") or 1) > 1 else "")
        + (f" offload {best.get('offload')}" if best.get("offload") else "")
    )
    within = "" if ahead is None else ("yes" if ahead <= 0.10 else "no")
    out = [
        f"| {n} | {r['release']} {r['system']} {r['model']} {r['variant']} "
        f"{r['precision']} {r['gpus']} GPUs "
        f"| {rec['considered']} | {rec['simulated']} | {pr.get('memory', 0)} / "
        f"{pr.get('bound', 0)} / {pr.get('comm_floor', 0)} / {pr.get('comm_bound', 0)} | "
        f"{rec['wall_s']:.0f} | {label_of(published(r))} | "
        f"{'' if gt is None else f'{gt:,.0f}'} | {g.get('rank', '-')} | {g.get('fits', '-')} "
        f"| {best_label} | {'' if bt is None else f'{bt:,.0f}'} | "
        f"{'' if ahead is None else f'{100 * ahead:+.1f}%'} | {within} |"
    ]
    if g.get("reason"):
        out.append(f"|  | published layout not built: {g['reason']} |" + " |" * 12)
    if gt and bt and ahead is not None and ahead > 0.10:
        out.append(f"|  | best vs published: {why(best, g)} |" + " |" * 12)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", required=True, help="1-based table rows")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--scheduler", help="a Dask scheduler address or dask-local")
    ap.add_argument("--budget-s", type=float, default=None, help="start no row after this")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="replace these rows in the recorded results and keep the others",
    )
    a = ap.parse_args()
    rows = read_table(TABLE)
    start = time.time()
    load0 = os.getloadavg()[0]
    out: list[dict] = []
    skipped = []
    for n in a.rows:
        if a.budget_s is not None and time.time() - start > a.budget_s:
            skipped.append(n)
            continue
        r = rows[n - 1]
        req = Request(
            r["model"],
            r["system"],
            _int(r["gpus"]),
            _int(r["gbs"]),
            _int(r["seq_len"]),
            r["precision"].upper(),
            where=f"row {n}",
        )
        t0 = time.time()
        p = plan(req, given=published(r), workers=a.workers, scheduler=a.scheduler)
        out.append(
            {
                "row": n,
                "considered": p.considered,
                "simulated": p.simulated,
                "pruned": p.pruned,
                "wall_s": time.time() - t0,
                "given": p.given or {},
                "best": p.candidates[0] if p.candidates else {},
                "recorded": time.strftime("%Y-%m-%d"),
            }
        )
    wall, load1 = time.time() - start, os.getloadavg()[0]
    ran = [rec["row"] for rec in out]
    kept: list[dict] = []
    earlier: dict[str, Any] = {}
    if a.merge and (RESULTS / "plan_published.json").exists():
        earlier = json.loads((RESULTS / "plan_published.json").read_text())
        kept = [rec for rec in earlier.get("rows", []) if rec["row"] not in ran]
    every = sorted(kept + out, key=lambda rec: rec["row"])
    run_line = (
        f"Machine: {machine()} (shared with other work); load average {load0:.1f} at the "
        f"start; {a.workers} worker(s)"
        + (f" on Dask ({a.scheduler})" if a.scheduler else "")
        + ". Regenerate: `python benchmarks/plan_published.py --rows "
        + " ".join(map(str, a.rows))
        + f" --workers {a.workers}"
        + (" --merge`." if a.merge else "`.")
    )
    lines = ["# `moesim plan` on published runs", "", run_line, ""]
    if kept:
        lines += [
            f"Merged: rows {', '.join(map(str, ran))} run now ({wall:.0f} s wall, load "
            f"average {load1:.1f} at the end); the other {len(kept)} rows are kept from "
            f"the earlier record ({'; '.join(earlier.get('runs', []) or ['full run: rows 1-54'])}"
            "), scored with the memory model and recipes as they were then (in the JSON, a "
            "row's `recorded` gives the day it ran; the full run's rows have none): run them "
            "again to see them with today's.",
            "",
        ]
    lines += [
        "Pruned: dropped before simulation for memory / compute bound / bound with the "
        "collectives at their floor (no simulation) / bound with the collectives simulated "
        "(in the workers).",
        "",
        "| row | run | candidates | simulated | pruned mem / bound / floor / comm | wall s | "
        "published layout | its tok/s/GPU | rank | fits | best | best tok/s/GPU | "
        "best ahead by | within 10% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in every:
        lines += row_lines(rec["row"], rows[rec["row"] - 1], rec)
    lines += [
        "",
        f"Wall time of the rows run now {wall:.0f} s; load average {load1:.1f} at the end."
        + (f" Not run (over the time budget): rows {skipped}." if skipped else ""),
    ]
    runs = list(earlier.get("runs", []) or (["full run: rows 1-54"] if kept else []))
    runs.append(f"{time.strftime('%Y-%m-%d')}: rows {' '.join(map(str, ran))}")
    record(
        "plan_published",
        {
            "machine": machine(),
            "load_start": load0,
            "rows": every,
            "skipped": skipped,
            "runs": runs,
        },
        lines,
    )


if __name__ == "__main__":
    main()
