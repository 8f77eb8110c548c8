"""`moesim report`: strategy regression reports over result tables.

From results in the shared row schema (sim.analysis.results): the best strategy per config,
a per-config comparison chart (time per token, the metric strategies are ranked by), the
simulated against measured makespans where a validate output gave measurements, timelines of
chosen cases (sim.analysis.report.timelines) and, against a baseline, every (config,
strategy) whose time per token moved beyond the threshold. Exit status for CI: 0 no
regression, 1 a regression (a slower time per token, or a run that was ok and now fails),
2 bad input. Rows with status error are listed, never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.results import load_results


@dataclass
class Report:
    results: pd.DataFrame
    baseline: pd.DataFrame | None
    threshold: float
    inputs: list[str]
    diff: pd.DataFrame | None = None  # per (config, strategy) against the baseline
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> list[str]:
        """Configs with a strategy slower than the baseline beyond the threshold, or failing."""
        if self.diff is None:
            return []
        bad = self.diff[self.diff["verdict"].isin(["slower", "now failing"])]
        return list(dict.fromkeys(bad["config"]))

    def best(self) -> pd.DataFrame:
        """Per config: the strategy with the lowest time per token, and the runner-up."""
        ok = self.results[self.results["status"] == "ok"]
        rows = []
        for config, g in ok.groupby("config", sort=False):
            g = g.sort_values("time_per_token_s", kind="stable")
            first = g.iloc[0]
            second = g.iloc[1] if len(g) > 1 else None
            rows.append(
                {
                    "config": config,
                    "best": first["strategy"],
                    "time_per_token_ns": first["time_per_token_s"] * 1e9,
                    "makespan_ms": first["makespan_s"] * 1e3,
                    "runner_up": "-" if second is None else second["strategy"],
                    "margin_pct": float("nan")
                    if second is None
                    else 100 * (second["time_per_token_s"] / first["time_per_token_s"] - 1),
                    "strategies": len(g),
                }
            )
        return pd.DataFrame(rows)

    def errors(self) -> pd.DataFrame:
        return self.results.loc[
            self.results["status"] == "error", ["config", "strategy", "error"]
        ].reset_index(drop=True)

    def measured(self) -> pd.DataFrame:
        if "measured_s" not in self.results.columns:
            return self.results.iloc[0:0]
        r = self.results
        return r[(r["status"] == "ok") & r["measured_s"].notna()].reset_index(drop=True)

    def summary(self) -> dict[str, Any]:
        """What --json prints (and report.json holds)."""
        diff = [] if self.diff is None else _records(self.diff)
        return {
            "inputs": self.inputs,
            "rows": len(self.results),
            "ok": int((self.results["status"] == "ok").sum()),
            "errors": self.errors().to_dict(orient="records"),
            "best": _records(self.best()),
            "threshold": self.threshold,
            "baseline": self.baseline is not None,
            "changes": [d for d in diff if d["verdict"] != "same"],
            "regressed_configs": self.regressed,
            "notes": self.notes,
        }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows for JSON: NaN (no value) as null, which JSON can hold."""
    return [
        {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
        for row in df.to_dict(orient="records")
    ]


def build(paths: list[str], baseline: list[str] | None = None, threshold: float = 0.05) -> Report:
    notes: list[str] = []
    results = _unique(load_results(paths), "results", notes)
    base = _unique(load_results(baseline), "baseline", notes) if baseline else None
    rep = Report(results, base, threshold, [str(p) for p in paths], notes=notes)
    if base is not None:
        rep.diff = against(results, base, threshold)
    return rep


def _unique(df: pd.DataFrame, side: str, notes: list[str]) -> pd.DataFrame:
    """One row per (config, strategy): a later file's row replaces an earlier one (noted)."""
    out = df.drop_duplicates(["config", "strategy"], keep="last").reset_index(drop=True)
    if len(out) < len(df):
        notes.append(
            f"{side}: {len(df) - len(out)} repeated (config, strategy) row(s); the "
            "last one read counts"
        )
    return out


def against(new: pd.DataFrame, base: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per (config, strategy) in either side: time per token before and after, relative
    change and a verdict: slower / faster (beyond the threshold), same, now failing, fixed,
    new (not in the baseline), missing (no longer run)."""
    cols = ["config", "strategy", "status", "time_per_token_s", "error"]
    both = base[cols].merge(
        new[cols],
        on=["config", "strategy"],
        how="outer",
        suffixes=("_base", "_new"),
        indicator="side",
        sort=False,
    )
    rows = []
    for r in both.itertuples(index=False):
        b, n = r.time_per_token_s_base, r.time_per_token_s_new
        change = n / b - 1 if r.side == "both" else float("nan")
        if r.side == "left_only":
            verdict = "missing"
        elif r.side == "right_only":
            verdict = "new"
        elif r.status_base == "ok" and r.status_new != "ok":
            verdict = "now failing"
        elif r.status_base != "ok":
            verdict = "fixed" if r.status_new == "ok" else "still failing"
        elif change > threshold:
            verdict = "slower"
        elif change < -threshold:
            verdict = "faster"
        else:
            verdict = "same"
        rows.append(
            {
                "config": r.config,
                "strategy": r.strategy,
                "baseline_ns": b * 1e9,
                "now_ns": n * 1e9,
                "change_pct": 100 * change,
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)


# -- text ------------------------------------------------------------------------------------


def markdown(rep: Report) -> str:
    r = rep.results
    n_ok = int((r["status"] == "ok").sum())
    lines = [
        f"# moesim report: {r['config'].nunique()} config(s), {len(r)} run(s)",
        "",
        f"- results: {', '.join(rep.inputs)}",
        f"- runs: {n_ok} ok, {len(r) - n_ok} error",
    ]
    if rep.diff is not None:
        lines.append(
            f"- against the baseline, threshold {100 * rep.threshold:g}% on time per token: "
            + (f"**REGRESSED** {', '.join(rep.regressed)}" if rep.regressed else "no regression")
        )
    lines += [f"- {n}" for n in rep.notes]
    lines += ["", "## Best strategy per config (lowest time per token)", ""]
    lines += ["| config | best | ns/token | makespan (ms) | runner-up | margin |"]
    lines += ["|---|---|---:|---:|---|---:|"]
    for b in rep.best().itertuples(index=False):
        margin = "-" if pd.isna(b.margin_pct) else f"{b.margin_pct:.1f}%"
        lines.append(
            f"| {b.config} | {b.best} | {b.time_per_token_ns:.4g} | {b.makespan_ms:.4g} | "
            f"{b.runner_up} | {margin} |"
        )
    if rep.diff is not None:
        moved = rep.diff[rep.diff["verdict"] != "same"]
        lines += ["", f"## Against the baseline ({len(moved)} of {len(rep.diff)} moved)", ""]
        if len(moved):
            lines += ["| config | strategy | baseline ns/token | now ns/token | change | verdict |"]
            lines += ["|---|---|---:|---:|---:|---|"]
            for d in moved.itertuples(index=False):
                lines.append(
                    f"| {d.config} | {d.strategy} | {_num(d.baseline_ns)} | {_num(d.now_ns)} | "
                    f"{'' if pd.isna(d.change_pct) else f'{d.change_pct:+.1f}%'} | {d.verdict} |"
                )
    errors = rep.errors()
    if len(errors):
        lines += ["", f"## Failed runs ({len(errors)})", "", "| config | strategy | error |"]
        lines += ["|---|---|---|"]
        for e in errors.itertuples(index=False):
            lines.append(f"| {e.config} | {e.strategy} | {e.error.replace('|', '/')} |")
    m = rep.measured()
    if len(m):
        err = (m["makespan_s"] / m["measured_s"] - 1) * 100
        lines += ["", f"## Simulated against measured: MAPE {err.abs().mean():.1f}%", ""]
        lines += ["| config | strategy | measured (ms) | simulated (ms) | error |"]
        lines += ["|---|---|---:|---:|---:|"]
        for row, e in zip(m.itertuples(index=False), err):
            lines.append(
                f"| {row.config} | {row.strategy} | {row.measured_s * 1e3:.3f} | "
                f"{row.makespan_s * 1e3:.3f} | {e:+.1f}% |"
            )
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    return "" if pd.isna(x) else f"{x:.4g}"


# -- files -----------------------------------------------------------------------------------


def write(rep: Report, out_dir: str | Path, timelines: int = 2) -> dict[str, Path]:
    """report.html (self-contained), report.md and report.json, as one output set."""
    import sim.analysis.report.charts as report_charts
    from sim.analysis.html import write_page
    from sim.analysis.report.timelines import timeline_figures
    from sim.core.io import OutputSet

    figures = report_charts.figures(rep)
    tl, notes = timeline_figures(rep, timelines)
    rep.notes += notes
    md = markdown(rep)
    blocks: list[Any] = [md.split("\n## ", 1)[0].split("\n", 1)[1], *figures]
    blocks += ["## " + part for part in md.split("\n## ")[1:]]
    if tl:
        blocks += ["## Timelines of chosen cases", *tl]
    title = md.splitlines()[0].lstrip("# ")
    with OutputSet(out_dir, "report") as out:
        return {
            "html": write_page(out, title, blocks, "report.html"),
            "markdown": out.write_text("report.md", md),
            "json": out.write_text(
                "report.json", json.dumps(rep.summary(), indent=2, default=str) + "\n"
            ),
        }
