"""What each `moesim` subcommand does, for the CLI (`sim.cli` parses arguments, calls these
and prints) and tests. The Python API is `import sim` (`sim.exports`), which wraps these; no
name here is one of its names unless it is the same object.

`simulate_config(config)` builds one strategy's task graph, simulates it and returns the
graph, the trace frame and the summary; `simulate_command` also writes the output set
(`moesim simulate`); `replay_graph` simulates a task graph as it is; `compare_strategies`,
`export_graph`, `collective_sweep` and the topology functions back the other subcommands.

Everything heavy (pandas, numpy, networkx, SimPy, plotly, YAML) is imported inside the
functions that need it, so `import sim.commands` stays as cheap as `moesim --help` must be.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.core.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from sim.analysis.collbench import Row
    from sim.config import RunConfig
    from sim.core.graph import TaskGraph
    from sim.hardware.topology import Topology


@dataclass
class RunResult:
    graph: Any  # sim.core.graph.TaskGraph
    trace: Any  # pandas.DataFrame, one row per executed task
    summary: dict[str, Any]
    sim: Any = None  # sim.engine.result.SimResult: link bytes, memory, link utilisation, stats


# -- run configs ----------------------------------------------------------------------------


def load_config(config: Any) -> RunConfig:
    """A RunConfig from a RunConfig, a mapping, or a path to a YAML file."""
    from sim.config import RunConfig

    if isinstance(config, RunConfig):
        return config
    if isinstance(config, dict):
        return RunConfig.from_dict(config)
    return RunConfig.load(Path(config))


def configure(
    config: Any,
    strategy: str | None = None,
    params: dict[str, Any] | None = None,
    topology: str | None = None,
    nodes: int | None = None,
    costs: dict[str, Any] | None = None,
    limits: dict[str, int] | None = None,
) -> RunConfig:
    """`load_config` with the overrides the CLI's run options give (None: keep the config's);
    `params`, `costs` and `limits` are merged into the config's strategy parameters, costs
    and size limits."""
    return load_config(config).with_overrides(
        strategy=strategy,
        params=params or {},
        topology=topology,
        nodes=nodes,
        costs=costs or {},
        limits=limits or {},
    )


def demo_config() -> RunConfig:
    """The embedded demo config (sim/configs/demo.yaml)."""
    from sim.config import RunConfig

    return RunConfig.demo()


def parse_params(items: list[str] | None, flag: str = "--param") -> dict[str, Any]:
    """`--param KEY=VALUE` (or `flag`) strings as a dict: numbers as Python reads them (1e-3),
    the rest as YAML, as safely as a file (`sim.core.safeload.load_value`)."""
    from sim.core.safeload import load_value

    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = load_value(v, f"{flag} {k}")
    return out


def build_graph(config: Any) -> TaskGraph:
    """The task graph of a run config's strategy on its cluster (not simulated)."""
    from sim.core.limits import applied
    from sim.hardware.costs import CostModel
    from sim.strategies import Cluster, build

    cfg = load_config(config)
    with applied(cfg.size_limits()) as lim:
        topo = cfg.load_topology()
        lim.check_run(topo.world_size, cfg.source)  # a graph has a task list per rank
        costs = CostModel.build(topo, cfg.costs)
        wl = cfg.workload(topo)
        cluster = Cluster(topo, costs)  # blocks: a model around the layers
        return build(cfg.strategy, wl.layer, wl.params, cfg.passes, cluster, wl.layout, wl.blocks)


def export_graph(config: Any, path: str | Path) -> TaskGraph:
    """`build_graph`, saved as task-graph JSON at `path` (what `moesim exec` runs)."""
    graph = build_graph(config)
    graph.to_json(path)
    return graph


def simulate_config(config: Any, record_links: bool = False) -> RunResult:
    """Build and simulate one run config (a RunConfig, a mapping or a YAML path); with
    `record_links`, the utilisation of each link class over time (for the Chrome trace)."""
    result = _simulate_table(config, record_links)
    result.trace = result.trace.to_frame()  # the TraceTable as a DataFrame
    return result


def _simulate_table(config: Any, record_links: bool = False) -> RunResult:
    """`simulate_config` with the trace as a `sim.analysis.trace.columns.TraceTable`: what
    `simulate_command` writes its output set from, without importing pandas."""
    from sim.pipeline import build_and_simulate

    r = build_and_simulate(load_config(config), record_links=record_links)
    r.summary["wall_s"] = r.wall_s
    return RunResult(r.result.graph, r.table, r.summary, r.result)


def simulate_command(
    config: Any, out_dir: str | Path | None, want_trace: bool = True
) -> dict[str, Any]:
    """`moesim simulate`: `simulate_config`, then (unless `out_dir` is None) the output set
    written atomically into `out_dir`: the trace table, the Chrome trace (unless `want_trace`
    is false or the config turns it off), the resolved config.yaml and summary.json. Returns
    the summary, with the files written under "files"."""
    from sim.core.io import check_output_dir

    cfg = load_config(config)
    if out_dir is not None:  # an unusable output path fails before the run, not after it
        check_output_dir(out_dir)
    chrome = out_dir is not None and want_trace and cfg.output.get("chrome_trace", True)
    result = _simulate_table(
        cfg, record_links=bool(chrome)
    )  # link utilisation: for the Chrome trace
    if out_dir is not None:
        write_outputs(cfg, result, Path(out_dir), want_trace)
    return result.summary


def write_outputs(
    cfg: RunConfig, result: RunResult, out_dir: Path, want_trace: bool = True
) -> None:
    """The output set of a run (see `simulate_command`): each file atomically, the manifest last
    (`sim.core.io.OutputSet`); adds "files" to `result.summary`."""
    import yaml

    from sim.analysis.chrome import write_chrome_trace
    from sim.analysis.trace import write_table
    from sim.core.io import OutputSet

    fmt = cfg.output.get("trace_format", "csv")
    if fmt not in ("csv", "parquet"):
        raise ConfigError(f"output.trace_format: expected 'csv' or 'parquet', got {fmt!r}")
    df, summary = result.trace, result.summary
    with OutputSet(out_dir, "simulate") as out:
        write_table(df, out.path(f"trace.{fmt}"))
        files = {"trace": str(out.final(f"trace.{fmt}"))}
        if want_trace and cfg.output.get("chrome_trace", True):
            ranks, name = cfg.output.get("max_trace_ranks"), "trace.chrome.json"
            write_chrome_trace(df, out.path(name), ranks, result.graph, result.sim)
            files["chrome_trace"] = str(out.final(name))
        out.write_text("config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        summary["files"] = files
        out.write_text("summary.json", json.dumps(summary, indent=2, default=str))


def format_summary(summary: dict[str, Any]) -> str:
    """A run's summary as the text `moesim simulate` prints."""
    from sim.analysis.summary import format_summary as text

    return text(summary)


# -- task graphs from elsewhere ----------------------------------------------------------------


def replay_graph(
    graph: TaskGraph | str | Path,
    topology: str | Path,
    nodes: int | None = None,
    costs: dict[str, Any] | None = None,
    out_dir: str | Path | None = None,
    limits: dict[str, int] | None = None,
) -> RunResult:
    """Simulate a task graph (or its JSON file, from `moesim graph` or any builder) on a
    topology. `nodes` None: just enough nodes for the graph's ranks (not the preset's
    default). With `out_dir`, the trace table and Chrome trace are written there and listed
    under the summary's "files". `limits` raises size limits (`sim.core.limits`). (`sim.run`
    takes a graph too; `sim.replay` replays a measured trace, a `sim.analysis.replay.Replay`.)"""
    from sim.analysis.guards import check_flows, finite_summary, jitter_replicas
    from sim.analysis.summary import summarize
    from sim.analysis.trace import to_frame, write_trace_files
    from sim.core.graph import TaskGraph
    from sim.core.limits import DEFAULT, applied
    from sim.engine.engine import simulate
    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology

    if out_dir is not None:  # an unusable output folder fails before the run, not after it
        from sim.core.io import check_output_dir

        check_output_dir(out_dir)
    if (costs or {}).get("calibration"):
        from sim.config.routing_file import check_calibration_file

        check_calibration_file(costs["calibration"])  # type: ignore[index]
    with applied(DEFAULT.merged(limits)) as lim:
        if not isinstance(graph, TaskGraph):
            graph = TaskGraph.from_json(graph)
        if nodes is None:
            per_node = Topology.load(topology, nodes=1).gpus_per_node
            nodes = -(-graph.world_size // per_node)
        topo = Topology.load(topology, nodes=nodes)
        model = CostModel.build(topo, costs or {})
        lim.check_run(graph.world_size, "replay", len(graph), jitter_replicas(model))
        check_flows(lim, graph, model, "replay")
        res = simulate(graph, topo, model, record_links=out_dir is not None)
        df = to_frame(res)
        summary = finite_summary(summarize(res, df))
    if out_dir is not None:
        from sim.core.io import OutputSet

        with OutputSet(out_dir, "replay") as out:
            summary["files"] = write_trace_files(out, df, graph, res)
            out.write_text("summary.json", json.dumps(summary, indent=2, default=str))
    return RunResult(graph, df, summary, res)


# -- strategies side by side --------------------------------------------------------------------


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per strategy (sim.analysis.compare.compare)
    title: str
    files: dict[str, Path] = field(default_factory=dict)

    def markdown(self) -> str:
        from sim.analysis.compare import to_markdown

        return to_markdown(self.table)


def compare_strategies(
    config: Any, strategies: list[str], out_dir: str | Path | None = None
) -> Comparison:
    """`moesim compare`: several strategies ("name" or "name:k=v,...") simulated on one run
    config; with `out_dir`, the table (CSV, Markdown) and a chart written there. (`sim.compare`
    returns the table alone, a DataFrame.)"""
    from sim.analysis.compare import compare as compare_frame
    from sim.analysis.compare import write
    from sim.core.finite import check_finite
    from sim.core.limits import applied

    cfg = load_config(config)
    with applied(cfg.size_limits()) as lim:
        jitter = cfg.costs.get("jitter")
        replicas = jitter.get("replicas", 11) if isinstance(jitter, dict) else 1
        lim.check_run(cfg.load_topology().world_size, cfg.source, replicas=replicas)
        df = compare_frame(cfg, strategies)
    check_finite(df.to_dict(orient="records"), "compare")
    title = (
        f"{cfg.topology} x{cfg.load_topology().nodes} nodes, passes {list(cfg.passes)}: "
        f"{len(df)} strategies"
    )
    files = write(df, Path(out_dir), title) if out_dir is not None else {}
    return Comparison(df, title, files)


# -- collectives, nccl-tests style ------------------------------------------------------------


@dataclass
class CollectiveSweep:
    header: dict[str, Any]  # collective, algo, topology, nodes, gpus, fidelity
    rows: list[Row]
    # what only the table's nccl-tests header shows (min_bytes, max_bytes, factor,
    # gpus_per_node, gpu_model); kept out of the JSON, whose keys stay as they were
    setup: dict[str, Any] = field(default_factory=dict)

    def report(self, as_json: bool = False) -> str:
        """nccl-tests' table, or JSON with the header's fields and the rows."""
        from sim.analysis.collbench import format_table

        if as_json:
            return json.dumps({**self.header, "rows": [r.as_dict() for r in self.rows]}, indent=2)
        return format_table(self.rows, self.header, self.setup)


def collective_sweep(
    topology: str | Path,
    collective: str = "all_to_all",
    algo: str | None = None,
    min_bytes: int = 1024,
    max_bytes: int = 2**30,
    factor: int = 2,
    nodes: int | None = None,
    fidelity: str | None = None,
    oversubscription: float | None = None,
    limits: dict[str, int] | None = None,
) -> CollectiveSweep:
    """One collective simulated over message sizes min_bytes, min_bytes*factor, ... up to
    max_bytes (`moesim collectives`)."""
    from sim.analysis import collbench
    from sim.core.finite import check_finite
    from sim.core.limits import DEFAULT, applied
    from sim.hardware.collectives import DEFAULT_ALGO
    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology

    fabric = {"oversubscription": oversubscription} if oversubscription else None
    with applied(DEFAULT.merged(limits)) as lim:
        topo = Topology.load(topology, nodes=nodes, fabric=fabric)
        lim.check_run(topo.world_size, "collectives")
        costs = CostModel.build(topo, {"fidelity": fidelity} if fidelity else {})
        sizes = collbench.sizes(min_bytes, max_bytes, factor)
        n = topo.world_size
        name = algo or DEFAULT_ALGO.get(collective, "linear")
        phases = n if name in ("ring", "pairwise", "hierarchical") else 1  # one per peer
        lim.check(
            "max_flows",
            len(sizes) * n * phases,
            f"collectives: flows ({len(sizes)} sizes x {n:,} ranks x {phases:,} phases)",
        )
        rows, fid = collbench.run(topo, costs, collective, algo, sizes)
    check_finite([r.as_dict() for r in rows], "collectives")
    header = {
        "collective": collective,
        "algo": algo or "default",
        "topology": topo.name,
        "nodes": topo.nodes,
        "gpus": topo.world_size,
        "fidelity": fid,
    }
    setup = {
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "factor": factor,
        "gpus_per_node": topo.gpus_per_node,
        "gpu_model": topo.gpu.get("model"),
    }
    return CollectiveSweep(header, rows, setup)


def write_text(path: str | Path, text: str) -> Path:
    """`text` and a final newline, written atomically."""
    from sim.core.io import atomic_write_text

    atomic_write_text(path, text + "\n")
    return Path(path)


# -- topologies -------------------------------------------------------------------------------


def topology_presets() -> list[str]:
    """Names of the presets in topologies/ (or $MOESIM_TOPOLOGIES)."""
    from sim.hardware.topology.spec import list_presets

    return list_presets()


def load_topology(
    name: str | Path, nodes: int | None = None, limits: dict[str, int] | None = None
) -> Topology:
    """A preset name or topology YAML, with `nodes` nodes (None: the preset's); `limits`
    raises size limits (`sim.core.limits`: max_world)."""
    from sim.core.limits import DEFAULT, applied
    from sim.hardware.topology import Topology

    with applied(DEFAULT.merged(limits)):
        return Topology.load(name, nodes=nodes)


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema of an input: `config`, `topology` or `graph` (`moesim schema`)."""
    from sim.config.input_schemas import input_schema

    return input_schema(name)


def describe_topology(topo: Topology) -> str:
    """Link classes, node template and fabric as text (`moesim topology show`)."""
    from sim.hardware.topology.views import describe

    return describe(topo)


def draw_topology(topo: Topology, path: str | Path) -> Path:
    """The cluster graph drawn as plotly HTML at `path`."""
    from sim.analysis.draw import draw_topology as draw

    return draw(topo, path)


def routes_from_gpu0(topo: Topology) -> list[tuple[int, list[str]]]:
    """(destination rank, link names) from rank 0 to every other GPU of its node and the
    first GPU of the next node."""
    last = min(topo.world_size, topo.gpus_per_node + 1)
    return [(dst, [topo.link_name(lk) for lk in topo.route(0, dst)]) for dst in range(1, last)]
