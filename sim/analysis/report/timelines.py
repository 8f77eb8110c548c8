"""Timelines of chosen cases for `moesim report`: the best and the worst strategy of the
first few configs (regressed configs first), where a trace can be had. A `compare --out`
directory holds its resolved config, so its cases are simulated again; a `validate` output
holds the simulated and measured traces of every graph; a sweep's rows carry no traces (a
note says so). Failing to get one trace is a note in the report, never an error."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pandas as pd

from sim.core.errors import MoesimError

RANKS_SHOWN = 2  # ranks per timeline: a layer's ranks run the same schedule
MAX_TASKS = 4000  # per timeline, so a large case keeps the page light


def timeline_figures(rep: Any, configs: int) -> tuple[list[Any], list[str]]:
    """(figures, notes) for up to `configs` configs."""
    if configs <= 0:
        return [], []
    ok = rep.results[rep.results["status"] == "ok"]
    order = list(dict.fromkeys(rep.regressed + list(ok["config"])))[:configs]
    figs, notes = [], []
    for config in order:
        g = ok[ok["config"] == config].sort_values("time_per_token_s", kind="stable")
        if g.empty:
            continue
        picks = [("best", g.iloc[0])] + ([("worst", g.iloc[-1])] if len(g) > 1 else [])
        for which, row in picks:
            try:
                traces = _traces(row)
            except (MoesimError, OSError, ValueError) as e:
                notes.append(
                    f"timeline of {config} / {row['strategy']}: {' '.join(str(e).split())}"
                )
                continue
            if not traces:
                notes.append(
                    f"timelines: no trace for {row['source']} (a sweep's rows carry none; run "
                    "a case with `moesim simulate --out` for its trace)"
                )
                break
            for side, df in traces.items():
                title = f"{which}: {row['strategy']} ({side})<br><sup>{config}</sup>"
                figs.append(figure(df, title))
    return figs, list(dict.fromkeys(notes))


def _traces(row: pd.Series) -> dict[str, pd.DataFrame]:
    src = Path(str(row["source"]))
    folder = src.parent
    if src.name == "results.csv" and (folder / "config.yaml").is_file():
        return {"simulated again": _resimulate(folder / "config.yaml", str(row["strategy"]))}
    graph = row.get("graph")
    if isinstance(graph, str) and (folder / "traces").is_dir():
        slug = re.sub(r"[^A-Za-z0-9.]+", "_", graph.replace("=", "")).strip("_")
        return {
            side: _read(folder / "traces" / f"{slug}.{side}.csv")
            for side in ("simulated", "measured")
            if (folder / "traces" / f"{slug}.{side}.csv").is_file()
        }
    return {}


def _resimulate(config: Path, entry: str) -> pd.DataFrame:
    from sim.analysis.compare import simulate_entry
    from sim.analysis.trace import to_frame
    from sim.config import RunConfig
    from sim.core.limits import applied
    from sim.hardware.costs import CostModel
    from sim.strategies import Cluster

    cfg = RunConfig.load(config)
    with applied(cfg.size_limits()):
        topo = cfg.load_topology()
        res, _, _ = simulate_entry(cfg, entry, Cluster(topo, CostModel.build(topo, cfg.costs)))
        return to_frame(res)


def _read(path: Path) -> pd.DataFrame:
    from sim.core.safeload import read_bytes

    df = pd.read_csv(io.BytesIO(read_bytes(path, "trace")))
    if not {"rank", "stream", "kind", "start", "end"} <= set(df.columns):
        raise ValueError(f"trace {path}: not a moesim trace")
    return df


def figure(df: pd.DataFrame, title: str) -> Any:
    """A Gantt chart: one row per (rank, stream) of the first ranks, a bar per task."""
    import plotly.graph_objects as go

    ranks = sorted(df["rank"].unique())[:RANKS_SHOWN]
    d = df[df["rank"].isin(ranks)].sort_values("start").head(MAX_TASKS)
    t0 = float(df["start"].min())
    d = d.assign(row=[f"rank {r} {s}" for r, s in zip(d["rank"], d["stream"])])
    fig = go.Figure()
    for kind, g in d.groupby("kind", sort=True):
        fig.add_trace(
            go.Bar(
                name=str(kind),
                orientation="h",
                base=(g["start"] - t0) * 1e3,
                x=(g["end"] - g["start"]) * 1e3,
                y=g["row"],
                hovertext=[
                    f"{i}: {x * 1e3:.4g} ms" for i, x in zip(g["id"], g["end"] - g["start"])
                ],
                hoverinfo="text",
            )
        )
    rows = sorted(set(d["row"]))
    fig.update_layout(
        title=title + (f" (first {MAX_TASKS} tasks)" if len(d) == MAX_TASKS else ""),
        barmode="overlay",
        template="plotly_white",
        xaxis_title="time from the start (ms)",
        yaxis_title="rank, stream",
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
        height=max(340, 100 + 28 * len(rows)),
    )
    return fig
