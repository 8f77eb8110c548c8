"""Predictions of a table as text, CSV, JSON and an offline HTML page (predicted vs published
tokens/s/GPU, and the error per row), written as one output set."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from sim.training.predict import MEASURED, OUTPUT_FIELDS

DETAIL_FIELDS = ("memory_parts", "breakdown")  # nested: JSON only
SENSITIVITY = "sensitivity"  # nested, written flat in the CSV and text (`--sensitivity`)


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, (int, float)) else str(v)


def text_table(result: dict[str, Any]) -> str:
    """One line per row and the MAPE lines, for a person; with the rows' sensitivities, the
    resource that paces each step and its elasticity to each (1: the step scales with it)."""
    sens = any(SENSITIVITY in r for r in result["rows"])
    lines = [
        f"{'row':>3}  {'system':10} {'model':16} {'prec':7} {'GPUs':>5} {'step s':>8} "
        f"{'tok/s/GPU':>9} {'published':>9} {'error':>7} {'TFLOP/s':>7} {'mem GB':>7} {'margin':>7}"
        + (f" {'bound by':8} {'gpu':>5} {'host':>5} {'links':>5}" if sens else "")
    ]
    for i, r in enumerate(result["rows"], start=1):
        head = (
            f"{i:>3}  {str(r.get('system', ''))[:10]:10} {str(r.get('model', ''))[:16]:16} "
            f"{str(r.get('precision', ''))[:7]:7} {str(r.get('gpus', '')):>5} "
        )
        if r.get("reason"):
            lines.append(head + f"not built: {r['reason']}")
            continue
        err = r.get("error")
        shown = f"{100 * err:+.1f}%" if err is not None else "-"
        lines.append(
            head + f"{r['predicted_step_s']:8.2f} {_fmt(r['predicted_tokens_per_s_per_gpu']):>9} "
            f"{_fmt(_num(r.get(MEASURED))):>9} {shown:>7} "
            f"{_fmt(r['predicted_tflops_per_gpu']):>7} {r['peak_memory_bytes'] / 1e9:7.1f} "
            f"{r['memory_margin_bytes'] / 1e9:7.1f}" + _sensitivity_cells(r)
        )
    for i, r in enumerate(result["rows"], start=1):
        if r.get("layout_ran"):  # `predict.as_ran`
            lines.append(
                f"row {i}: predicted at the layout its recipe ran, {r['layout_ran']} "
                f"(--as-printed: the printed one): {r.get('layout_why', '')}"
            )
    for k, m in result["mape"].items():
        lines.append(
            f"MAPE {k}: {100 * m['mape']:.1f}% over {m['rows']} rows "
            f"(worst {100 * m['worst']:.1f}%)"
        )
    return "\n".join(lines) + "\n"


def _sensitivity_cells(r: dict[str, Any]) -> str:
    e = r.get(SENSITIVITY)
    if not e:
        return ""
    return f" {r.get('bound_by', ''):8} {e['gpu']:5.2f} {e['host']:5.2f} {e['links']:5.2f}"


def _flat(r: dict[str, Any]) -> dict[str, Any]:
    """A row for the CSV: its sensitivities as `sensitivity_<resource>` columns."""
    out = {k: v for k, v in r.items() if k != SENSITIVITY}
    for k, v in (r.get(SENSITIVITY) or {}).items():
        out[f"{SENSITIVITY}_{k}"] = v
    return out


def _num(v: Any) -> float | None:
    try:
        return float(str(v).replace(",", ""))
    except (TypeError, ValueError):
        return None


def csv_text(result: dict[str, Any]) -> str:
    rows = [_flat(r) for r in result["rows"]]
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols and k not in DETAIL_FIELDS:
                cols.append(k)
    for k in OUTPUT_FIELDS:
        if k not in cols:
            cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in cols})
    return buf.getvalue()


def html_page(result: dict[str, Any], title: str = "moesim predict") -> str:
    """Offline page: the scatter of predicted vs published tokens/s/GPU (log axes, one colour
    per system, the y = x line and +-10% / 25% bands) and the error per row."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [r for r in result["rows"] if r.get("error") is not None]
    fig = make_subplots(
        rows=2,
        cols=1,
        row_heights=[0.6, 0.4],
        vertical_spacing=0.12,
        subplot_titles=(
            "predicted vs published tokens/s/GPU",
            "error per row (predicted / published - 1)",
        ),
    )
    for system in sorted({str(r.get("system")) for r in rows}):
        sel = [r for r in rows if str(r.get("system")) == system]
        label = [
            f"{r.get('release', '')} {r.get('model')} {r.get('precision')} {r.get('gpus')} GPUs"
            + (f" (as ran: {r['layout_ran']})" if r.get("layout_ran") else "")
            for r in sel
        ]
        fig.add_trace(
            go.Scatter(
                x=[_num(r[MEASURED]) for r in sel],
                y=[r["predicted_tokens_per_s_per_gpu"] for r in sel],
                mode="markers",
                name=system,
                text=label,
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(x=label, y=[100 * r["error"] for r in sel], name=system, showlegend=False),
            row=2,
            col=1,
        )
    vals = [_num(r[MEASURED]) or 1.0 for r in rows] or [1.0]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    for f, dash in ((1.0, "solid"), (1.1, "dot"), (0.9, "dot"), (1.25, "dash"), (0.75, "dash")):
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo * f, hi * f],
                mode="lines",
                showlegend=False,
                line={"dash": dash, "width": 1, "color": "grey"},
            ),
            row=1,
            col=1,
        )
    fig.update_xaxes(type="log", title_text="published", row=1, col=1)
    fig.update_yaxes(type="log", title_text="predicted", row=1, col=1)
    fig.update_yaxes(title_text="error %", row=2, col=1)
    mape = "; ".join(
        f"{k} {100 * m['mape']:.1f}% ({m['rows']} rows)" for k, m in result["mape"].items()
    )
    fig.update_layout(title=f"{title}: MAPE {mape}", height=1000)
    return fig.to_html(include_plotlyjs=True, full_html=True)


def write(result: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    from sim.core.io import OutputSet, atomic_write_text

    files: dict[str, Path] = {}
    with OutputSet(out_dir, "predict") as out:
        for name, text in (
            ("predictions.csv", csv_text(result)),
            ("predictions.json", json.dumps(result, indent=2, default=str)),
            ("predictions.html", html_page(result)),
            ("predictions.txt", text_table(result)),
        ):
            atomic_write_text(out.path(name), text)
            files[name] = out.final(name)
    return files
