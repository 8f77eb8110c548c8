"""`moesim`: simulate MoE layers, inspect topologies, export task graphs.

User mistakes (bad config, bad graph, impossible topology, simulated deadlock) print
`moesim: error: ...` (one line; a deadlock adds its wait-for cycle, at most 8 lines) and exit
2, without a traceback; outputs are written as sets swapped in whole (`sim.core.io`), so
nothing is left half-written and a failed run keeps the previous set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from sim.cli.options import check_output_file as _check_output_file
from sim.cli.options import limit_opt as _limit_opt
from sim.cli.options import limits as _limits
from sim.cli.options import refuse as _refuse
from sim.core.errors import ConfigError, MoesimError
from sim.core.io import OutputError, check_output_dir

# Where `moesim demo` writes by default: a fixed place outside any checkout (the README's
# first command must not leave files in the clone it is run from).
_DEMO_OUT = str(Path(tempfile.gettempdir()) / "moesim-demo")

# `sim.api` is imported inside the commands: `moesim --help` then loads argparse and nothing
# else of note (the API's own imports are lazy too, but its dataclasses cost start-up time).


def _emit(summary: dict[str, Any], as_json: bool) -> None:
    from sim import api

    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(api.format_summary(summary))
        for name, path in summary.get("files", {}).items():
            print(f"  wrote {name:13s} {path}")


def cmd_demo(a: argparse.Namespace) -> int:
    from sim import api

    summary = api.run_config(api.demo_config(), Path(a.out))
    _emit(summary, a.json)
    if not a.json:
        print("  open the Chrome trace in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _cost_overrides(a: argparse.Namespace) -> dict[str, Any]:
    from sim import api

    pairs = (
        ("network", a.network),
        ("fidelity", a.fidelity),
        ("compute", a.compute),
        ("calibration", a.calibration),
    )  # `--cost KEY=VALUE`: any other costs: field (finish_rtol, symmetry, ...)
    return {**api.parse_params(a.cost, "--cost"), **{k: v for k, v in pairs if v}}


def _config(a: argparse.Namespace):
    """The run config named on the command line, with the run options applied."""
    from sim import api

    return api.configure(
        a.config,
        strategy=a.strategy,
        params=api.parse_params(a.param),
        topology=a.topology,
        nodes=a.nodes,
        costs=_cost_overrides(a),
        limits=_limits(a),
    )


def cmd_simulate(a: argparse.Namespace) -> int:
    from sim import api

    if str(a.config).endswith(".json"):  # a task graph: replayed as it is
        _refuse(
            a,
            {"strategy": "--strategy", "param": "--param"},
            "to a task graph (it is replayed as it is; they apply to a run config)",
        )
        if not a.topology:
            raise ConfigError("simulating a graph JSON needs --topology")
        res = api.replay(
            a.config, a.topology, a.nodes, _cost_overrides(a), a.out, limits=_limits(a)
        )
        _emit(res.summary, a.json)
        return 0
    cfg = _config(a)
    out = a.out or cfg.output.get("dir")  # files only where asked for
    _emit(api.run_config(cfg, None if out is None else Path(out)), a.json)
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from sim import api

    _refuse(  # one entry per strategy carries its own parameters: nothing to guess
        a,
        {"strategy": "--strategy", "param": "--param"},
        "to compare (name each strategy and its parameters in --strategies, e.g. "
        "--strategies sequential pipelined:degree=4)",
    )
    if a.out is not None:  # an unusable --out fails before the simulations, not after
        check_output_dir(a.out)
    res = api.compare(_config(a), a.strategies, a.out)
    if a.json:
        print(res.table.to_json(orient="records", indent=2))
    else:
        print(res.title)
        print(res.markdown())
        for name, path in res.files.items():
            print(f"  wrote {name:9s} {path}")
    return 0


def cmd_graph(a: argparse.Namespace) -> int:
    from sim import api

    _check_output_file(a.output, "-o/--output")
    graph = api.export_graph(_config(a), a.output)
    print(f"wrote {a.output}: {len(graph)} tasks on {graph.world_size} ranks")
    return 0


def cmd_schema(a: argparse.Namespace) -> int:
    from sim import api

    print(json.dumps(api.schema(a.input), indent=2))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line, like every other error of the command (the
    usage it would print first is one `--help` away)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # subcommands too: `--str` is not `--strategy`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"moesim: error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from sim import __version__

    p = _Parser(prog="moesim", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"moesim {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="simulate the embedded demo config and write a Chrome trace")
    d.add_argument(
        "--out",
        default=_DEMO_OUT,
        help=f"output directory (default {_DEMO_OUT}: never inside the checkout it runs from)",
    )
    d.add_argument("--json", action="store_true", help="print the summary as JSON")
    d.set_defaults(fn=cmd_demo)

    def run_opts(sp: argparse.ArgumentParser) -> None:
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
        _limit_opt(sp)

    s = sub.add_parser("simulate", help="simulate a run config (YAML) or a task graph (JSON)")
    s.add_argument("config", help="run config YAML, or task graph JSON (needs --topology)")
    s.add_argument(
        "--out",
        help="output directory (default: the config's output.dir; none: nothing is written)",
    )
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    run_opts(s)
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
    run_opts(cp)
    cp.set_defaults(fn=cmd_compare)

    g = sub.add_parser("graph", help="build a config's task graph and save it as JSON")
    g.add_argument("config")
    g.add_argument("-o", "--output", required=True, help="task graph JSON file to write")
    run_opts(g)
    g.set_defaults(fn=cmd_graph)

    from sim.cli.cluster import add_parsers as add_cluster_parsers

    add_cluster_parsers(sub)  # topology, collectives
    from sim.cli.studies import add_parsers as add_study_parsers

    add_study_parsers(sub)  # replay, whatif
    from sim.cli.predict import add_parsers as add_predict_parser

    add_predict_parser(sub)  # predict (whole training steps of a table of runs)
    from sim.cli.plan import add_parsers as add_plan_parser

    add_plan_parser(sub)  # plan (the fastest layout of a model on a cluster)
    from sim.cli.report import add_parsers as add_report_parser

    add_report_parser(sub)
    from sim.cli.sweep import add_parsers as add_sweep_parsers

    add_sweep_parsers(sub)  # sweep

    sc = sub.add_parser("schema", help="print the JSON Schema of an input, for editors")
    sc.add_argument("input", choices=["config", "topology", "graph", "calibration", "sweep"])
    sc.set_defaults(fn=cmd_schema)

    from exec.cli import add_parsers  # exec, calibrate, validate; torch only when they run

    add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The error boundary: every user mistake and every refused file or path becomes one
    line on stderr and exit 2, never a traceback."""
    import signal

    # a `kill` ends a run as Ctrl-C does, so atomic writers remove their temporary files
    signal.signal(signal.SIGTERM, _interrupt)
    args = build_parser().parse_args(argv)
    from sim.core import progress  # bars on stderr for a person; none when a program reads --json

    progress.set_enabled(False if getattr(args, "json", False) else None)
    if args.fn.__module__.startswith("sim.") and args.cmd != "schema":  # the simulator's
        _single_threaded_blas()
    try:
        _finite_options(args)
        return args.fn(args)
    except MoesimError as e:
        return _fail(str(e))
    except UnicodeDecodeError as e:
        return _fail(f"not UTF-8 text ({e.reason} at byte {e.start})")
    except RecursionError:
        return _fail("input nested too deeply")
    except MemoryError:
        return _fail("out of memory (an input or a size limit too large?)")
    except BrokenPipeError:  # `moesim ... | head`: the reader left; nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit-time flush
        return 0
    except OutputError as e:  # names the option and the path asked for (not a temp name)
        return _fail(str(e))
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        return _fail(f"{e.strerror or e}{where}")
    except KeyboardInterrupt:
        print("moesim: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # YAML and other parser errors raised past a loader
        if type(e).__module__.startswith("yaml"):
            return _fail(f"not valid YAML ({' '.join(str(e).split())})")
        raise


# what OpenBLAS reads for its thread count, in its order
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def _single_threaded_blas() -> None:
    """numpy loaded with one BLAS thread. OpenBLAS starts a thread per core when numpy is
    imported, and they spin: ~0.1 s of CPU on 2 cores (more on more), a fifth of a small
    `moesim simulate`, while the simulator does no large linear algebra (its least-squares
    fits are a few rows). A thread count the user set is kept; the environment is restored
    at once, so processes started later (executor ranks, sweep workers' own children) see
    it as it was."""
    if "numpy" in sys.modules or any(k in os.environ for k in _BLAS_THREADS):
        return
    os.environ[_BLAS_THREADS[0]] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ[_BLAS_THREADS[0]]


def _finite_options(args: argparse.Namespace) -> None:
    """No option takes NaN or infinity (argparse's float() reads both): `--timeout nan`
    would otherwise reach a timer, `--oversubscription inf` a fabric."""
    import math

    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag}: expected a finite number, got {value}")


def _fail(message: str) -> int:
    print(f"moesim: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
