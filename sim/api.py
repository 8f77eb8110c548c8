"""The Python API: what the CLI does, callable from scripts and notebooks.

`run(config)` builds one strategy's task graph, simulates it and returns the graph, the trace
frame and the summary; the CLI is a thin layer over these functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError


@dataclass
class RunResult:
    graph: Any  # sim.core.graph.TaskGraph
    trace: Any  # pandas.DataFrame, one row per executed task
    summary: dict[str, Any]


def load_config(config: Any):
    """A RunConfig from a RunConfig, a mapping, or a path to a YAML file."""
    from sim.config import RunConfig

    if isinstance(config, RunConfig):
        return config
    if isinstance(config, dict):
        return RunConfig.from_dict(config)
    return RunConfig.load(Path(config))


def run(config: Any) -> RunResult:
    """Build and simulate one run config (a RunConfig, a mapping or a YAML path)."""
    from sim.analysis.summary import summarize
    from sim.analysis.trace import to_frame
    from sim.engine.engine import simulate
    from sim.hardware.costs import CostModel
    from sim.strategies import Cluster, build

    cfg = load_config(config)
    topo = cfg.load_topology()
    wl = cfg.workload(topo)
    costs = CostModel.build(topo, cfg.costs)
    t0 = time.perf_counter()
    graph = build(
        cfg.strategy, wl.layer, wl.params, cfg.passes, Cluster(topo, costs), layout=wl.layout
    )
    t1 = time.perf_counter()
    res = simulate(graph, topo, costs)
    t2 = time.perf_counter()
    df = to_frame(res)
    summary = summarize(res, df)
    summary["wall_s"] = {"build": t1 - t0, "simulate": t2 - t1}
    if cfg.parallel is not None and wl.layout is not None:
        summary["parallel"] = wl.layout.as_dict()
    return RunResult(graph, df, summary)


def parse_params(items: list[str]) -> dict[str, Any]:
    """`--param KEY=VALUE` strings as a dict, each value read as YAML (4 -> int, a -> str)."""
    import yaml

    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = yaml.safe_load(v)
    return out
