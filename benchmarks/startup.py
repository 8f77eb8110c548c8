"""Start-up cost: CPU time (user + sys) of a fresh interpreter for each case, the median and
minimum of several runs after a warm-up run (bytecode cached):

- `python -c pass`, the floor;
- the libraries a run cannot do without, imported as a run imports them (LIBRARIES: numpy
  with one BLAS thread, pydantic's BaseModel, yaml, simpy), the floor of a `moesim simulate`
  that checks its inputs; and without pydantic (CHECKED_LIBRARIES), the floor of one whose
  inputs passed their checks before (the validated-input cache, `sim.core.inputcache`);
- `import sim`, `moesim --help`, `moesim --version`;
- `moesim simulate TINY --json --out DIR`: one node of dgx-h100, one small layer, sequential,
  forward only (TINY below), where start-up is nearly all of the command; its inputs checked
  before (the warm-up run fills the benchmark's own input cache, MOESIM_CACHE_DIR in its
  temporary directory), and once more with the cache off (MOESIM_NO_CACHE=1: a first run);
- `moesim simulate sim/configs/demo.yaml --json --out DIR`, for reference.

CPU time rather than wall time, so that other processes on a shared machine matter less (the
load average is recorded with the results). `--tree LABEL=DIR` (repeatable) measures
checkouts of the repository side by side, e.g. `--tree before=/tmp/before --tree after=.`
with `git worktree add /tmp/before HEAD~1`: their runs are interleaved, so they share the
machine's load. Each label's rows are kept in benchmarks/results/startup.{json,md} until it
is measured again. `--importtime` also records where the tiny run's imports go (`python -X
importtime`, wall time, each module's own time summed by package; median of 3), `--phases`
its CPU time step by step of start-up in one interpreter (PHASES). `--instructions` also
counts the instructions each case executes, once per tree (valgrind's cachegrind, `I refs`):
unlike CPU time, which varies by 10% or more with the load of a shared 2-core machine, the
count is the same run after run to ~0.1%, so a change of a few percent shows.

    python benchmarks/startup.py [--runs 9] [--tree before=DIR --tree after=.] [--importtime]
                                 [--phases] [--instructions] [--note LABEL=TEXT] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine  # noqa: E402

# One node of dgx-h100, one small MoE layer, sequential, forward: the command's own work is
# a few milliseconds, so what it costs is start-up. (tests/test_startup.py runs it too.)
TINY = {
    "topology": "dgx-h100",
    "nodes": 1,
    "model": {
        "batch": 1,
        "seq_len": 128,
        "model_dim": 256,
        "hidden_dim": 512,
        "experts_per_gpu": 1,
        "top_k": 1,
        "dtype": "bf16",
    },
    "strategy": {"name": "sequential"},
    "passes": ["fwd"],
}
# numpy, pydantic, yaml and simpy as a run imports them (numpy with one BLAS thread:
# sim.cli._single_threaded_blas), with nothing of moesim's: what start-up cannot go below
LIBRARIES = (
    "import os\nos.environ['OPENBLAS_NUM_THREADS'] = '1'\nimport numpy\n"
    "del os.environ['OPENBLAS_NUM_THREADS']\nimport yaml, simpy\nfrom pydantic import BaseModel\n"
)
# numpy, yaml and simpy: what a run whose inputs passed their checks before cannot go below
CHECKED_LIBRARIES = LIBRARIES.replace("\nfrom pydantic import BaseModel", "")
# what the `moesim` console script runs; and the same with the validated-input cache off
MOESIM = "import re, sys\nfrom sim.cli import main\nsys.exit(main())\n"
MOESIM_UNCACHED = "import os\nos.environ['MOESIM_NO_CACHE'] = '1'\n" + MOESIM


# The tiny run in one interpreter, its CPU time taken between the steps of start-up (numpy
# loaded the way `moesim` loads it); prints {step: seconds} as JSON. The pydantic steps are
# taken only in a tree whose run imports pydantic: one without the validated-input cache
# (sim.core.inputcache; with it, the warm-up run has checked the inputs).
PHASES = """
import json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
out, t = {}, 0.0
def step(name):
    global t
    now = cpu()
    out[name] = now - t
    t = now
step("interpreter start (site, encodings)")
import sim.cli, sim.commands
step("sim.cli, sim.commands")
getattr(sim.cli, "_single_threaded_blas", lambda: __import__("numpy"))()
step("numpy (one BLAS thread)")
import importlib.util
checks = importlib.util.find_spec("sim.core.inputcache") is None
if checks:
    import pydantic
    from pydantic import BaseModel, TypeAdapter
    step("pydantic")
import yaml, simpy
step("yaml, simpy")
if checks:
    import sim.core.schema, sim.hardware.topology.schema
    import sim.hardware.costs_schema
    step("topology and cost schema modules (pydantic models)")
import sim.strategies, sim.strategies.sequential, sim.engine.symmetric, sim.pipeline
import sim.analysis.trace
step("sim modules (strategies, engine, topology, trace)")
import sim.config
step("sim.config" + (": the run config's schema module" if checks else ""))
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    sim.cli.main(["simulate", sys.argv[1], "--json", "--out", sys.argv[2]])
step("the run: read, check, build, simulate, write")
print(json.dumps(out))
"""


def phases(tiny: Path, out: Path, root: Path, runs: int) -> list[dict]:
    """CPU seconds of each step of the tiny run's start-up (PHASES): median and min."""
    got: dict[str, list[float]] = {}
    for _ in range(runs):
        p = subprocess.run(
            [sys.executable, "-c", PHASES, str(tiny), str(out)],
            cwd=root,
            env=environment(root),
            check=True,
            capture_output=True,
            text=True,
        )
        for k, v in json.loads(p.stdout.splitlines()[-1]).items():
            got.setdefault(k, []).append(v)
    return [
        {"step": k, "median_cpu_s": statistics.median(v), "min_cpu_s": min(v)}
        for k, v in got.items()
    ]


def cases(tmp: Path) -> dict[str, list[str]]:
    tiny = tmp / "tiny.yaml"
    tiny.write_text(json.dumps(TINY))  # JSON is YAML
    return {
        "python -c pass": ["-c", "pass"],
        "libraries (numpy, pydantic, yaml, simpy)": ["-c", LIBRARIES],
        "libraries (numpy, yaml, simpy)": ["-c", CHECKED_LIBRARIES],
        "import sim": ["-c", "import sim"],
        "moesim --help": ["-c", MOESIM, "--help"],
        "moesim --version": ["-c", MOESIM, "--version"],
        "moesim simulate tiny.yaml --json": [
            "-c",
            MOESIM,
            "simulate",
            str(tiny),
            "--json",
            "--out",
            str(tmp / "tiny"),
        ],
        "moesim simulate tiny.yaml --json, input cache off": [
            "-c",
            MOESIM_UNCACHED,
            "simulate",
            str(tiny),
            "--json",
            "--out",
            str(tmp / "tiny-uncached"),
        ],
        "moesim simulate demo.yaml --json": [
            "-c",
            MOESIM,
            "simulate",
            "sim/configs/demo.yaml",
            "--json",
            "--out",
            str(tmp / "demo"),
        ],
    }


def environment(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the warm-up run caches the bytecode
    return env


def cpu_seconds(args: list[str], root: Path) -> float:
    """user + sys CPU seconds of one child interpreter running `args` in `root`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, *args], cwd=root, env=environment(root), check=True, capture_output=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def instructions(args: list[str], root: Path) -> int:
    """Instructions (valgrind's `I refs`) of one child interpreter running `args` in `root`."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind")
    p = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
        + [sys.executable, *args],
        cwd=root,
        env=environment(root),
        check=True,
        capture_output=True,
        text=True,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", p.stderr)
    assert found, p.stderr[-2000:]
    return int(found.group(1).replace(",", ""))


def import_breakdown(args: list[str], root: Path, runs: int = 3) -> list[dict]:
    """The child's imports by package (sim by subpackage): each module's own time summed,
    in ms, the median of `runs` runs."""
    totals: dict[str, list[float]] = {}
    for _ in range(runs):
        p = subprocess.run(
            [sys.executable, "-X", "importtime", *args],
            cwd=root,
            env=environment(root),
            check=True,
            capture_output=True,
            text=True,
        )
        total: dict[str, float] = {}
        for line in p.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, _, name = line[len("import time:") :].split("|")
            parts = name.strip().split(".")
            key = ".".join(parts[:2]) if parts[0] in ("sim", "exec") else parts[0]
            total[key] = total.get(key, 0.0) + int(self_us) / 1e3
        for k, v in total.items():
            totals.setdefault(k, []).append(v)
    rows = [
        {"package": k, "self_ms": round(statistics.median(v + [0.0] * (runs - len(v))), 1)}
        for k, v in totals.items()
    ]
    return sorted(rows, key=lambda r: -r["self_ms"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9, help="runs per case; the median is kept")
    ap.add_argument(
        "--tree",
        action="append",
        metavar="LABEL=DIR",
        help="a checkout to measure and the label of its rows (repeatable; default after=.)",
    )
    ap.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="LABEL=TEXT",
        help="what a label's tree is (shown instead of its path)",
    )
    ap.add_argument("--importtime", action="store_true", help="record the tiny run's imports")
    ap.add_argument("--phases", action="store_true", help="record the tiny run's CPU by step")
    ap.add_argument(
        "--instructions", action="store_true", help="count each case's instructions (valgrind)"
    )
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    trees = {}
    for item in a.tree or [f"after={ROOT}"]:
        label, _, root = item.partition("=")
        trees[label] = Path(root or ".").resolve()
    notes = dict(n.partition("=")[::2] for n in a.note)
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # the runs' own validated-input cache (never the user's), filled by the warm-up runs
        os.environ["MOESIM_CACHE_DIR"] = str(Path(tmp) / "input-cache")
        todo = cases(Path(tmp))
        for root in trees.values():  # warm-up: file cache and .pyc files
            for args in todo.values():
                cpu_seconds(args, root)
        load_before = os.getloadavg()[0]
        for _ in range(a.runs):  # interleaved: every tree sees the same load
            for name, args in todo.items():
                for label, root in trees.items():
                    times.setdefault((label, name), []).append(cpu_seconds(args, root))
        load = (load_before + os.getloadavg()[0]) / 2
        counts = {
            (label, name): instructions(args, root)
            for name, args in (todo.items() if a.instructions else [])
            for label, root in trees.items()
        }
        imports = (
            {
                label: import_breakdown(todo["moesim simulate tiny.yaml --json"], root)
                for label, root in trees.items()
            }
            if a.importtime
            else {}
        )
        steps = (
            {
                label: phases(Path(tmp) / "tiny.yaml", Path(tmp) / "phases", root, a.runs)
                for label, root in trees.items()
            }
            if a.phases
            else {}
        )
    results = {}
    for label, root in trees.items():
        rows = []
        for name in todo:
            t = times[label, name]
            rows.append({"case": name, "median_cpu_s": statistics.median(t), "min_cpu_s": min(t)})
            if (label, name) in counts:
                rows[-1]["instructions"] = counts[label, name]
            print(
                f"{label:8s} {name:42s} median {rows[-1]['median_cpu_s']:.3f} s CPU  "
                f"min {min(t):.3f} s"
                + (f"  {counts[label, name] / 1e6:,.0f} M instr." if counts else "")
            )
        for r in imports.get(label, [])[:15]:
            print(f"  {r['package']:24s} {r['self_ms']:7.1f} ms")
        for r in steps.get(label, []):
            print(f"  {r['step']:48s} {r['median_cpu_s'] * 1e3:6.0f} ms")
        results[label] = (
            {
                "machine": machine("CPUs"),
                "runs": a.runs,
                "load_average_1min": round(load, 2),
                "root": notes.get(label) or ("this checkout" if root == ROOT else str(root)),
                "rows": rows,
            }
            | ({"imports_tiny": imports[label]} if label in imports else {})
            | ({"steps_tiny": steps[label]} if label in steps else {})
        )
    if a.no_write:
        return
    path = RESULTS / "startup.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    labels = old.get("labels", {}) if isinstance(old, dict) else {}
    write(labels | results)


# where the hand-written part of startup.md starts: kept as it is when the tables are written
NOTES = "## Notes"


def write(labels: dict) -> None:
    from sim.core.io import atomic_write_text

    RESULTS.mkdir(exist_ok=True)
    atomic_write_text(RESULTS / "startup.json", json.dumps({"labels": labels}, indent=2) + "\n")
    names = list(labels)
    case_names = list(dict.fromkeys(r["case"] for lab in labels.values() for r in lab["rows"]))
    lines = [
        "# Start-up: CPU time of `import sim`, `moesim --help` and a tiny `moesim simulate`",
        "",
        "User + sys CPU seconds of a fresh interpreter, with bytecode cached: median (min) of "
        "each label's runs (the machine is shared, so the minimum is shown too). The tiny run "
        "is one small layer on one dgx-h100 node, sequential, forward "
        "(`benchmarks/startup.py` TINY). Generated by `python benchmarks/startup.py "
        "[--tree LABEL=DIR ...] [--importtime] [--phases] [--instructions]`; the trees of one "
        "command are measured interleaved, under the same load. The `moesim` runs have a "
        "validated-input cache of their own (`sim.core.inputcache`, in the benchmark's "
        "temporary directory), filled by the warm-up runs where the tree has one, so the "
        "tiny run's inputs have passed their checks before; the row `input cache off` is the "
        "tiny run that checks them (MOESIM_NO_CACHE=1, as a first run does). The libraries' "
        "rows are the floors of a run that checks its inputs (numpy, pydantic, yaml and simpy "
        "imported as a run imports them) and of one whose inputs were checked before (no "
        "pydantic): what a tiny run costs above them is moesim's own.",
        "",
    ]
    for n in names:
        lab = labels[n]
        lines.append(
            f"- **{n}**: {lab['machine']}, {lab['runs']} runs, 1-min load average "
            f"{lab['load_average_1min']} ({lab['root']})"
        )
    lines += ["", "| case | " + " | ".join(f"{n} (s)" for n in names) + " |"]
    lines.append("|---|" + "---:|" * len(names))
    for c in case_names:
        cells = []
        for n in names:
            r = next((r for r in labels[n]["rows"] if r["case"] == c), None)
            cells.append(f"{r['median_cpu_s']:.3f} ({r['min_cpu_s']:.3f})" if r else "")
        lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    counted = [n for n in names if any("instructions" in r for r in labels[n]["rows"])]
    if counted:
        lines += [
            "",
            "Instructions executed, millions (valgrind's cachegrind, `I refs`, one run each, "
            "bytecode cached: the same run after run to ~0.1%, whatever the load):",
            "",
            "| case | " + " | ".join(counted) + " |",
            "|---|" + "---:|" * len(counted),
        ]
        for c in case_names:
            cells = []
            for n in counted:
                r = next((r for r in labels[n]["rows"] if r["case"] == c), None)
                cells.append(f"{r['instructions'] / 1e6:,.0f}" if r and "instructions" in r else "")
            lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    for n in names:
        steps = labels[n].get("steps_tiny")
        if not steps:
            continue
        total = sum(r["median_cpu_s"] for r in steps)
        lines += [
            "",
            f"The tiny run's CPU time by step of its start-up ({n}; one interpreter, the steps "
            f"in this order; medians sum to {total:.3f} s):",
            "",
            "| step | median CPU (ms) | min (ms) |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {r['step']} | {r['median_cpu_s'] * 1e3:.0f} | {r['min_cpu_s'] * 1e3:.0f} |"
            for r in steps
        ]
    for n in names:
        imports = labels[n].get("imports_tiny")
        if not imports:
            continue
        lines += [
            "",
            f"Where the tiny run's imports go ({n}; `python -X importtime`, wall ms, each "
            "module's own time summed by package, sim by subpackage; top 15):",
            "",
            "| package | ms |",
            "|---|---:|",
        ]
        lines += [f"| `{r['package']}` | {r['self_ms']:.1f} |" for r in imports[:15]]
    md = RESULTS / "startup.md"
    old = md.read_text() if md.exists() else ""
    if NOTES in old:  # the written notes are kept
        lines += ["", old[old.index(NOTES) :].rstrip("\n")]
    atomic_write_text(md, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
