"""`moesim demo`, `simulate`, `compare` and `graph`: a run config (or a task graph) built and
simulated, parsing and printing only (sim.commands does the work)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from sim.cli.options import limit_opt, limits, refuse
from sim.core.errors import ConfigError
from sim.core.io import check_output_dir, check_output_file

# Where `moesim demo` writes by default: a fixed place outside any checkout (the README's
# first command must not leave files in the clone it is run from).
_DEMO_OUT = str(Path(tempfile.gettempdir()) / "moesim-demo")

# `sim.commands` is imported inside the commands: `moesim --help` then loads argparse and nothing
# else of note (the API's own imports are lazy too, but its dataclasses cost start-up time).


def _emit(summary: dict[str, Any], as_json: bool) -> None:
    from sim import commands

    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(commands.format_summary(summary))
        for name, path in summary.get("files", {}).items():
            print(f"  wrote {name:13s} {path}")


def cmd_demo(a: argparse.Namespace) -> int:
    from sim import commands

    summary = commands.simulate_command(commands.demo_config(), Path(a.out))
    _emit(summary, a.json)
    if not a.json:
        print("  open the Chrome trace in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _cost_overrides(a: argparse.Namespace) -> dict[str, Any]:
    from sim import commands

    pairs = (
        ("network", a.network),
        ("fidelity", a.fidelity),
        ("compute", a.compute),
        ("calibration", a.calibration),
    )  # `--cost KEY=VALUE`: any other costs: field (finish_rtol, symmetry, ...)
    return {**commands.parse_params(a.cost, "--cost"), **{k: v for k, v in pairs if v}}


def _config(a: argparse.Namespace):
    """The run config named on the command line, with the run options applied."""
    from sim import commands

    return commands.configure(
        a.config,
        strategy=a.strategy,
        params=commands.parse_params(a.param),
        topology=a.topology,
        nodes=a.nodes,
        costs=_cost_overrides(a),
        limits=limits(a),
    )


def cmd_simulate(a: argparse.Namespace) -> int:
    from sim import commands

    if str(a.config).endswith(".json"):  # a task graph: replayed as it is
        refuse(
            a,
            {"strategy": "--strategy", "param": "--param"},
            "to a task graph (it is replayed as it is; they apply to a run config)",
        )
        if not a.topology:
            raise ConfigError("simulating a graph JSON needs --topology")
        res = commands.replay_graph(
            a.config, a.topology, a.nodes, _cost_overrides(a), a.out, limits=limits(a)
        )
        _emit(res.summary, a.json)
        return 0
    cfg = _config(a)
    out = a.out or cfg.output.get("dir")  # files only where asked for
    _emit(commands.simulate_command(cfg, None if out is None else Path(out)), a.json)
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from sim import commands

    refuse(  # one entry per strategy carries its own parameters: nothing to guess
        a,
        {"strategy": "--strategy", "param": "--param"},
        "to compare (name each strategy and its parameters in --strategies, e.g. "
        "--strategies sequential pipelined:degree=4)",
    )
    if a.out is not None:  # an unusable --out fails before the simulations, not after
        check_output_dir(a.out)
    res = commands.compare_strategies(_config(a), a.strategies, a.out)
    if a.json:
        print(res.table.to_json(orient="records", indent=2))
    else:
        print(res.title)
        print(res.markdown())
        for name, path in res.files.items():
            print(f"  wrote {name:9s} {path}")
    return 0


def cmd_graph(a: argparse.Namespace) -> int:
    from sim import commands

    check_output_file(a.output, "-o/--output")
    graph = commands.export_graph(_config(a), a.output)
    print(f"wrote {a.output}: {len(graph)} tasks on {graph.world_size} ranks")
    return 0


def _run_opts(sp: argparse.ArgumentParser) -> None:
    """The run options of simulate, compare and graph: overrides of the config."""
    sp.add_argument("--strategy", help="override strategy.name")
    sp.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="override a strategy parameter (repeatable), e.g. degree=8",
    )
    sp.add_argument("--topology", help="override the topology preset or YAML path")
    sp.add_argument("--nodes", type=int, help="override the node count")
    sp.add_argument("--network", choices=["flow", "collective"], help="communication model")
    sp.add_argument("--fidelity", choices=["auto", "flow", "bundled"], help="flow fidelity")
    sp.add_argument("--compute", choices=["roofline", "alpha_beta"], help="compute model")
    sp.add_argument(
        "--calibration",
        metavar="FILE",
        help="calibration YAML from `moesim calibrate` (costs.calibration)",
    )
    sp.add_argument(
        "--cost",
        action="append",
        metavar="KEY=VALUE",
        help="override a costs: field (repeatable), e.g. finish_rtol=1e-3",
    )
    limit_opt(sp)


def add_parsers(sub: Any) -> None:
    """`moesim demo`, `simulate`, `compare` and `graph`."""
    d = sub.add_parser("demo", help="simulate the embedded demo config and write a Chrome trace")
    d.add_argument(
        "--out",
        default=_DEMO_OUT,
        help=f"output directory (default {_DEMO_OUT}: never inside the checkout it runs from)",
    )
    d.add_argument("--json", action="store_true", help="print the summary as JSON")
    d.set_defaults(fn=cmd_demo)

    s = sub.add_parser("simulate", help="simulate a run config (YAML) or a task graph (JSON)")
    s.add_argument("config", help="run config YAML, or task graph JSON (needs --topology)")
    s.add_argument(
        "--out",
        help="output directory (default: the config's output.dir; none: nothing is written)",
    )
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    _run_opts(s)
    s.set_defaults(fn=cmd_simulate)

    cp = sub.add_parser("compare", help="simulate several strategies on one config; table+chart")
    cp.add_argument("config")
    cp.add_argument(
        "--strategies",
        nargs="+",
        required=True,
        metavar="NAME[:k=v,...]",
        help="e.g. sequential pipelined:degree=4 pipemoe",
    )
    cp.add_argument("--out", metavar="DIR", help="also write results.csv, compare.md/.html")
    cp.add_argument("--json", action="store_true")
    _run_opts(cp)
    cp.set_defaults(fn=cmd_compare)

    g = sub.add_parser("graph", help="build a config's task graph and save it as JSON")
    g.add_argument("config")
    g.add_argument("-o", "--output", required=True, help="task graph JSON file to write")
    _run_opts(g)
    g.set_defaults(fn=cmd_graph)
