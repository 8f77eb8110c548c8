"""`moesim compare`: several strategies on one layer and cluster, side by side.

Each entry is `name` or `name:key=value,key=value` (values parsed as YAML, e.g.
`pipelined:degree=8,order=alternating`). Every strategy is built with the cluster, so its own
selector runs (PipeMoE's Theorem 1), simulated, and reduced to one row: the parameters it ran
with, distinct tokens processed per step (fewer under tensor parallelism, whose replicas
share tokens), makespan, exposed communication, memory (peak activations, model states and
their sum, counted alike for every strategy), the (token, expert) choices one MoE layer
routes, keeps within capacity and drops, and time per token, the ranking metric (a layout
that processes fewer tokens is not faster for finishing sooner; rows that keep different
numbers of tokens are not the same work, and the table says so). With an
output directory the set is: `results.csv` (the shared results row schema of
`sim.analysis.results`, which `moesim report` reads), `compare.md`, a self-contained
`compare.html` (time per token, and makespan beside it) and the resolved `config.yaml`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.analysis.summary import summarize, work_note
from sim.analysis.trace import to_frame
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.core.progress import iterate
from sim.core.safeload import load_value
from sim.hardware.costs import CostModel
from sim.pipeline import simulate_layout
from sim.strategies import STRATEGIES, Cluster, build, resolve_params

LABEL_KEYS = ("batch", "seq_len", "model_dim", "hidden_dim", "experts_per_gpu", "experts", "top_k")


def parse_entry(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    items = rest.split(",") if rest.strip() else []
    if any(not item.strip() for item in items):  # `degree=4,,`: a stray comma, or a lost value
        raise ConfigError(
            f"--strategies {text!r}: an empty parameter (expected name:key=value,...)"
        )
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--strategies {text!r}: expected name:key=value,...")
        k, v = item.split("=", 1)
        # the one safe loader: no cyclic aliases, no alias bombs, numbers as Python reads them
        params[k.strip()] = load_value(v, f"--strategies {name.strip()}:{k.strip()}")
    resolve_params(name.strip(), params)  # unknown names and parameters fail here
    return name.strip(), params


def config_label(cfg: RunConfig, nodes: int) -> str:
    """A readable label of the config point without its strategy, stable across runs (so a
    baseline's rows pair with the new ones)."""
    parts = [f"topology={cfg.topology}", f"nodes={nodes}"]
    parts += [f"model.{k}={cfg.model[k]}" for k in LABEL_KEYS if k in cfg.model]
    return ",".join(parts)


def run_id(cfg: RunConfig, entry: str) -> str:
    """A stable hash of everything the run depends on: the config (strategy aside) and entry."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in ("strategy", "output")}
    blob = json.dumps({"config": d, "strategy": entry}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def simulate_entry(cfg: RunConfig, entry: str, cluster: Cluster) -> tuple[Any, Any, str]:
    """One entry built with the cluster (its selector runs) and simulated: (result, layer,
    scope). With `model.blocks` every entry's graph is the model, as `simulate` builds it."""
    name, params = parse_entry(entry)
    wl = cfg.with_strategy(name, params).workload(cluster.topology)
    one = build(name, wl.layer, wl.params, cfg.passes, cluster, blocks=wl.blocks)
    res = simulate_layout(one, wl.layout, cluster.topology, cluster.costs)
    return res, wl.layer, scope(name, one, wl.blocks)


def scope(name: str, graph: Any, blocks: Any) -> str:
    """What an entry's graph covers, so that a table mixing them says so: one MoE layer,
    the model, or a stage of MoE blocks with their attention (megatron_ep's and dualpipe's
    graphs: without `model.blocks` they build `layers` blocks of their own; with it, the
    model's MoE blocks and not its dense ones)."""
    if "moe_layers" in graph.meta:
        return f"{graph.meta['moe_layers']} MoE blocks with attention"
    if blocks is None:
        return "one MoE layer"
    if STRATEGIES[name].builds_model and len(blocks.moe_blocks) < blocks.n:
        return "the model's MoE blocks"
    return "the model"


def step_tokens(layer: Any, graph: Any) -> int:
    """Tokens one step processes, counted once per MoE layer they cross where a graph spans
    several (meta `moe_layers`: megatron_ep's and dualpipe's stages without `model.blocks`),
    so that they rank against one layer's graphs; with blocks every graph is the model."""
    meta = graph.meta
    # a pipeline's devices (dualpipe) each run one EP group of the layer's world
    ranks = graph.world_size // int(meta.get("devices") or 1)
    work = int(meta.get("micro") or 1) * int(meta.get("moe_layers") or 1)
    # tensor-parallel replicas share their tokens (DeepSpeed TED): the same cluster then
    # processes fewer distinct tokens per step
    return layer.tokens * ranks * work // int(meta.get("tp") or 1)


def compare(cfg: RunConfig, entries: list[str]) -> pd.DataFrame:
    topo = cfg.load_topology()
    cluster = Cluster(topo, CostModel.build(topo, cfg.costs))
    label = config_label(cfg, topo.nodes)
    rows = []
    for entry in iterate(entries, "compare", "strategy"):  # a bar on stderr, if watched
        res, layer, covers = simulate_entry(cfg, entry, cluster)
        graph = res.graph
        s = summarize(res, to_frame(res))
        chosen = {k: v for k, v in s["params"].items() if k != "selector"}
        tokens = step_tokens(layer, graph)
        rows.append(
            {
                "strategy": entry,
                "params": ", ".join(f"{k}={v}" for k, v in chosen.items()) or "-",
                "scope": covers,
                "tokens": tokens,
                "makespan_s": s["makespan_s"],
                "time_per_token_s": s["makespan_s"] / tokens,
                "exposed_comm_s": s["exposed_comm_s"],
                "peak_activation_bytes": s["peak_activation_bytes"],
                "model_state_bytes": s["model_state_bytes"],
                "peak_memory_bytes": s["peak_memory_bytes"],
                "oom": s["oom"],
                **token_columns(s),
                "config": label,
                "gpus": topo.world_size,
                "run_id": run_id(cfg, entry),
                **{f"param.{k}": v for k, v in chosen.items()},
            }
        )
    df = pd.DataFrame(rows)
    typed_param_columns(df, rows)
    typed_token_columns(df)
    for c in ("model_state_bytes", "peak_memory_bytes"):
        df[c] = df[c].astype("Float64")  # unknown (a graph that does not say) stays NA
    per_token = df["time_per_token_s"]
    df["vs_best"] = per_token / per_token.min()  # time per token: fair across layouts
    df.attrs["config"] = cfg.to_dict()  # written beside the table: `report` re-simulates it
    return df


def results_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The table in the shared results row schema (sim.analysis.results.REQUIRED first)."""
    out = pd.DataFrame(
        {
            "run_id": df["run_id"],
            "config": df["config"],
            "strategy": df["strategy"],
            "status": "ok",
            "error": "",
            "makespan_s": df["makespan_s"],
            "time_per_token_s": df["time_per_token_s"],
            "tokens": df["tokens"].astype(int),
            "gpus": df["gpus"].astype(int),
            "exposed_comm_s": df["exposed_comm_s"],
            "peak_activation_bytes": df["peak_activation_bytes"],
            "model_state_bytes": df["model_state_bytes"],
            "peak_memory_bytes": df["peak_memory_bytes"],
            **{c: df[c] for c in TOKEN_COLUMNS},
        }
    )
    params = [c for c in df.columns if c.startswith("param.")]
    return pd.concat([out, df[params]], axis=1)


def figure(df: pd.DataFrame, title: str) -> Any:
    """Time per token (the ranking metric) on the left, makespan and exposed communication
    on the right; the hover of each bar shows the other metric too."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("time per token (ranks the table)", "makespan per step")
    )
    hover = [
        f"{r.strategy}<br>{r.params}<br>{r.time_per_token_s * 1e9:.3f} ns/token, "
        f"{r.vs_best:.3f}x best<br>makespan {r.makespan_s * 1e3:.3f} ms, {r.tokens} tokens"
        for r in df.itertuples(index=False)
    ]
    fig.add_trace(
        go.Bar(
            name="time per token",
            x=df["strategy"],
            y=df["time_per_token_s"] * 1e9,
            hovertext=hover,
            hoverinfo="text",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            name="makespan",
            x=df["strategy"],
            y=df["makespan_s"] * 1e3,
            hovertext=hover,
            hoverinfo="text",
        ),
        row=1,
        col=2,
    )
    fig.add_trace(
        go.Bar(name="exposed communication", x=df["strategy"], y=df["exposed_comm_s"] * 1e3),
        row=1,
        col=2,
    )
    fig.update_layout(title=title, barmode="group", template="plotly_white")
    fig.update_xaxes(title_text="strategy")
    fig.update_yaxes(title_text="time per token (ns)", row=1, col=1)
    fig.update_yaxes(title_text="time per step (ms)", row=1, col=2)
    return fig


def write(df: pd.DataFrame, out_dir: str | Path, title: str) -> dict[str, Path]:
    """The output set (module doc), with its manifest."""
    from sim.analysis.html import write_page
    from sim.core.io import OutputSet

    md = f"# {title}\n\n" + to_markdown(df) + "\n"
    with OutputSet(out_dir, "compare") as out:
        files = {
            "results": out.write_text("results.csv", results_rows(df).to_csv(index=False)),
            "markdown": out.write_text("compare.md", md),
            "html": write_page(out, title, [figure(df, title), to_markdown(df)], "compare.html"),
        }
        if df.attrs.get("config"):
            files["config"] = out.write_text(
                "config.yaml", yaml.safe_dump(df.attrs["config"], sort_keys=False)
            )
    return files


def to_markdown(df: pd.DataFrame) -> str:
    head = (
        "| strategy | params | scope | tokens/step | kept / dropped per layer | makespan (ms) | "
        "exposed comm (ms) | peak act. (GiB) | model states (GiB) | peak mem. (GiB) | "
        "time/token (ns) | vs best |"
    )
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in df.itertuples(index=False):
        oom = " OOM" if r.oom else ""
        lines.append(
            f"| {r.strategy} | {r.params} | {r.scope} | {r.tokens} | {_kept(r)} | "
            f"{r.makespan_s * 1e3:.3f} | {r.exposed_comm_s * 1e3:.3f} | "
            f"{_gib(r.peak_activation_bytes)} | {_gib(r.model_state_bytes)} | "
            f"{_gib(r.peak_memory_bytes)}{oom} | {r.time_per_token_s * 1e9:.4g} | "
            f"{r.vs_best:.3f}x |"
        )
    if df["scope"].nunique() > 1:
        lines += ["", SCOPES_DIFFER]
    note = work_note(df.to_dict(orient="records"), list(df["strategy"]))
    if note:
        lines += ["", note]
    return "\n".join(lines)


# -- what each row did: memory and tokens ------------------------------------------------------

TOKEN_COLUMNS = (
    "tokens_routed",
    "tokens_kept",
    "tokens_dropped",
    "dropped_fraction",
    "gpu_load_max_mean",
)
FRACTIONS = ("dropped_fraction", "gpu_load_max_mean")


def _gib(nbytes: Any) -> str:
    """Bytes as GiB for the tables a person reads (the frame itself is in bytes)."""
    return "unknown" if nbytes is None or pd.isna(nbytes) else f"{nbytes / 2**30:.3f}"


def typed_param_columns(df: pd.DataFrame, rows: list[dict[str, Any]]) -> None:
    """`param.<key>` columns typed as `sweep` types them (sim.analysis.sweep.store), from the
    values the rows ran with: integers, floats, or text; a parameter a strategy does not
    have is NA (or "" in a text column)."""
    for c in [c for c in df.columns if c.startswith("param.")]:
        vals = [r[c] for r in rows if r.get(c) is not None]
        if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            df[c] = pd.array([r.get(c) for r in rows], dtype="Int64")
        elif vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            df[c] = pd.array([r.get(c) for r in rows], dtype="Float64")
        else:
            df[c] = ["" if r.get(c) is None else str(r[c]) for r in rows]


def _kept(r: Any) -> str:
    if pd.isna(r.tokens_kept):
        return "unknown"
    return f"{int(r.tokens_kept):,} / {int(r.tokens_dropped):,} ({r.dropped_fraction:.1%})"


def token_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary's (token, expert) choices of one MoE layer as flat row columns (None where
    the graph does not say): routed, kept within capacity, dropped, the dropped share, and
    the hottest GPU's kept rows over the mean."""
    t = summary.get("tokens_per_layer") or {}
    return {
        f"tokens_{k}" if k not in FRACTIONS else k: t.get(k)
        for k in ("routed", "kept", "dropped", *FRACTIONS)
    }


def typed_token_columns(df: pd.DataFrame) -> None:
    """Counts as nullable integers, the fraction as a nullable float: an unknown stays
    unknown (NA), not 0 and not a NaN that a finiteness check would refuse."""
    for c in TOKEN_COLUMNS:
        df[c] = df[c].astype("Float64" if c in FRACTIONS else "Int64")


SCOPES_DIFFER = (
    "Scopes differ: time per token ranks like with like only within a scope (attention or "
    "dense blocks in a graph cost per token for that alone). With `model.blocks` whose every "
    "block is MoE (`first_dense: 0, moe_every: 1`) every strategy builds the same model."
)
