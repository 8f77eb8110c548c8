"""Whole training steps against published throughput (issue 23): every row of
`shared/reference/published-runs/megatron_bridge_perf.csv` (NVIDIA Megatron-Bridge's
performance summaries, DGX-H100 / DGX-B200 / DGX-GB200) predicted by `moesim predict`.

Records, in benchmarks/results/published_runs.{json,md}: every row (published and predicted
tokens/s/GPU, signed error, model TFLOP/s/GPU, peak memory and its margin, the recipe it
ran, CPU seconds), the MAPE per system and overall, the system ratios for the same model and
release (e.g. GB200 / H100) against the table's, and the rows that could not be built with
their reason. One parameter is fitted to this table, the host's seconds per launched op
(`gpu.kernels.launch_s`, benchmarks/host_fit.py, whose leave-one-system-out check is quoted);
each GPU's other kernel figures, each link's and each recipe's settings come from the sources
named in topologies/*.yaml and sim/training/recipes.yaml.

    python benchmarks/published_runs.py [--table CSV] [--out NAME] [--rows 1 5 9]

`--table` another table (e.g. benchmarks/heldout/megatron_bridge_later.csv, the releases after
the shared table's) is recorded under `--out NAME` (results/NAME.{json,md}); the notes that
belong to the shared table (its README's inconsistency) are written only for it.
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
from sim.training.predict import MEASURED, mape, predict_rows, read_table  # noqa: E402

TABLE = ROOT.parent / "shared" / "reference" / "published-runs" / "megatron_bridge_perf.csv"
# the pair the table's README names: 2x apart at the same layout
INCONSISTENT = "DGX-H100 Qwen3_30B_A3B, 16 GPUs TP1 PP2 EP8: 10,494 (25.09) vs 5,275 (25.11)"


BELIEF = (
    "We take both figures, as two different runs. 25.09 ran token-drop routing at the printed "
    "layout (VP24 MBS 2, alltoall without EP overlap; r0.1.0's YAML at a1b56cbd9). 25.11 ran "
    "its own release's recipe (v0.2.0: VP12 MBS 1, dropless, EP overlap), and its printed "
    "layout columns are 25.09's field for field, so it is predicted at the recipe's layout "
    "(`ran_layout` in sim/training/recipes.yaml, row 38 below); 26.02 ran PP2 VP12 MBS 1 "
    "dropless with DeepEP and measured 5,113, beside 25.11's 5,275. The one fitted parameter "
    "(`benchmarks/host_fit.py`) is fitted on every row."
)


def host_fit() -> str:
    """What `benchmarks/host_fit.py` fitted and its leave-one-system-out check, as recorded."""
    import json

    from benchmarks.common import RESULTS

    try:
        fit = json.loads((RESULTS / "host_fit.json").read_text())
        loso = ", ".join(f"{s} {100 * v['mape']:.1f}%" for s, v in fit["loso"].items())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"benchmarks/results/host_fit.json: {e} (run benchmarks/host_fit.py)"
        ) from None
    return (
        f"the host's seconds per launched op, `gpu.kernels.launch_s` = {fit['fit'] * 1e6:.0f} us "
        "for every host (`host_fit.md`; leave one system out, each system's MAPE with the "
        f"value fitted on the other two: {loso})."
    )


def flops_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Rows whose published model TFLOP/s imply other FLOPs per token than Megatron-LM's
    formula on the model's config.json (sim/workload/architectures.py)."""
    from sim.training.predict import MODELS
    from sim.workload.architectures import architecture

    seen: dict[tuple[str, str, str], float] = {}
    for r in rows:
        try:
            tflops, tok = float(r["model_tflops_per_gpu"]), float(r[MEASURED])
        except (KeyError, TypeError, ValueError):
            continue
        arch = architecture(MODELS[str(r["model"])])
        if "w/o mtp" in str(r.get("variant", "")).lower():
            from dataclasses import replace

            arch = replace(arch, mtp=0)
        ours = arch.model_flops_per_token(int(r["seq_len"]))
        ratio = tflops * 1e12 / tok / ours
        if abs(ratio - 1) > 0.02:
            seen[(str(r["model"]), str(r["seq_len"]), str(r.get("variant", "")))] = ratio
    return [
        f"- {m} (sequence {s}{', ' + v if v else ''}): the published TFLOP/s imply "
        f"{ratio:.2f}x the FLOPs per token of Megatron-LM's formula on its config.json (e.g. "
        "experts counted as two matrices, not SwiGLU's three; banded layers as full attention)"
        for (m, s, v), ratio in sorted(seen.items())
    ]


def mismatch_notes(numbers: list[int], rows: list[dict[str, Any]]) -> list[str]:
    """Rows whose recorded recipe runs another layout or batch than the row says
    (`layout_mismatch` in sim/training/recipes.yaml): the row is predicted as it says, and
    where that layout does not fit the GPU in the memory model, the note says so (a run
    that did not fit never ran: the row's layout is then the suspect, not the model); a row
    whose printed layout cannot be what ran is predicted at its recipe's (`ran_layout`,
    `sim.training.predict.as_ran`), and the note says which and why."""
    from sim.training.recipe import recipe_for

    out = []
    for n, r in zip(numbers, rows):
        if r.get("reason"):  # refused by predict: its reason is listed above
            continue
        if r.get("layout_ran"):
            out.append(
                f"- Row {n} ({r.get('release', '')} {r['system']} {r['model']}): predicted at "
                f"the layout its recipe ran, {r['layout_ran']}: {r.get('layout_why', '')}."
            )
            continue
        model, prec = str(r["model"]).strip(), str(r["precision"]).strip().upper()
        recipe = recipe_for(model, r["system"], prec, str(r.get("release", "")).strip())
        other = recipe.notes.get("other") or {}
        note = other.get("layout_mismatch") if isinstance(other, dict) else None
        if not note:
            continue
        fit = ""
        if r.get("memory_margin_bytes", 0.0) < 0:
            fit = (
                "; as the row says it does not fit the GPU in our memory model "
                f"({r['memory_margin_bytes'] / 1e9:+.1f} GB)"
            )
        out.append(
            f"- Row {n} ({r.get('release', '')} {r['system']} {model}): its recipe differs "
            f"from the row ({' '.join(str(note).split())}){fit}."
        )
    return out


def unmodelled_notes(numbers: list[int], rows: list[dict[str, Any]]) -> list[str]:
    """Rows whose recorded recipe uses a feature the step model has no field for
    (`not_modelled` in the recipe's notes in sim/training/recipes.yaml): predicted without it."""
    from sim.training.recipe import recipe_for

    out = []
    for n, r in zip(numbers, rows):
        if r.get("reason"):
            continue
        model, prec = str(r["model"]).strip(), str(r["precision"]).strip().upper()
        recipe = recipe_for(model, r["system"], prec, str(r.get("release", "")).strip())
        other = recipe.notes.get("other") or {}
        missing = other.get("not_modelled") if isinstance(other, dict) else None
        if missing:
            out.append(
                f"- Row {n} ({r.get('release', '')} {r['system']} {model} {prec}): recipe "
                f"feature not modelled: {'; '.join(str(m) for m in missing)}."
            )
    return out


def printed_mape(picked: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[str]:
    """The MAPE with every row at its printed layout (`moesim predict --as-printed`): the
    rows predicted at their recipe's layout simulated again as printed."""
    ran = [i for i, r in enumerate(rows) if r.get("layout_ran")]
    if not ran:
        return []
    again = predict_rows([picked[i] for i in ran], as_printed=True)["rows"]
    swapped = list(rows)
    for i, r in zip(ran, again):
        swapped[i] = r
    m = mape(swapped)
    each = ", ".join(
        f"row {picked[i]['_row']} {100 * r['error']:+.1f}%"
        for i, r in zip(ran, again)
        if r.get("error") is not None
    )
    scopes = "; ".join(f"{k} {100 * v['mape']:.1f}%" for k, v in m.items())
    return ["", f"Every row at its printed layout (`--as-printed`; {each}): {scopes}."]


def ratios(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(label, published ratio, predicted ratio) of other systems over DGX-H100 for the
    same model, precision family (BF16, FP8 of any scaling, NVFP4) and release."""
    out = []
    by: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("error") is None:
            continue
        family = "FP8" if "FP8" in str(r["precision"]) else str(r["precision"])
        key = (str(r["release"]), str(r["model"]), family)
        by.setdefault(key, {}).setdefault(str(r["system"]), r)
    for (rel, model, family), systems in sorted(by.items()):
        base = systems.get("DGX-H100")
        if base is None:
            continue
        for name, r in sorted(systems.items()):
            if name == "DGX-H100":
                continue
            pub = float(r[MEASURED]) / float(base[MEASURED])
            pred = r["predicted_tokens_per_s_per_gpu"] / base["predicted_tokens_per_s_per_gpu"]
            out.append((f"{rel} {model} {family} {name}/DGX-H100", pub, pred))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=str(TABLE))
    ap.add_argument("--rows", type=int, nargs="*", help="1-based rows (default: all)")
    ap.add_argument("--workers", type=int, default=1, help="local processes")
    ap.add_argument("--out", default="published_runs", help="results/NAME.{json,md}")
    a = ap.parse_args()
    if not a.out or Path(a.out).name != a.out:
        ap.error(f"--out {a.out!r}: expected a file name (results/NAME.json and .md)")
    shared = Path(a.table).resolve() == TABLE.resolve()  # the shared table's own notes
    rows = read_table(a.table)
    picked = [{**rows[n - 1], "_row": n} for n in (a.rows or range(1, len(rows) + 1))]
    load = os.getloadavg()[0]
    t0 = time.time()
    res = predict_rows(picked, workers=a.workers)
    wall = time.time() - t0
    cpu = sum(r.get("cpu_s", 0.0) for r in res["rows"])  # each row's simulation, any process
    title = "Published training runs" if shared else f"Training runs of `{Path(a.table).name}`"
    fitted = (
        f"One parameter is fitted to this table: {host_fit()} GPU kernel shares, links and "
        "recipes carry their own sources."
        if shared
        else "No parameter is fitted to this table. One is fitted to the shared table "
        f"(`megatron_bridge_perf.csv`): {host_fit()} GPU kernel shares, links and recipes carry "
        "their own sources, and each row runs its own release's recorded recipe."
    )
    lines = [
        f"# {title} predicted (`moesim predict`)",
        "",
        f"Machine: {machine()}; load average {load:.1f} at the start. {len(picked)} rows in "
        f"{wall:.0f} s wall on {a.workers} process(es), {cpu:.0f} s CPU in the rows' "
        f"simulations. Table: `{Path(a.table).name}`.",
        "",
        fitted,
        "",
        "| # | release | system | model | prec | GPUs | published | predicted | error | TFLOP/s | "
        "peak GB | margin GB | recipe | CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in zip([p["_row"] for p in picked], res["rows"]):
        head = (
            f"| {n} | {r.get('release', '')} | {r['system']} | "
            f"{r['model']} {r.get('variant', '')} | "
            f"{r['precision']} | {r['gpus']} | {r.get(MEASURED, '')} |"
        )
        if r.get("reason"):
            lines.append(head + f" not built: {r['reason']} | | | | | | |")
            continue
        err = r.get("error")
        src = "recipe" if r.get("recipe", "defaults") != "defaults" else "defaults"
        src += f" (ran {r['layout_ran']})" if r.get("layout_ran") else ""
        lines.append(
            head + f" {r['predicted_tokens_per_s_per_gpu']:,.0f} | "
            f"{'' if err is None else f'{100 * err:+.1f}%'} | "
            f"{r['predicted_tflops_per_gpu']:,.0f} | "
            f"{r['peak_memory_bytes'] / 1e9:.1f} | {r['memory_margin_bytes'] / 1e9:+.1f} | {src} | "
            f"{r['cpu_s']:.1f} |"
        )
    lines += [
        "",
        "## MAPE of tokens/s/GPU",
        "",
        "| scope | MAPE | worst | rows |",
        "|---|---|---|---|",
    ]
    for k, m in res["mape"].items():
        lines.append(f"| {k} | {100 * m['mape']:.1f}% | {100 * m['worst']:.1f}% | {m['rows']} |")
    lines += printed_mape(picked, res["rows"])
    lines += [
        "",
        "## System ratios for the same model and release",
        "",
        "| pair | published | predicted | off by |",
        "|---|---|---|---|",
    ]
    rat = ratios(res["rows"])
    for label, pub, pred in rat:
        lines.append(f"| {label} | {pub:.2f} | {pred:.2f} | {100 * (pred / pub - 1):+.1f}% |")
    notes = "What the table itself says" if shared else "What the table and its rows' recipes say"
    lines += ["", f"## {notes}", ""]
    if shared:
        lines += [f"- Known inconsistency (the table's README): {INCONSISTENT}. {BELIEF}"]
    for n, r in zip([p["_row"] for p in picked], res["rows"]):
        if r.get("reason"):
            lines.append(f"- Row {n} contradicts itself: {r['reason']}.")
    lines += mismatch_notes([p["_row"] for p in picked], res["rows"])
    lines += unmodelled_notes([p["_row"] for p in picked], res["rows"])
    lines += flops_notes(res["rows"])
    record(
        a.out,
        {
            **({} if shared else {"table": Path(a.table).name}),
            "machine": machine(),
            "wall_s": wall,
            "cpu_s": cpu,
            "mape": res["mape"],
            "ratios": rat,
            "rows": [{k: v for k, v in r.items()} for r in res["rows"]],
        },
        lines,
    )


if __name__ == "__main__":
    main()
