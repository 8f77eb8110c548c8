"""`moesim compare`: several strategies on one layer and cluster, side by side.

Each entry is `name` or `name:key=value,key=value` (values parsed as YAML, e.g.
`pipelined:degree=8,order=alternating`). Every strategy is built with the cluster, so its own
selector runs (PipeMoE's Theorem 1), simulated, and reduced to one row: the parameters it ran
with, distinct tokens processed per step (fewer under tensor parallelism, whose replicas
share tokens), makespan, exposed communication, peak memory, and time per token relative to
the best. The table is written as CSV
and Markdown, the chart as plotly HTML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.analysis.layout_run import simulate_layout
from sim.analysis.summary import summarize
from sim.analysis.trace import to_frame
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.core.io import atomic_write_text
from sim.core.progress import iterate
from sim.hardware.costs import CostModel
from sim.strategies import Cluster, build, resolve_params


def parse_entry(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        if "=" not in item:
            raise ConfigError(f"--strategies {text!r}: expected name:key=value,...")
        k, v = item.split("=", 1)
        params[k.strip()] = yaml.safe_load(v)
    resolve_params(name.strip(), params)  # unknown names and parameters fail here
    return name.strip(), params


def compare(cfg: RunConfig, entries: list[str]) -> pd.DataFrame:
    topo = cfg.load_topology()
    costs = CostModel.build(topo, cfg.costs)
    cluster = Cluster(topo, costs)
    rows = []
    for entry in iterate(entries, "compare", "strategy"):  # a bar on stderr, if watched
        name, params = parse_entry(entry)
        wl = cfg.with_strategy(name, params).workload(topo)
        layer = wl.layer
        one = build(name, layer, wl.params, cfg.passes, cluster)
        res = simulate_layout(one, wl.layout, topo, costs)
        graph = res.graph
        s = summarize(res, to_frame(res))
        chosen = {k: v for k, v in s["params"].items() if k != "selector"}
        rows.append(
            {
                "strategy": entry,
                "params": ", ".join(f"{k}={v}" for k, v in chosen.items()) or "-",
                # tensor-parallel replicas share their tokens (DeepSpeed TED): the same
                # cluster then processes fewer distinct tokens per step
                "tokens": layer.tokens * graph.world_size // int(graph.meta.get("tp") or 1),
                "makespan_ms": s["makespan_s"] * 1e3,
                "exposed_comm_ms": s["exposed_comm_s"] * 1e3,
                "peak_activation_gib": s["peak_activation_bytes"] / 2**30,
                "oom": s["oom"],
            }
        )
    df = pd.DataFrame(rows)
    per_token = df["makespan_ms"] / df["tokens"]
    df["vs_best"] = per_token / per_token.min()  # time per token: fair across layouts
    return df


def write(df: pd.DataFrame, out_dir: str | Path, title: str) -> dict[str, Path]:
    import plotly.graph_objects as go

    out = Path(out_dir)
    atomic_write_text(out / "compare.csv", df.to_csv(index=False))
    atomic_write_text(out / "compare.md", f"# {title}\n\n" + to_markdown(df) + "\n")
    fig = go.Figure(
        [
            go.Bar(name="makespan", x=df["strategy"], y=df["makespan_ms"]),
            go.Bar(name="exposed communication", x=df["strategy"], y=df["exposed_comm_ms"]),
        ]
    )
    fig.update_layout(title=title, barmode="group", yaxis_title="ms", template="plotly_white")
    atomic_write_text(out / "compare.html", fig.to_html(include_plotlyjs="cdn"))
    return {
        "csv": out / "compare.csv",
        "markdown": out / "compare.md",
        "html": out / "compare.html",
    }


def to_markdown(df: pd.DataFrame) -> str:
    head = (
        "| strategy | params | tokens/step | makespan (ms) | exposed comm (ms) | "
        "peak act. (GiB) | time/token vs best |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|"]
    for r in df.itertuples(index=False):
        oom = " OOM" if r.oom else ""
        lines.append(
            f"| {r.strategy} | {r.params} | {r.tokens} | {r.makespan_ms:.3f} | "
            f"{r.exposed_comm_ms:.3f} | {r.peak_activation_gib:.3f}{oom} | "
            f"{r.vs_best:.3f}x |"
        )
    return "\n".join(lines)
