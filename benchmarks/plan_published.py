"""`moesim plan` on the published runs (issue 24's check): for rows of
`shared/reference/published-runs/megatron_bridge_perf.csv`, plan the row's model on its system,
GPU count, batch, sequence and precision, with the published layout given, and record whether
the plan finds that layout feasible, its rank, and how far the plan's best is ahead of it (and
what the best changes). Results: benchmarks/results/plan_published.{json,md}.

    python benchmarks/plan_published.py --rows 4 14 15 20 [--workers 2] [--budget-s 1200]
        [--out NAME]

The published layout is scored as the plan scores every candidate: the request's recipe
(the newest recorded for the model, system and precision) with the row's recipe's EP
overlap, dispatcher, recomputation and offloaded layers (PP 1 only: Megatron-Core offloads
nothing with a pipeline), the pipeline split evenly; it can differ from `moesim predict` of
the row (its release's recipe and layout string). `--budget-s`: no new row is started after
that many seconds. Beside each row, the report sets what a later release ran for the same
model, system, GPUs and precision with another layout (benchmarks/heldout/, issue 23's held-out
rows) and what it measured. `--merge` without `--rows` writes the report again from NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, record  # noqa: E402
from sim.training.plan import plan  # noqa: E402
from sim.training.plan_report import why  # noqa: E402
from sim.training.plan_space import DISPATCHER, Candidate, Request  # noqa: E402
from sim.training.predict import read_table  # noqa: E402

TABLE = ROOT.parent / "shared" / "reference" / "published-runs" / "megatron_bridge_perf.csv"
LATER = ROOT / "benchmarks" / "heldout" / "megatron_bridge_later.csv"  # later releases' runs
FIELDS = ("tp", "cp", "pp", "vp", "ep", "mbs", "fsdp", "gbs")


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
        # "": the recipe's own (allgather: scored with its own dispatch, as
        # `moesim predict` scores the row, not as the plan's alltoall candidates)
        dispatcher=rec.dispatcher if rec.dispatcher in DISPATCHER and _int(row["ep"]) > 1 else "",
        offload=rec.offload_layers if _int(row["pp"]) == 1 and recompute == "none" else 0,
    )


def _label(c: dict) -> str:
    return (
        f"TP{c.get('tp')} CP{c.get('cp')} PP{c.get('pp')} VP{c.get('vp')} "
        f"EP{c.get('ep')} MBS{c.get('mbs')}"
        + (" FSDP" if c.get("fsdp") else "")
        + (f" {c.get('dispatcher') or 'recipe'}" if int(c.get("ep") or 1) > 1 else "")
        + (f" offload {c.get('offload')}" if c.get("offload") else "")
        + (f" {c.get('pipeline')}" if c.get("pipeline", "1f1b") != "1f1b" else "")
    )


def _precision(name: str) -> str:
    """The releases' names for one precision as one (25.11's FP8-MX is 26.02's MXFP8)."""
    p = name.strip().upper()
    return {"FP8-MX": "MXFP8"}.get(p, p)


def later_runs(r: dict[str, str], later: list[dict[str, str]]) -> list[tuple[str, float, set[str]]]:
    """What later releases ran for the row's model, system, GPU count and variant with another
    layout, and how that measured against the row: a check, from NVIDIA's own retuning, of
    what the plan proposes (the later tables are issue 23's held-out rows): (what it ran and
    measured, its throughput over the row's, the fields it changed) each."""
    out = []
    key = ("system", "model", "gpus", "variant")
    for x in later:
        if any(str(x.get(k, "")).strip() != str(r.get(k, "")).strip() for k in key):
            continue
        if _precision(x["precision"]) != _precision(r["precision"]):
            continue  # another precision's throughput says nothing about the layout
        # an empty vp / ep is 1 (no virtual pipeline, a dense model), an empty fsdp 0
        was = {f: _int(r.get(f, ""), 0 if f == "fsdp" else 1) for f in FIELDS}
        now = {f: _int(x.get(f, ""), 0 if f == "fsdp" else 1) for f in FIELDS}
        changed = [f"{f} {was[f]} -> {now[f]}" for f in FIELDS if was[f] != now[f]]
        mine, theirs = float(r["tokens_per_s_per_gpu"]), float(x["tokens_per_s_per_gpu"])
        if changed and mine > 0:
            text = (
                f"{x['release']} {x['precision']}: {', '.join(changed)}, measured {theirs:,.0f} "
                f"({theirs / mine:.2f}x this row's {mine:,.0f})"
            )
            out.append((text, theirs / mine, {f for f in FIELDS if was[f] != now[f]}))
    return out


def row_lines(rec: dict, r: dict[str, str], later: list[dict[str, str]] | None = None) -> list[str]:
    """A recorded row's lines of the table (`r`: its row of the published table; `later`: the
    later releases' runs, `later_runs`)."""
    g, best, pr = rec["given"] or {}, rec["best"] or {}, rec["pruned"]
    gt = g.get("predicted_tokens_per_s_per_gpu")
    bt = best.get("predicted_tokens_per_s_per_gpu")
    ahead = (bt / gt - 1) if gt and bt else None
    within = "" if ahead is None else ("yes" if ahead <= 0.10 else "no")
    out = [
        f"| {rec['row']} | {r['release']} {r['system']} {r['model']} {r['variant']} "
        f"{r['precision']} {r['gpus']} GPUs "
        f"| {rec['considered']} | {rec['simulated']} | {pr.get('memory', 0)} / "
        f"{pr.get('bound', 0)} / {pr.get('comm_floor', 0)} / {pr.get('comm_bound', 0)} | "
        f"{rec['wall_s']:.0f} | {rec.get('label') or _label(asdict(published(r)))} | "
        f"{'' if gt is None else f'{gt:,.0f}'} | "
        f"{g.get('rank', '-')} | {g.get('fits', '-')} | {_label(best) if best else ''} | "
        f"{'' if bt is None else f'{bt:,.0f}'} | "
        f"{'' if ahead is None else f'{100 * ahead:+.1f}%'} | {within} |"
    ]
    if g.get("reason"):
        out.append(f"|  | published layout not built: {g['reason']} |" + " |" * 12)
    if g.get("fits") is False:
        out.append(f"|  | published layout over memory: {over_memory(g, r)} |" + " |" * 12)
    runs = later_runs(r, later or [])
    if gt and bt and ahead is not None and ahead > 0.10:
        out.append(f"|  | best vs published: {why(best, g)} |" + " |" * 12)
        changed = {f for f in FIELDS if f in best and str(best[f]) != str(g.get(f))}
        out.append(f"|  | {verdict(runs, changed)} |" + " |" * 12)
    for line, _, _ in runs:
        out.append(f"|  | a later release ran another layout: {line} |" + " |" * 12)
    return out


def over_memory(g: dict, r: dict[str, str]) -> str:
    """Why the published layout does not fit: its predicted peak against the GPU's memory,
    and what its recipe says where the recipe's layout is not the row's (recipes.yaml's
    `layout_mismatch`: the row's printed layout may not be the one that ran)."""
    from sim.training.recipe import recipe_for

    peak, margin = g.get("peak_memory_bytes") or 0.0, g.get("memory_margin_bytes") or 0.0
    text = f"predicted peak {peak / 1e9:.1f} GB, {-margin / 1e9:.1f} GB over the GPU's"
    rec = recipe_for(r["model"], r["system"], r["precision"], r["release"])
    other = rec.notes.get("other") or {}
    note = other.get("layout_mismatch") if isinstance(other, dict) else None
    return text + (f"; its recipe: {note}" if note else "")


def verdict(runs: list[tuple[str, float, set[str]]], changed: set[str]) -> str:
    """Whether NVIDIA's own later retuning of the row (`later_runs`) changed what the plan's
    best changes (`changed`: its layout fields) and measured a gain over 10%: a finding it
    confirms; else one no published run checks (a finding to try, or a modelling error to
    investigate)."""
    same = [(x, fs & changed) for _, x, fs in runs if x > 1.10 and fs & changed]
    if same:
        top, fs = max(same, key=lambda t: t[0])
        return (
            f"a later release's retuning also changed {', '.join(sorted(fs))} and measured "
            f"{top:.2f}x: the plan points the same way"
        )
    return (
        "no later release changed the same fields and measured a gain over 10%: a finding "
        "to try, or a modelling error to investigate"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows",
        type=int,
        nargs="*",
        default=[],
        help="1-based table rows (none with --merge: the report again from NAME.json)",
    )
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--scheduler", help="a Dask scheduler address or dask-local")
    ap.add_argument("--budget-s", type=float, default=None, help="start no row after this")
    ap.add_argument(
        "--out",
        default="plan_published",
        help="results name (benchmarks/results/NAME.{json,md}); another name keeps the "
        "whole table's record and records these rows beside it",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows NAME.json has recorded that are not planned again",
    )
    a = ap.parse_args()
    if not a.rows and not a.merge:
        ap.error("--rows: give rows to plan, or none with --merge to write the report again")
    rows = read_table(TABLE)
    start = time.time()
    load0 = os.getloadavg()[0]
    kept: dict[int, dict] = {}
    runs: list[str] = []
    path = ROOT / "benchmarks" / "results" / f"{a.out}.json"
    old_load = None
    if a.merge and path.exists():
        old = json.loads(path.read_text())
        old_load = old.get("load_start")
        kept = {rec["row"]: rec for rec in old.get("rows", []) if rec["row"] not in a.rows}
        runs = list(old.get("runs", [])) or [
            f"{old.get('machine')}; load average {old.get('load_start', 0):.1f} at the start; "
            f"rows {' '.join(str(n) for n in sorted(kept))}"
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
            release=r["release"],  # the row's own recipe, as `published` scores its layout
        )
        given = published(r)
        t0 = time.time()
        p = plan(req, given=given, workers=a.workers, scheduler=a.scheduler)
        kept[n] = {
            "row": n,
            "considered": p.considered,
            "simulated": p.simulated,
            "pruned": p.pruned,
            "wall_s": time.time() - t0,
            "label": _label(asdict(given)),
            "given": p.given or {},
            "best": p.candidates[0] if p.candidates else {},
        }
    if a.rows:
        runs.append(
            f"{machine()} (shared with other work); load average {load0:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end; {a.workers} worker(s)"
            + (f" on Dask ({a.scheduler})" if a.scheduler else "")
            + f"; rows {' '.join(map(str, a.rows))} in {time.time() - start:.0f} s"
            + (f" (not run, over the time budget: {skipped})" if skipped else "")
        )
    out = [kept[n] for n in sorted(kept)]
    lines = [
        "# `moesim plan` on published runs",
        "",
        "Runs (regenerate: `python benchmarks/plan_published.py --rows N ... --workers W"
        + (f" --out {a.out}" if a.out != "plan_published" else "")
        + " [--merge]`):",
        "",
        *[f"- {x}" for x in runs],
        "",
        "Pruned: dropped before simulation for memory / compute bound / bound with the "
        "collectives at their floor (no simulation) / bound with the collectives simulated "
        "(in the workers). 'A later release ran another layout': what a later release's "
        "published run (`benchmarks/heldout/megatron_bridge_later.csv`) changed for the same "
        "model, system and GPUs, and what it measured: NVIDIA's own retuning, a check of the "
        "plan's proposals.",
        "",
        "| row | run | candidates | simulated | pruned mem / bound / floor / comm | wall s | "
        "published layout | its tok/s/GPU | rank | fits | best | best tok/s/GPU | "
        "best ahead by | within 10% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    later = read_table(LATER) if LATER.is_file() else []
    for rec in out:
        lines += row_lines(rec, rows[rec["row"] - 1], later)
    if not a.rows and old_load is not None:  # the report again: the planning run's load
        load0 = old_load
    record(
        a.out,
        {"machine": machine(), "load_start": load0, "runs": runs, "rows": out, "skipped": skipped},
        lines,
    )


if __name__ == "__main__":
    main()
