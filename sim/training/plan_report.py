"""A plan as text, CSV, JSON, an offline HTML page (throughput vs memory of the simulated
candidates, the Pareto front marked) and the best candidate as a one-row table that
`moesim predict` takes; written as one output set."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.training.predict import MODELS, REQUIRED
from sim.training.row_cells import CHOICES

if TYPE_CHECKING:  # the plan writes its report: only its type is read here
    from sim.training.plan import Plan

# what tells candidates apart: their layout and their choices
CANDIDATE_KEYS = (
    "tp",
    "cp",
    "pp",
    "vp",
    "ep",
    "mbs",
    "fsdp",
    "ep_overlap",
    "dispatcher",
    "comm_sms",
    "max_connections",
    "recompute",
    "recompute_layers",
    "offload",
    "pipeline",
)
COLUMNS = (
    "rank",
    *CANDIDATE_KEYS,
    "predicted_tokens_per_s_per_gpu",
    "predicted_step_s",
    "mfu",
    "peak_memory_bytes",
    "memory_margin_bytes",
    "fits",
    "bubble_share",
    "ep_comm_s",
    "lower_bound_s",
)
FROM_BREAKDOWN = ("bubble_share", "ep_comm_s")
# the best candidate as a row `moesim predict` reads: its layout and its choices
PREDICT_COLUMNS = REQUIRED + CHOICES


def _label(r: dict[str, Any]) -> str:
    s = f"TP{r['tp']} CP{r['cp']} PP{r['pp']} VP{r['vp'] or 1} EP{r['ep']} MBS{r['mbs']}"
    s += " FSDP" if r.get("fsdp") else ""
    s += f" {r['dispatcher']}" if r.get("dispatcher") and int(r.get("ep") or 1) > 1 else ""
    s += f" sms={r['comm_sms']}" if r.get("comm_sms") else ""
    s += f" offload={r['offload']}" if r.get("offload") else ""
    s += f" {r['pipeline']}" if r.get("pipeline", "1f1b") != "1f1b" else ""
    s += " +overlap" if r.get("ep_overlap") else ""
    n = r.get("recompute_layers")
    return s + f" rc={r.get('recompute')}" + (f":{n}" if n else "")


def why(best: dict[str, Any], other: dict[str, Any]) -> str:
    """What the best changes against another candidate, and where its time goes instead."""
    diffs = [
        f"{k} {other[k]} -> {best[k]}"
        for k in CANDIDATE_KEYS
        if str(best.get(k)) != str(other.get(k))
    ]
    parts = []
    b, o = best.get("breakdown") or {}, other.get("breakdown") or {}
    for key, what in (
        ("bubble_share", "pipeline bubble"),
        ("ep_comm_s", "EP all-to-all"),
        ("tp_comm_s", "exposed TP communication"),
    ):
        if key in b and key in o and abs(b[key] - o[key]) > 1e-9:
            fmt = "{:.1%}" if key == "bubble_share" else "{:.3f} s"
            parts.append(f"{what} {fmt.format(o[key])} -> {fmt.format(b[key])}")
    gain = best["predicted_tokens_per_s_per_gpu"] / other["predicted_tokens_per_s_per_gpu"] - 1
    return (
        f"{gain:+.1%} tokens/s/GPU: "
        + ", ".join(diffs)
        + (f" ({'; '.join(parts)})" if parts else "")
    )


def text_plan(p: Plan, top: int = 10) -> str:
    r = p.request
    lines = [
        f"plan: {r.model} on {r.gpus} GPUs of {r.system}, GBS {r.gbs}, sequence {r.seq_len}, "
        f"{r.precision}",
        f"  candidates {p.considered}{_partial(p)}, simulated {p.simulated}"
        + (f" ({p.resumed} from an earlier run's journal)" if p.resumed else "")
        + ", dropped "
        + (", ".join(f"{k} {v}" for k, v in sorted(p.pruned.items())) or "none"),
        f"{'rank':>4}  {'layout':50} {'tok/s/GPU':>9} {'MFU':>6} {'mem GB':>7} {'step s':>7}",
    ]
    for c in p.candidates[:top]:
        mfu = f"{100 * c['mfu']:.1f}%" if c.get("mfu") is not None else "-"
        lines.append(
            f"{c['rank']:>4}  {_label(c):50} {c['predicted_tokens_per_s_per_gpu']:9,.0f} "
            f"{mfu:>6} {c['peak_memory_bytes'] / 1e9:7.1f} {c['predicted_step_s']:7.2f}"
        )
    if len(p.candidates) > 1:
        lines.append("best vs runner-up: " + why(p.candidates[0], p.candidates[1]))
    if p.given is not None:
        g = p.given
        if g.get("reason"):
            lines.append(f"given layout: not built: {g['reason']}")
        else:
            fits = "" if g.get("fits") else " (does not fit in memory)"
            lines.append(
                f"given layout {_label(g)}: {g['predicted_tokens_per_s_per_gpu']:,.0f} "
                f"tokens/s/GPU, rank {g.get('rank')} of {len(p.candidates)}{fits}"
            )
            if p.candidates and p.candidates[0] is not g:
                lines.append("best vs given: " + why(p.candidates[0], g))
    return "\n".join(lines) + "\n"


def _partial(p: Plan) -> str:
    """The partial-recompute round in the counts: what it searched and added."""
    got = p.partial
    if not got.get("searched"):
        return ""
    return (
        f" ({got['added']} recomputing the fewest layers per model chunk that fit: "
        f"{got['found']} of {got['searched']} layouts fitting only with recomputation)"
    )


def table(p: Plan) -> list[dict[str, Any]]:
    """The ranked candidates, COLUMNS only (the breakdown's bubble and EP time flattened)."""
    rows = []
    for c in p.candidates:
        b = c.get("breakdown") or {}
        rows.append({k: b.get(k, "") if k in FROM_BREAKDOWN else c.get(k, "") for k in COLUMNS})
    return rows


def csv_text(p: Plan) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in table(p):
        w.writerow(row)
    return buf.getvalue()


def parquet_bytes(p: Plan) -> bytes:
    import pandas as pd

    df = pd.DataFrame(table(p), columns=list(COLUMNS))
    for col in FROM_BREAKDOWN + ("mfu",):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["dispatcher"] = df["dispatcher"].astype(str)
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def best_row(p: Plan) -> str:
    """The best candidate as a `moesim predict` table of one row."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=PREDICT_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    if p.candidates:
        w.writerow(predict_row(p, p.candidates[0]))
    return buf.getvalue()


def predict_row(p: Plan, c: dict[str, Any]) -> dict[str, Any]:
    """A simulated candidate as a `moesim predict` row that reproduces its prediction: its
    layout columns and its choices (the pipeline split evenly, its offloading, the
    architecture's MTP modules: what the plan simulated)."""
    from sim.workload.architectures import architecture

    arch = architecture(MODELS.get(p.request.model, p.request.model))
    row = {k: c.get(k, "") for k in REQUIRED}
    row.update(
        dispatcher=c.get("dispatcher") or "",
        ep_overlap="on" if c.get("ep_overlap") else "off",
        comm_sms=c.get("comm_sms") or 0,
        max_connections=c.get("max_connections") or "",
        recompute=c.get("recompute") or "none",
        recompute_layers=c.get("recompute_layers") or 0,
        pipeline_layout="even",
        offload_layers=c.get("offload") or 0,
        mtp=arch.mtp,
        pipeline=c.get("pipeline") or "1f1b",
    )
    return row


def html_page(p: Plan) -> str:
    """The page: throughput vs peak memory of the simulated candidates with the Pareto front,
    why the best beats the runner-up, and the top candidates' timelines on one time axis
    (`sim.training.plan_timeline`); self-contained (plotly.js inside, no CDN)."""
    from sim.analysis.html import render

    r = p.request
    blocks: list[Any] = [pareto_figure(p)]
    text = [
        f"{p.simulated} of {p.considered} candidates{_partial(p)} simulated; dropped: "
        + (", ".join(f"{k} {v}" for k, v in sorted(p.pruned.items())) or "none")
        + "."
    ]
    if len(p.candidates) > 1:
        text.append(
            f"Best vs runner-up ({_label(p.candidates[0])} vs {_label(p.candidates[1])}): "
            + why(p.candidates[0], p.candidates[1])
        )
    blocks.append("\n\n".join(text))
    if p.timelines:
        from sim.training.plan_timeline import figure

        off = [
            f"- {t.label}: simulated again {t.step_s:.6f} s, the plan's {t.predicted_s:.6f} s"
            for t in p.timelines
            if abs(t.step_s - t.predicted_s) > 1e-6 * t.predicted_s
        ]
        if off:  # the copy of run_step's graph drifted from it: say so, draw what it gives
            head = "Timelines that are not the plan's step (a modelling change?):"
            blocks.append("\n".join([head, *off]))
        blocks.append(figure(p.timelines))
    elif p.timeline_note:
        blocks.append(p.timeline_note)
    title = (
        f"moesim plan: {r.model} on {r.gpus} GPUs of {r.system}, GBS {r.gbs}, "
        f"sequence {r.seq_len}, {r.precision}"
    )
    return render(title, blocks)


def pareto_figure(p: Plan) -> Any:
    import plotly.graph_objects as go

    pts = p.candidates
    front, best_mem = [], float("inf")
    for c in sorted(pts, key=lambda c: -c["predicted_tokens_per_s_per_gpu"]):
        if c["peak_memory_bytes"] < best_mem:
            front.append(c)
            best_mem = c["peak_memory_bytes"]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[c["peak_memory_bytes"] / 1e9 for c in pts],
            y=[c["predicted_tokens_per_s_per_gpu"] for c in pts],
            mode="markers",
            name="simulated",
            text=[_label(c) for c in pts],
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[c["peak_memory_bytes"] / 1e9 for c in front],
            y=[c["predicted_tokens_per_s_per_gpu"] for c in front],
            mode="lines+markers",
            name="Pareto front",
            text=[_label(c) for c in front],
        )
    )
    if p.given is not None and p.given.get("predicted_tokens_per_s_per_gpu"):
        g = p.given
        fig.add_trace(
            go.Scatter(
                x=[g["peak_memory_bytes"] / 1e9],
                y=[g["predicted_tokens_per_s_per_gpu"]],
                mode="markers",
                marker={"size": 14, "symbol": "star"},
                name="given layout",
                text=[_label(g)],
            )
        )
    r = p.request
    fig.update_layout(
        title=f"{r.model} on {r.gpus} GPUs of {r.system}: {p.simulated} of {p.considered} "
        "candidates simulated",
        xaxis_title="peak memory per GPU, GB",
        yaxis_title="tokens/s/GPU",
        height=700,
    )
    return fig


def write(p: Plan, out_dir: str | Path) -> dict[str, Path]:
    """plan.parquet, plan.csv (the ranked table), plan.json, plan.html, plan.txt and best.csv
    as one output set (all or none replace the previous plan's)."""
    from sim.core.io import OutputSet, atomic_write_bytes, atomic_write_text

    files: dict[str, Path] = {}
    with OutputSet(out_dir, "plan") as out:
        atomic_write_bytes(out.path("plan.parquet"), parquet_bytes(p))
        files["plan.parquet"] = out.final("plan.parquet")
        for name, text in (
            ("plan.csv", csv_text(p)),
            ("plan.json", json.dumps(p.as_dict(), indent=2, default=str)),
            ("plan.html", html_page(p)),
            ("plan.txt", text_plan(p, 50)),
            ("best.csv", best_row(p)),
        ):
            atomic_write_text(out.path(name), text)
            files[name] = out.final(name)
    return files
