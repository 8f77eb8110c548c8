"""Trace importers: a measured trace as a task graph and each task's measured (start, end).

Formats, told apart by name and content:
- moesim traces (`*.csv`, `*.parquet`; sim.analysis.importers.moesim_trace), with the graph
  they ran if given;
- PyTorch profiler (Kineto) Chrome traces (`*.json`, `*.json.gz`, one file per rank, or a
  directory of them; sim.analysis.importers.kineto).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph

TABLES = (".csv", ".parquet")


def load(
    source: str | Path | list[str | Path], graph: str | Path | None = None
) -> tuple[TaskGraph, dict[str, tuple[float, float]], str]:
    """(graph, times, format name) of a trace file, a list of per-rank files or a directory."""
    from sim.analysis.output_sets import check_set

    for s in source if isinstance(source, (list, tuple)) else [source]:
        p = Path(s)  # an output set (an executor's --out) is read only whole and unchanged
        if p.is_dir():
            check_set(p, "trace directory")
        else:
            check_set(p.parent, "trace", p.name)
    if graph is None and not isinstance(source, (list, tuple)) and Path(source).is_dir():
        beside = Path(source) / "graph.json"  # an executor output with the graph it ran
        graph = beside if beside.is_file() else None
    paths = _expand(source)
    tables = [p for p in paths if p.suffix in TABLES]
    if tables:
        if len(paths) != 1:
            raise ConfigError(
                f"traces {[str(p) for p in paths]}: a moesim trace is one table; give one file"
            )
        from sim.analysis.importers import moesim_trace

        if graph is not None:
            return (*moesim_trace.with_graph(paths[0], graph), "moesim trace + graph")
        return (*moesim_trace.infer(paths[0]), "moesim trace (structure inferred)")
    if graph is not None:
        raise ConfigError("--graph applies to a moesim trace (CSV/Parquet), not to Kineto JSON")
    from sim.analysis.importers import kineto

    return (*kineto.load(paths), "pytorch profiler (kineto)")


def _expand(source: Any) -> list[Path]:
    items = source if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ConfigError("replay: no trace given")
    out: list[Path] = []
    for s in items:
        p = Path(s)
        if p.is_dir():
            found = sorted(
                q
                for q in p.iterdir()
                if q.name.endswith((".json", ".json.gz", *TABLES))
                and q.name not in ("graph.json", "summary.json")
                and not q.name.endswith(".chrome.json")  # moesim's own export
            )
            if not found:
                raise ConfigError(
                    f"trace directory {p}: no *.json, *.json.gz, *.csv or *.parquet in it"
                )
            tables = [q for q in found if q.suffix in TABLES]
            out += tables[:1] if tables else found  # an executor's output dir: its trace
        elif not p.exists():
            raise ConfigError(f"trace {p}: not found")
        elif not p.name.endswith((".json", ".json.gz", *TABLES)):
            raise ConfigError(
                f"trace {p}: unknown format; expected a moesim trace (.csv, .parquet) or a "
                "PyTorch profiler Chrome trace (.json, .json.gz)"
            )
        else:
            out.append(p)
    return out
