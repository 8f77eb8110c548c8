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
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, record  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", required=True, help="1-based table rows")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--scheduler", help="a Dask scheduler address or dask-local")
    ap.add_argument("--budget-s", type=float, default=None, help="start no row after this")
    a = ap.parse_args()
    rows = read_table(TABLE)
    start = time.time()
    load0 = os.getloadavg()[0]
    out: list[dict] = []
    lines = [
        "# `moesim plan` on published runs",
        "",
        f"Machine: {machine()} (shared with other work); load average {load0:.1f} at the "
        f"start; {a.workers} worker(s)"
        + (f" on Dask ({a.scheduler})" if a.scheduler else "")
        + ". Regenerate: `python benchmarks/plan_published.py --rows "
        + " ".join(map(str, a.rows))
        + f" --workers {a.workers}`.",
        "",
        "Pruned: dropped before simulation for memory / compute bound / bound with the "
        "collectives at their floor (no simulation) / bound with the collectives simulated "
        "(in the workers).",
        "",
        "| row | run | candidates | simulated | pruned mem / bound / floor / comm | wall s | "
        "published layout | its tok/s/GPU | rank | fits | best | best tok/s/GPU | "
        "best ahead by | within 10% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
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
        given = published(r)
        t0 = time.time()
        p = plan(req, given=given, workers=a.workers, scheduler=a.scheduler)
        wall = time.time() - t0
        g, best = p.given or {}, (p.candidates[0] if p.candidates else {})
        gt = g.get("predicted_tokens_per_s_per_gpu")
        bt = best.get("predicted_tokens_per_s_per_gpu")
        ahead = (bt / gt - 1) if gt and bt else None
        label = (
            f"TP{given.tp} CP{given.cp} PP{given.pp} VP{given.vp} EP{given.ep} MBS{given.mbs}"
            + (" FSDP" if given.fsdp else "")
            + (f" {given.dispatcher}" if given.ep > 1 else "")
            + (f" offload {given.offload}" if given.offload else "")
        )
        best_label = (
            f"TP{best.get('tp')} CP{best.get('cp')} PP{best.get('pp')} VP{best.get('vp')} "
            f"EP{best.get('ep')} MBS{best.get('mbs')}"
            + (" FSDP" if best.get("fsdp") else "")
            + (f" {best.get('dispatcher')}" if int(best.get("ep") or 1) > 1 else "")
            + (f" offload {best.get('offload')}" if best.get("offload") else "")
        )
        pr = p.pruned
        within = "" if ahead is None else ("yes" if ahead <= 0.10 else "no")
        lines.append(
            f"| {n} | {r['release']} {r['system']} {r['model']} {r['variant']} "
            f"{r['precision']} {r['gpus']} GPUs "
            f"| {p.considered} | {p.simulated} | {pr.get('memory', 0)} / {pr.get('bound', 0)} / "
            f"{pr.get('comm_floor', 0)} / {pr.get('comm_bound', 0)} | {wall:.0f} | {label} | "
            f"{'' if gt is None else f'{gt:,.0f}'} | {g.get('rank', '-')} | {g.get('fits', '-')} "
            f"| {best_label} | {'' if bt is None else f'{bt:,.0f}'} | "
            f"{'' if ahead is None else f'{100 * ahead:+.1f}%'} | {within} |"
        )
        if g.get("reason"):
            lines.append(f"|  | published layout not built: {g['reason']} |" + " |" * 12)
        if gt and bt and ahead is not None and ahead > 0.10:
            lines.append(f"|  | best vs published: {why(best, g)} |" + " |" * 12)
        out.append(
            {
                "row": n,
                "considered": p.considered,
                "simulated": p.simulated,
                "pruned": p.pruned,
                "wall_s": wall,
                "given": g,
                "best": best,
            }
        )
    lines += [
        "",
        f"Total wall time {time.time() - start:.0f} s; load average "
        f"{os.getloadavg()[0]:.1f} at the end."
        + (f" Not run (over the time budget): rows {skipped}." if skipped else ""),
    ]
    record(
        "plan_published",
        {"machine": machine(), "load_start": load0, "rows": out, "skipped": skipped},
        lines,
    )


if __name__ == "__main__":
    main()
