"""`moesim`: simulate MoE layers, inspect topologies, export task graphs.

The parser and the error boundary; each group of subcommands is a module of this package
(`simulate`: demo, simulate, compare, graph; `cluster`: topology, collectives; `studies`:
replay, whatif; `predict`, `plan`, `report`, `sweep`; `options`: what they share) that parses and
prints only, and `exec.cli` adds the executor's.

User mistakes (bad config, bad graph, impossible topology, simulated deadlock) print
`moesim: error: ...` (one line; a deadlock adds its wait-for cycle, at most 8 lines) and exit
2, without a traceback; outputs are written as sets swapped in whole (`sim.core.io`), so
nothing is left half-written and a failed run keeps the previous set.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from sim.core.errors import ConfigError, MoesimError
from sim.core.io import OutputError


def cmd_schema(a: argparse.Namespace) -> int:
    from sim import commands

    print(json.dumps(commands.schema(a.input), indent=2))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line, like every other error of the command (the
    usage it would print first is one `--help` away)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # subcommands too: `--str` is not `--strategy`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"moesim: error: {self.prog}: {message} (see {self.prog} --help)\n")


# The subcommands of each group (the module whose `add_parsers(sub)` adds them), in `moesim
# --help`'s order. A command line naming one of them builds that group's parsers only:
# building all ~150 options of every group (and importing their modules) costs ~5 ms, a
# fiftieth of a small `moesim simulate`, for parsers that cannot match. (tests/test_startup.py
# holds each group's parsers to the full parser's.)
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "sim.cli.simulate": ("demo", "simulate", "compare", "graph"),
    "sim.cli.cluster": ("topology", "collectives"),
    "sim.cli.studies": ("replay", "whatif"),
    "sim.cli.predict": ("predict",),  # whole training steps of a table of runs
    "sim.cli.plan": ("plan",),  # the fastest layout of a model on a cluster
    "sim.cli.report": ("report",),
    "sim.cli.sweep": ("sweep",),
    "sim.cli": ("schema",),  # this module's own
    "exec.cli": ("exec", "calibrate", "validate"),  # torch only when they run
}
_COMMANDS = frozenset(c for group in COMMAND_GROUPS.values() for c in group)
EPILOG = (
    "Configs and topologies that passed their checks are remembered (sim/core/inputcache.py) "
    "in $MOESIM_CACHE_DIR, else $XDG_CACHE_HOME/moesim, else ~/.cache/moesim, keyed by the "
    "input and the checking code, so that a command run again on them starts faster; remove "
    "the directory to clear it, MOESIM_NO_CACHE=1 turns it off."
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `moesim` parser; given a `command` of COMMAND_GROUPS, with only its group's
    subcommands (which parse that command's line as the full parser does)."""
    from sim import __version__

    def wanted(module: str) -> bool:
        return command not in _COMMANDS or command in COMMAND_GROUPS[module]

    p = _Parser(prog="moesim", description=__doc__.splitlines()[0], epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"moesim {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for module in COMMAND_GROUPS:
        if not wanted(module):
            continue
        if module == "sim.cli":
            sc = sub.add_parser("schema", help="print the JSON Schema of an input, for editors")
            sc.add_argument(
                "input", choices=["config", "topology", "graph", "calibration", "sweep"]
            )
            sc.set_defaults(fn=cmd_schema)
        else:
            importlib.import_module(module).add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The error boundary: every user mistake and every refused file or path becomes one
    line on stderr and exit 2, never a traceback."""
    undo = _lean_runtime()
    try:
        return _command(argv)
    finally:
        undo()


def _command(argv: list[str] | None) -> int:
    import signal

    # a `kill` ends a run as Ctrl-C does, so atomic writers remove their temporary files
    signal.signal(signal.SIGTERM, _interrupt)
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
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


# Young-generation collections of the cyclic GC every this many allocations during a command
# (CPython's default is 700): a small run otherwise spends ~10% of its CPU scanning the modules
# and schemas it has just loaded, which live to its end anyway; the garbage a large run leaves
# pending stays a few MB.
_GC_YOUNG = 10_000
_PLUGINS_OFF = "PYDANTIC_DISABLE_PLUGINS"
_freeze_at_exit: list[bool] = []  # atexit.register(gc.freeze) done (once per process)


def _lean_runtime() -> Callable[[], None]:
    """What a command's process skips, undone by the function returned (main() is also called
    in-process, by tests and scripts):

    - the GC's young collections 14 times less often (`_GC_YOUNG`), and, at interpreter
      exit, its final collection over everything the command loaded (~20 ms after a small
      run): it is frozen first (`gc.freeze`), as the process is about to drop it anyway;
    - pydantic's plugin discovery, a scan of every installed distribution's entry points
      (~15 ms) at its first schema, unless the environment names plugins itself: the
      simulator's input schemas are not what such plugins (observability) are for;
    - checking an input that passed its checks before: the validated-input cache is on for
      the command (`sim.core.inputcache`), so that a config and topology run again import no
      pydantic."""
    import atexit
    import gc

    from sim.core import inputcache

    if not _freeze_at_exit:
        atexit.register(gc.freeze)
        _freeze_at_exit.append(True)
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], _GC_YOUNG), *threshold[1:])
    set_plugins = _PLUGINS_OFF not in os.environ
    if set_plugins:
        os.environ[_PLUGINS_OFF] = "__all__"
    cache_off = inputcache.enable()

    def undo() -> None:
        gc.set_threshold(*threshold)
        if set_plugins:
            os.environ.pop(_PLUGINS_OFF, None)
        cache_off()

    return undo


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
