"""Simulated against measured: per-graph makespan error, per-task-kind error, and rankings.

Both sides are traces in the one schema (sim.analysis.trace.COLUMNS), so the comparison is
row by row: the task ids are the graph's. `compare` reduces one graph's pair of traces;
`write_report` turns a list of them into a Markdown table and a plotly figure (simulated vs measured
makespan), written atomically next to each other.

Beside the MAPE, the question a user asks of a simulator: does it pick the strategy that
measures fastest? Per config (the graphs of one pass set, `group`; all results form one
group when none is given) `summarize` reports the simulator's pick (its fastest graph), the
measured best, by what measured margin the pick and every other graph are slower than that
best, and Spearman's rank correlation of simulated against measured makespans.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.io import atomic_write_text

TIE = 0.005  # simulated makespans within 0.5% of the fastest share first place


def makespan(df: pd.DataFrame) -> float:
    return float(df["end"].max() - df["start"].min()) if len(df) else 0.0


def compare(name: str, measured: pd.DataFrame, simulated: pd.DataFrame) -> dict[str, Any]:
    """One graph: makespans, their error, and the mean duration error per task kind."""
    m, s = makespan(measured), makespan(simulated)
    both = measured.merge(simulated, on=["id", "rank"], suffixes=("_m", "_s"))
    per_kind = {}
    for kind, g in both.groupby("kind_m"):
        dm, ds = float(g["duration_m"].mean()), float(g["duration_s"].mean())
        per_kind[str(kind)] = {
            "measured_s": dm,
            "simulated_s": ds,
            "error_pct": 100.0 * (ds - dm) / dm if dm > 0 else float("nan"),
        }
    return {
        "graph": name,
        "measured_s": m,
        "simulated_s": s,
        "error_pct": 100.0 * (s - m) / m if m > 0 else float("nan"),
        "tasks_matched": len(both),
        "per_kind": per_kind,
    }


PICK_WITHIN_PCT = 5.0  # a pick measured within this of the measured best counts as right


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 2 values or
    a constant side."""
    if len(a) < 2:
        return None
    ra = pd.Series(a, dtype=float).rank().to_numpy()
    rb = pd.Series(b, dtype=float).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def picks(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group (a config: one pass set): the simulator's pick (its fastest graph; the first
    of those tied within TIE), the measured best, the pick's measured margin over the best
    (percent), every graph's measured margin, and the rank correlation."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(str(r.get("group") or "all"), []).append(r)
    out = {}
    for name, rs in groups.items():
        meas = [r["measured_s"] for r in rs]
        sim = [r["simulated_s"] for r in rs]
        best_m = float(min(meas))
        fastest = min(sim)
        tied = [r["graph"] for r in rs if r["simulated_s"] <= fastest * (1 + TIE)]
        pick = next(r for r in rs if r["simulated_s"] == fastest)
        margin = {
            r["graph"]: 100.0 * (r["measured_s"] / best_m - 1) if best_m > 0 else float("nan")
            for r in rs
        }
        out[name] = {
            "graphs": len(rs),
            "pick": pick["graph"],
            "pick_tied_with": [g for g in tied if g != pick["graph"]],
            "best_measured": rs[int(np.argmin(meas))]["graph"],
            "pick_slower_pct": margin[pick["graph"]],
            "pick_right": margin[pick["graph"]] <= PICK_WITHIN_PCT,
            "measured_slower_pct": margin,
            "rank_correlation": spearman(sim, meas),
        }
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    err = np.array([abs(r["error_pct"]) for r in results])
    best_m = min(results, key=lambda r: r["measured_s"])["graph"]
    fastest = min(r["simulated_s"] for r in results)
    # graphs the simulator cannot tell apart (e.g. sequential and pipelined r=1, the same
    # schedule) share first place
    best_s = [r["graph"] for r in results if r["simulated_s"] <= fastest * (1 + TIE)]
    # Against each graph's fastest run: the simulator models an undisturbed run, and on a
    # shared host the noise only ever adds time (the runs' distribution is skewed right)
    fastest_m = np.array([min(r.get("measured_runs_s") or [r["measured_s"]]) for r in results])
    sim = np.array([r["simulated_s"] for r in results])
    err_fast = np.abs(sim - fastest_m) / np.where(fastest_m > 0, fastest_m, np.nan) * 100
    configs = picks(results)
    rhos = [c["rank_correlation"] for c in configs.values() if c["rank_correlation"] is not None]
    return {
        "mape_pct": float(err.mean()),
        "max_abs_error_pct": float(err.max()),
        "mape_fastest_run_pct": float(np.nanmean(err_fast)),
        "best_measured": best_m,
        "best_simulated": best_s,
        "same_best": best_m in best_s,
        # per config (pass set): the simulator's pick against the measured best
        "configs": configs,
        "rank_correlation_min": min(rhos) if rhos else None,
        "pick_slower_pct_max": max(c["pick_slower_pct"] for c in configs.values()),
        "picks_right": all(c["pick_right"] for c in configs.values()),
    }


def pick_lines(summ: dict[str, Any]) -> list[str]:
    """One line per config: the pick, the measured best, the margin, the rank correlation."""
    lines = []
    for name, c in summ["configs"].items():
        rho = c["rank_correlation"]
        tied = f" (tied with {', '.join(c['pick_tied_with'])})" if c["pick_tied_with"] else ""
        verdict = (
            "the measured best"
            if c["pick"] == c["best_measured"]
            else f"{c['pick_slower_pct']:+.1f}% slower than the measured best {c['best_measured']}"
        )
        lines.append(
            f"{name}: the simulator picks {c['pick']}{tied}: {verdict} "
            f"({'within' if c['pick_right'] else 'NOT within'} {PICK_WITHIN_PCT:g}%); rank "
            f"correlation simulated vs measured "
            + ("n/a" if rho is None else f"{rho:.2f}")
            + f" (Spearman, {c['graphs']} graphs)"
        )
    return lines


def write_report(
    results: list[dict[str, Any]],
    out_dir: str | Path,
    title: str,
    context: dict[str, Any] | None = None,
) -> dict[str, Path]:
    import plotly.graph_objects as go

    out = Path(out_dir)
    summ = summarize(results)
    lines = [f"# {title}", ""]
    for k, v in (context or {}).items():
        lines.append(f"- {k}: {v}")
    lines += [
        f"- MAPE on makespan: {summ['mape_pct']:.1f}% (worst {summ['max_abs_error_pct']:.1f}%)",
        f"- MAPE against each graph's fastest run (the undisturbed run the simulator models): "
        f"{summ['mape_fastest_run_pct']:.1f}%",
        *(f"- {line}" for line in pick_lines(summ)),
        "",
        "| graph | measured (ms) | measured runs, min-max (ms) | simulated (ms) | error | "
        "measured vs its config's best |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    slower = {g: v for c in summ["configs"].values() for g, v in c["measured_slower_pct"].items()}
    for r in results:
        runs = r.get("measured_runs_s") or [r["measured_s"]]
        lines.append(
            f"| {r['graph']} | {r['measured_s'] * 1e3:.3f} | "
            f"{min(runs) * 1e3:.3f}-{max(runs) * 1e3:.3f} | "
            f"{r['simulated_s'] * 1e3:.3f} | {r['error_pct']:+.1f}% | "
            f"{slower.get(r['graph'], float('nan')):+.1f}% |"
        )
    kinds = sorted({k for r in results for k in r["per_kind"]})
    lines += [
        "",
        "Mean task duration error per kind (simulated vs measured):",
        "",
        "| graph | " + " | ".join(kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for r in results:
        cells = [
            f"{r['per_kind'][k]['error_pct']:+.0f}%" if k in r["per_kind"] else "" for k in kinds
        ]
        lines.append(f"| {r['graph']} | " + " | ".join(cells) + " |")
    md = out / "report.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    names = [r["graph"] for r in results]
    fig = go.Figure(
        [
            go.Bar(
                name="measured (median; bars: fastest-slowest run)",
                x=names,
                y=[r["measured_s"] * 1e3 for r in results],
                error_y=_run_spread(results),
            ),
            go.Bar(name="simulated", x=names, y=[r["simulated_s"] * 1e3 for r in results]),
        ]
    )
    fig.update_layout(
        title=f"{title}: makespan",
        barmode="group",
        xaxis_title="graph",
        yaxis_title="makespan (ms)",
        template="plotly_white",
    )
    from sim.analysis.html import write_page

    text = "\n".join(lines[1:])  # the page's own title stands for the first line
    return {"markdown": md, "html": write_page(out / "report.html", title, [fig, text])}


def _run_spread(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Asymmetric error bars from the median down to the fastest and up to the slowest run."""
    runs = [r.get("measured_runs_s") or [r["measured_s"]] for r in results]
    med = [r["measured_s"] for r in results]
    return {
        "type": "data",
        "symmetric": False,
        "array": [(max(x) - m) * 1e3 for x, m in zip(runs, med)],
        "arrayminus": [(m - min(x)) * 1e3 for x, m in zip(runs, med)],
    }
