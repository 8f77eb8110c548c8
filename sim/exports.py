"""What `import sim` exports: the Python API for scripts and notebooks, keyword overrides in.

    r = sim.run("my.yaml", nodes=4, params={"degree": 8}, **{"model.capacity_factor": 1.5})
    r.summary["makespan_s"]; r.trace (DataFrame, one row per task); r.graph (TaskGraph)
    df = sim.compare("my.yaml", ["sequential", "pipelined:degree=4"], nodes=4)
    w = sim.whatif("my.yaml", {"link.*.bw": "*2"}); w.before["makespan_s"], w.after[...]
    rep = sim.replay("traces/exec-gloo-2r"); rep.summary["replay"]["error"]

`sim.commands` holds what the `moesim` subcommands do; these wrap them with what a
notebook wants: overrides as keywords (the CLI's run options, any config field, and dotted
paths into the config such as `"model.routing.s"`), DataFrames back, and every bad argument
a one-line `ConfigError` naming it. Heavy libraries load inside the functions.
"""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.commands import RunResult, demo_config, load_config
from sim.core.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from sim.analysis.replay import Replay
    from sim.analysis.whatif import WhatIf
    from sim.config import RunConfig

__all__ = [
    "RunConfig",
    "RunResult",
    "compare",
    "demo_config",
    "load_config",
    "predict",
    "replay",
    "run",
    "sweep",
    "whatif",
]

# the keyword that is not a config field: the CLI's `--param`s, merged into the strategy
PARAMS = "params"


def _keywords() -> tuple[str, ...]:
    """The keywords `run` takes: every top-level field of a run config, and `params`."""
    from sim.config.run_schema import RunSpec

    return (*RunSpec.model_fields, PARAMS)


def __getattr__(name: str) -> Any:
    if name == "RunConfig":  # the class itself, without importing sim.config up front
        from sim.config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'sim.exports' has no attribute {name!r}")


def _config(config: Any, overrides: dict[str, Any]) -> RunConfig:
    """`config` (RunConfig, mapping, or YAML path) with keyword overrides applied; checked
    again as a whole, so a bad value is named by its path in the config."""
    from sim.config import RunConfig

    if not isinstance(config, (RunConfig, dict, str, Path)):
        raise ConfigError(
            f"config: expected a RunConfig, a mapping or a path to a YAML file, "
            f"got {type(config).__name__}"
        )
    cfg = load_config(config)
    if not overrides:
        return cfg
    raw = copy.deepcopy(cfg.to_dict())  # nested mappings are the caller's config's own
    # the strategy first, so that `params` apply to the new one whatever the keyword order
    for key in sorted(overrides, key=lambda k: k != "strategy"):
        _apply(raw, key, overrides[key], cfg.strategy)
    return RunConfig.from_dict(raw, source=f"{cfg.source} with overrides")


def _apply(raw: dict[str, Any], key: str, value: Any, strategy: str) -> None:
    """One keyword override into the config's raw dict."""
    head, known = key.split(".", 1)[0], _keywords()
    if head not in known or (head == PARAMS and "." in key):
        close = difflib.get_close_matches(head, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"override {key!r}: unknown{hint}; expected one of {', '.join(known)} "
            f"or a dotted path into the config such as 'model.capacity_factor'"
        )
    if "." in key:  # a path into the config: "model.routing.s", "strategy.degree"
        *parents, leaf = key.split(".")
        node = raw
        for i, part in enumerate(parents):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif isinstance(nxt, str) and ".".join(parents[: i + 1]) == "model.routing":
                nxt = node[part] = {"kind": nxt}  # `routing: uniform` is short for a kind
            if not isinstance(nxt, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError(f"override {key!r}: {where} is {nxt!r}, not a mapping")
            node = nxt
        node[leaf] = value
    elif key == PARAMS:
        _mapping(key, value)
        raw["strategy"] = {**raw["strategy"], **value}
    elif key == "strategy" and isinstance(value, str):
        # a new name starts from that strategy's defaults; the same name keeps its params
        if value != strategy:
            raw["strategy"] = {"name": value}
    elif isinstance(value, dict) and isinstance(raw.get(key), dict) and key != "strategy":
        raw[key] = {**raw[key], **value}  # model={"top_k": 1}, limits=...: those fields only
    else:
        raw[key] = value


def _mapping(key: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"override {key!r}: expected a mapping, got {type(value).__name__}")


def run(config: Any, **overrides: Any) -> RunResult:
    """Build and simulate one run: `config` is a RunConfig, a mapping or a YAML path, with
    keyword overrides (`strategy="pipelined"`, `params={"degree": 8}`, `nodes=4`,
    `topology="dgx-h100"`, `costs={"finish_rtol": 1e-3}`, `model={"top_k": 1}`,
    `**{"model.routing.s": 1.2}`). A task graph (a TaskGraph or a `.json` path) is simulated
    as it is on `topology=` (`nodes=`, `costs=` and `limits=` also apply). Returns the
    summary, the trace DataFrame (one row per task) and the graph."""
    from sim import commands
    from sim.core.graph import TaskGraph

    if isinstance(config, TaskGraph) or (
        isinstance(config, (str, Path)) and str(config).endswith(".json")
    ):
        extra = set(overrides) - {"topology", "nodes", "costs", "limits"}
        if extra:
            raise ConfigError(
                f"override {sorted(extra)[0]!r}: a task graph is simulated as it is; "
                "only topology, nodes, costs and limits apply"
            )
        if not overrides.get("topology"):
            raise ConfigError("a task graph needs topology= (a preset or a topology YAML)")
        return commands.replay_graph(
            config,
            overrides["topology"],
            overrides.get("nodes"),
            overrides.get("costs"),
            limits=overrides.get("limits"),
        )
    return commands.simulate_config(_config(config, overrides))


def compare(
    config: Any, strategies: list[str], out: str | Path | None = None, **overrides: Any
) -> pd.DataFrame:
    """Several strategies ("name" or "name:key=value,...") simulated on one config (with
    the same keyword overrides as `run`), one row each; with `out`, the table and chart are
    also written into that directory."""
    from sim import commands

    if isinstance(strategies, str) or not isinstance(strategies, (list, tuple)):
        raise ConfigError(
            f"strategies: expected a list such as ['sequential', 'pipelined:degree=4'], "
            f"got {strategies!r}"
        )
    if not strategies or not all(isinstance(s, str) for s in strategies):
        raise ConfigError(f"strategies: expected a non-empty list of strings, got {strategies!r}")
    return commands.compare_strategies(_config(config, overrides), list(strategies), out).table


def sweep(spec: Any, **options: Any) -> pd.DataFrame:
    """The cross product of a sweep spec (a mapping or a YAML path), one row per run
    (`sim.analysis.sweep.run_sweep`; options such as `out=`, `scheduler=`, `workers=`)."""
    from sim.analysis.sweep import run_sweep

    return run_sweep(spec, **options)


def whatif(
    base: Any,
    changes: dict[str, Any] | list[str],
    topology: str | None = None,
    nodes: int | None = None,
    costs: dict[str, Any] | None = None,
) -> WhatIf:
    """`base` (a run config, a task graph, or a measured trace) simulated before and after
    `changes`: `{"link.*.bw": "*2", "compute.speed": 0.5}` or `["link.*.bw=*2", ...]`, the
    keys of `moesim whatif --set`. Returns (before, after, before_trace, after_trace)."""
    from sim.analysis.whatif import whatif as run_whatif

    if isinstance(changes, dict):
        sets = [f"{k}={_text(v)}" for k, v in changes.items()]
    elif isinstance(changes, (list, tuple)) and all(isinstance(s, str) for s in changes):
        sets = list(changes)
    else:
        raise ConfigError(
            f"changes: expected a mapping such as {{'link.*.bw': '*2'}} or a list of "
            f"'KEY=VALUE' strings, got {changes!r}"
        )
    return run_whatif(base, sets, topology=topology, nodes=nodes, costs=costs)


def _text(value: Any) -> str:
    """A value as `--set` reads it: numbers and strings as written, others as JSON (YAML)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def replay(
    trace: str | Path | list[str | Path],
    graph: str | Path | None = None,
    topology: str | None = None,
) -> Replay:
    """A measured trace (moesim executor output, or PyTorch profiler JSON per rank) replayed:
    `.summary` (with "replay": the measured makespan and the error), `.trace`, `.graph`."""
    from sim.analysis.replay import replay as run_replay

    return run_replay(trace, graph=graph, topology=topology)


def predict(
    table: str | Path | list[dict[str, Any]],
    rows: list[int] | None = None,
    sensitivity: bool = False,
) -> dict:
    """Whole training steps of a table of runs (a CSV path, or rows as mappings with the
    columns of `moesim predict`): `{"rows": [...], "mape": {...}}`, each row its columns plus
    the predictions, or a `reason` where it could not be built. `rows`: 1-based row numbers
    to predict (default all). `sensitivity`: each row's `sensitivity` to the GPU, the host
    and the links too, and the resource it is `bound_by` (`moesim predict --sensitivity`)."""
    from sim.training.predict import predict_rows, read_table

    table_rows = read_table(table) if isinstance(table, (str, Path)) else [dict(r) for r in table]
    picked = rows or list(range(1, len(table_rows) + 1))
    for n in picked:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(table_rows):
            raise ConfigError(f"rows: {n!r} is not a row of the table (1..{len(table_rows)})")
    return predict_rows([{**table_rows[n - 1], "_row": n} for n in picked], sensitivity=sensitivity)


def plan(
    model: str,
    system: str,
    gpus: int,
    gbs: int,
    seq_len: int,
    precision: str = "BF16",
    layout: str | None = None,
    workers: int = 1,
    scheduler: Any = None,
    out: str | None = None,
    grid: dict | None = None,
) -> dict:
    """The fastest layouts of `model` on `gpus` GPUs of `system` (`moesim plan`):
    `{"considered", "simulated", "pruned", "candidates": [...ranked], "given"}`; `layout`
    ("tp=1,pp=2,vp=12,ep=8,mbs=1", ...) is also scored and ranked. `scheduler`: a Dask
    scheduler address, a `distributed.Client` or "dask-local" (else `workers` local
    processes); `out`: a folder for the journal (a plan run again resumes) and the files of
    `--out`; `grid`: the values tried per key (`{"pp": (1, 2), "comm_sms": (16, 24)}`)."""
    from sim.training.plan import plan as run_plan
    from sim.training.plan_parse import parse_layout
    from sim.training.plan_space import Request

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers: expected an integer >= 1, got {workers!r}")
    req = Request(model, system, gpus, gbs, seq_len, str(precision).upper())
    given = parse_layout(layout, "layout") if layout else None
    grid = {k: tuple(v) for k, v in grid.items()} if grid else None
    p = run_plan(req, given=given, workers=workers, scheduler=scheduler, out=out, grid=grid)
    return p.as_dict() | {"files": {k: str(v) for k, v in p.files.items()}}
