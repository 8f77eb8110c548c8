"""Start-up stays cheap: `import sim` and building the `moesim` parser (the executor's
subcommands included) import none of the heavy libraries; the commands that need them import
them when they run, and a plain `moesim simulate` needs none of pandas, networkx, plotly,
pyarrow, tqdm or torch. A tiny one (benchmarks/startup.py's TINY) also loads only its own
strategy, builds only the validators of its config and topology (run again, none: it imports
no pydantic once they have passed, sim.core.inputcache) and only its command's parsers, and
leaves numpy.random, numpy.ma and pydantic's plugin scan out. What that costs in
CPU time is recorded by benchmarks/startup.py (tests do not time anything)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

import sim.cli as sim_cli
from benchmarks.startup import TINY

# what a tiny run (benchmarks/startup.py's TINY) does not load
NOT_FOR_A_TINY_RUN = (
    "numpy.random",
    "numpy.ma",
    "sim.hardware.calibration_schema",
    "sim.core.graph_schema",  # a graph file's TypedDicts (the constants: sim.core.kinds)
    "sim.config.run_schema",  # the optional sections' models (a config without any: RunCore)
    "sim.engine.equivalence",
    "sim.workload.routing.loads",
    "difflib",
    "sim.cli.plan",
    "sim.cli.sweep",
    "exec.cli",
)
HEAVY = ("pandas", "plotly", "networkx", "torch", "simpy", "yaml", "numpy")
NOT_FOR_A_RUN = ("pandas", "plotly", "networkx", "torch", "pyarrow", "tqdm", "matplotlib")
# nor, where its inputs passed their checks before (sim.core.inputcache), these
NOT_FOR_A_CHECKED_RUN = (
    "pydantic",
    "pydantic_core",
    "asyncio",
    "sim.core.schema",
    "sim.config.run_core",
    "sim.hardware.topology.schema",
    "sim.strategies.params",
)


def _imported_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))\n"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


@pytest.mark.parametrize(
    "code",
    [
        "import sim",
        "import sim.cli; sim.cli.build_parser()",
        "import sim.commands, exec.api, exec.cli",
    ],
)
def test_startup_imports_no_heavy_library(code):
    assert _imported_after(code) == []


def test_help_imports_no_heavy_library():
    code = (
        "import contextlib, io, sim.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    sim.cli.main(['--help'])"
    )
    assert _imported_after(code) == []


@pytest.mark.parametrize("as_json", [True, False])
def test_simulate_imports_no_dataframe_graph_or_plot_library(tmp_path, as_json):
    """The run, its summary, trace.csv and the Chrome trace come from the trace's columns
    (sim.analysis.trace.columns), routes inside a node from sim.hardware.topology.node_routes;
    and once its config and topology have passed their checks (the validated-input cache,
    here the test's own MOESIM_CACHE_DIR: tests/conftest.py), the run again imports no
    pydantic either (nor the input schemas, nor asyncio that pydantic imports)."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(json.dumps(TINY))
    argv = ["simulate", str(cfg), "--out", str(tmp_path / "out")] + ["--json"] * as_json
    code = (
        "import contextlib, io, sim.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert sim.cli.main({argv!r}) == 0"
    )
    assert _imported_after(code, NOT_FOR_A_RUN) == []
    assert (tmp_path / "out" / "trace.csv").is_file()
    assert (tmp_path / "out" / "trace.chrome.json").is_file()
    assert _imported_after(code, NOT_FOR_A_RUN + NOT_FOR_A_CHECKED_RUN) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("user", [None, "2"])
def test_simulate_loads_numpy_with_one_blas_thread_and_leaves_the_environment(tmp_path, user):
    """OpenBLAS's threads spin at import (CPU time for nothing: the simulator does no large
    linear algebra); the environment is put back, and a thread count the user set is kept."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(json.dumps(TINY))
    argv = ["simulate", str(cfg), "--json", "--out", str(tmp_path / "out")]
    code = (
        "import contextlib, io, os, sim.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert sim.cli.main({argv!r}) == 0\n"
        "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in sim_cli._BLAS_THREADS}
    if user is not None:
        env["OPENBLAS_NUM_THREADS"] = user
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode == 0, p.stderr
    threads, value = p.stdout.split()
    assert value == (user or "None")
    if user is None:
        assert threads == "1"


def test_tiny_simulate_builds_only_what_it_uses(tmp_path):
    """What issue 21 item 10 cut from a tiny run's start-up, kept cut: the other strategies
    (`sim.strategies.STRATEGY_LIST` is built on first use; a run reads STRATEGIES[name]),
    pydantic validators of input models it does not validate (`defer_build`; RunSpec without
    the sections the config leaves out: `run_spec`, here RunCore, and the sections' models
    not even made: sim.config.run_schema), numpy.random (flow tags), and
    pydantic's scan of installed distributions for plugins (`sim.cli._lean_runtime`); and
    the modules of what it does not do: numpy.ma (`np.unique`'s plain form loads it:
    sim.core.arrays), the other commands' parsers (`sim.cli.COMMAND_GROUPS`), the
    equivalence checks of a symmetry it does not try, the load measures of a skew it does
    not have and difflib (a refused key's "did you mean"). The CLI's GC and environment
    settings are undone when main() returns."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(json.dumps(TINY))
    argv = ["simulate", str(cfg), "--json", "--out", str(tmp_path / "out")]
    code = (
        "import contextlib, gc, io, json, os, sys, pydantic, sim.cli, sim.strategies\n"
        "before = gc.get_threshold()\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert sim.cli.main({argv!r}) == 0\n"
        "models, todo = [], [pydantic.BaseModel]\n"
        "while todo:\n"
        "    subclasses = todo.pop().__subclasses__()\n"
        "    models += subclasses\n"
        "    todo += subclasses\n"
        "built = {f'{m.__module__}.{m.__name__}' for m in models\n"
        "         if m.__dict__.get('__pydantic_complete__')}\n"
        "print(json.dumps({\n"
        "    'strategies': sorted(m for m in sys.modules if m.startswith('sim.strategies.')\n"
        "                         and m.split('.')[2] in sim.strategies._MODULES),\n"
        "    'listed': 'STRATEGY_LIST' in vars(sim.strategies),\n"
        "    'built': sorted(built),\n"
        f"    'loaded': [m for m in {NOT_FOR_A_TINY_RUN!r} if m in sys.modules],\n"
        "    'plugins_scanned': getattr(sys.modules.get('pydantic.plugin._loader'),\n"
        "                               '_plugins', None) is not None,\n"
        "    'restored': gc.get_threshold() == before\n"
        "                and 'PYDANTIC_DISABLE_PLUGINS' not in os.environ,\n"
        "}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    assert got == {
        "strategies": ["sim.strategies.sequential"],
        "listed": False,
        "built": ["sim.config.run_core.RunCore", "sim.hardware.topology.schema.TopologySpec"],
        "loaded": [],
        "plugins_scanned": False,
        "restored": True,
    }


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_a_command_line_builds_its_own_group_of_parsers_as_the_full_parser_does():
    """`moesim simulate ...` builds only demo/simulate/compare/graph (sim.cli.COMMAND_GROUPS):
    every subcommand is in one group, in `moesim --help`'s order, and each group's parsers
    print the same help and read the same line into the same arguments as the full one."""
    full = _subcommands(sim_cli.build_parser())
    groups = list(sim_cli.COMMAND_GROUPS.values())
    assert list(full) == [c for group in groups for c in group]
    for group in groups:
        own = _subcommands(sim_cli.build_parser(group[0]))
        assert list(own) == list(group)
        for c in group:
            assert own[c].format_help() == full[c].format_help()
    line = ["simulate", "run.yaml", "--json", "--out", "o", "--cost", "symmetry=off"]
    assert vars(sim_cli.build_parser("simulate").parse_args(line)) == vars(
        sim_cli.build_parser().parse_args(line)
    )
    assert sim_cli.build_parser("--help").format_help() == sim_cli.build_parser().format_help()
