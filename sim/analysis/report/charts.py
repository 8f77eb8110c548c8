"""The charts of `moesim report`: strategies per config, changes against the baseline, and
simulated against measured makespans. Every axis names its unit."""

from __future__ import annotations

from typing import Any

import pandas as pd

VERDICT_COLOUR = {
    "slower": "#d62728",
    "now failing": "#7f0000",
    "faster": "#2ca02c",
    "fixed": "#98df8a",
    "same": "#7f7f7f",
}


def short_labels(configs: list[str]) -> dict[str, str]:
    """Config labels without the `key=value` parts every config shares (a sweep's labels
    differ in a few keys), so a chart's ticks stay legible; the full label is in the hover."""
    parts = [c.split(",") for c in configs]
    common = set.intersection(*(set(p) for p in parts)) if len(parts) > 1 else set()
    return {c: ",".join(x for x in p if x not in common) or c for c, p in zip(configs, parts)}


def figures(rep: Any) -> list[Any]:
    out = [comparison(rep.results)]
    if rep.diff is not None and len(rep.diff):
        out.append(changes(rep.diff, rep.threshold))
    m = rep.measured()
    if len(m):
        out.append(measured(m))
    return out


def comparison(results: pd.DataFrame) -> Any:
    """Time per token of every strategy, grouped by config."""
    import plotly.graph_objects as go

    ok = results[results["status"] == "ok"]
    configs = list(dict.fromkeys(ok["config"]))
    short = short_labels(configs)
    fig = go.Figure()
    for strategy, g in ok.groupby("strategy", sort=False):
        fig.add_trace(
            go.Bar(
                name=strategy,
                x=[short[c] for c in g["config"]],
                y=g["time_per_token_s"] * 1e9,
                hovertext=[
                    f"{c}<br>{strategy}<br>{t * 1e9:.4g} ns/token, makespan {m * 1e3:.4g} ms"
                    for c, t, m in zip(g["config"], g["time_per_token_s"], g["makespan_s"])
                ],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title="Strategies per config: time per token (lower is better)",
        barmode="group",
        template="plotly_white",
        xaxis_title="config",
        yaxis_title="time per token (ns)",
    )
    return fig


def changes(diff: pd.DataFrame, threshold: float) -> Any:
    """Relative change of time per token per (config, strategy), threshold lines marked."""
    import plotly.graph_objects as go

    d = diff[diff["change_pct"].notna()]
    short = short_labels(list(dict.fromkeys(diff["config"])))
    fig = go.Figure()
    for verdict, g in d.groupby("verdict", sort=False):
        fig.add_trace(
            go.Bar(
                name=verdict,
                orientation="h",
                x=g["change_pct"],
                y=[f"{short[c]} | {s}" for c, s in zip(g["config"], g["strategy"])],
                marker_color=VERDICT_COLOUR.get(verdict, "#1f77b4"),
                hovertext=[
                    f"{c}<br>{s}<br>{b:.4g} -> {n:.4g} ns/token ({x:+.1f}%)"
                    for c, s, b, n, x in zip(
                        g["config"], g["strategy"], g["baseline_ns"], g["now_ns"], g["change_pct"]
                    )
                ],
                hoverinfo="text",
            )
        )
    for x in (-100 * threshold, 100 * threshold):
        fig.add_vline(x=x, line_dash="dash", line_color="#444")
    fig.update_layout(
        title=f"Against the baseline: change of time per token (threshold {100 * threshold:g}%)",
        template="plotly_white",
        xaxis_title="change of time per token (%)",
        yaxis_title="config | strategy",
        height=max(320, 40 + 22 * len(d)),
    )
    return fig


def measured(m: pd.DataFrame) -> Any:
    """Simulated against measured makespan, one marker per run, the diagonal for reference."""
    import plotly.graph_objects as go

    ms, ss = m["measured_s"] * 1e3, m["makespan_s"] * 1e3
    hi = float(max(ms.max(), ss.max())) * 1.05
    fig = go.Figure(
        [
            go.Scatter(
                x=ms,
                y=ss,
                mode="markers",
                name="runs",
                marker={"size": 9},
                hovertext=[f"{c}<br>{s}" for c, s in zip(m["config"], m["strategy"])],
            ),
            go.Scatter(
                x=[0, hi],
                y=[0, hi],
                mode="lines",
                name="simulated = measured",
                line={"dash": "dot", "color": "#888"},
            ),
        ]
    )
    fig.update_layout(
        title="Simulated against measured makespan",
        template="plotly_white",
        xaxis_title="measured makespan (ms)",
        yaxis_title="simulated makespan (ms)",
    )
    return fig
