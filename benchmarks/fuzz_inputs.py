"""Thousands of bad inputs through `moesim`: how many print a traceback, hang, or are accepted
although they are nonsense, and how many are refused cleanly (exit 2, one line).

The cases are mutations of valid run configs, topologies and task graphs (wrong types, NaN and
infinity, negative and zero numbers, huge numbers, fractions for integers, unknown and
misspelled keys, deleted keys, documents that are not mappings), hostile files (FIFOs,
directories, devices, binary, UTF-16, alias bombs, deep nesting, huge and empty files) and
command lines that make no sense; `tests/bad_inputs.py` holds them and says which must be
refused. Each runs in-process (`sim.cli.main`) in a worker process, with an alarm and a hard
timeout (a hung worker is killed and replaced) and an address-space limit, so a MemoryError
shows as such instead of taking the machine down.

    python benchmarks/fuzz_inputs.py [--cases 2400] [--workers 2] [--seed 0]
    python benchmarks/fuzz_inputs.py --base /path/to/older/tree --label before \
        --describe "main at 54b7492, before the schemas of issue 11"

Results (counts per verdict and per input family, every case that is not a clean rejection or
a valid acceptance) go to benchmarks/results/fuzz_inputs.{json,md}; each --label is kept.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_model  # noqa: E402
from tests import bad_inputs as B  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
VERDICTS = (
    "traceback",
    "hang",
    "nonsense_accepted",
    "nonfinite_output",
    "memory_error",
    "messy_rejection",
    "clean_rejection",
    "accepted",
)
BAD = VERDICTS[:6]


# -- the corpus -------------------------------------------------------------------------------


def corpus(n: int, seed: int) -> list[tuple[str, B.Case]]:
    """(family, case): about `n` mutations spread over the input families, then every
    hostile file, command line and executor case."""
    rng = random.Random(seed)
    families: list[tuple[str, Any, Any, float]] = [
        (f"config:{name}", doc, B.config_case, 0.4 / len(B.CONFIGS))
        for name, doc in B.CONFIGS.items()
    ]
    topo = B.seed_topology()
    families += [
        ("topology", topo, B.topology_case, 0.15),
        ("topology:show", topo, lambda nm, d, e: B.topology_case(nm, d, e, show=True), 0.1),
        ("graph", B.seed_graph(), B.graph_case, 0.2),
        ("graph:built", _built_graph(), B.graph_case, 0.15),
        ("calibration", B.seed_calibration(), B.calibration_case, 0.1),
    ]
    out: list[tuple[str, B.Case]] = []
    for family, doc, make, share in families:
        all_paths = B.paths(doc)
        want, tries = round(n * share), 0
        seen: set[tuple[Any, str, int]] = set()
        while want > 0 and tries < 50 * n:
            tries += 1
            path, op, variant = rng.choice(all_paths), rng.choice(B.OPS), rng.randrange(4)
            if (path, op, variant) in seen:
                continue
            seen.add((path, op, variant))
            m = B.mutate(doc, path, op, variant)
            if m is None:
                continue
            name = f"{family}/{op}@{B.dotted(path) or '(doc)'}#{variant}"
            out.append((family, make(name, m.doc, m.expect)))
            want -= 1
    out += [("hostile", c) for c in B.hostile_cases()]
    out += [("extreme", c) for c in B.extreme_cases()]
    out += [("faults", c) for c in B.fault_cases()]
    out += [("exec", c) for c in B.exec_cases()]
    out += [("predict", c) for c in B.predict_cases()]
    out += [("plan", c) for c in B.plan_cases()]
    return out


def _built_graph() -> dict[str, Any]:
    """A strategy's own graph (8 ranks, forward and backward), as `moesim graph` writes it."""
    from sim import commands

    return commands.build_graph(B.CONFIGS["pipelined"]).to_dict()


# -- running ----------------------------------------------------------------------------------


def _worker(conn: Any, base: str | None, mem_gib: float, timeout_s: float) -> None:
    import resource

    if base:  # forget the modules this tree's parent process imported (the built graph)
        for name in [m for m in sys.modules if m.split(".")[0] in ("sim", "exec")]:
            del sys.modules[name]
        sys.path.insert(0, base)
    limit = int(mem_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        job = conn.recv()
        if job is None:
            return
        idx, case, where = job
        t0 = time.perf_counter()
        try:
            o = B.run_case(case, Path(where), timeout_s)
            verdict = o.verdict(case.expect)
            detail = o.raised or (o.stderr.strip().splitlines() or [""])[-1]
            if verdict == "hang":
                detail = f"alarm after {timeout_s:.0f} s"
            elif verdict in ("nonsense_accepted", "accepted", "nonfinite_output"):
                detail = o.stdout.strip()[:200].replace("\n", " ")
        except BaseException as e:  # noqa: BLE001 - the harness itself must not die
            verdict, detail = "traceback", f"harness: {type(e).__name__}: {e}"
        shutil.rmtree(where, ignore_errors=True)
        conn.send((idx, verdict, detail[:400], time.perf_counter() - t0))


class Pool:
    """Workers that each run one case at a time; one that overruns is killed and replaced."""

    def __init__(self, n: int, base: str | None, mem_gib: float, timeout_s: float):
        self.ctx = mp.get_context("fork")
        self.args = (base, mem_gib, timeout_s)
        self.timeout_s = timeout_s
        self.slots = [self._start() for _ in range(n)]

    def _start(self) -> dict[str, Any]:
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        p.start()
        return {"proc": p, "conn": parent, "job": None, "t0": 0.0}

    def run(self, cases: list[tuple[str, B.Case]], scratch: Path) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [None] * len(cases)
        todo = list(range(len(cases)))[::-1]
        done = shown = 0
        while done < len(cases):
            for i, s in enumerate(self.slots):
                if s["job"] is None and todo:
                    idx = todo.pop()
                    s["conn"].send((idx, cases[idx][1], str(scratch / f"case{idx}")))
                    s["job"], s["t0"] = idx, time.monotonic()
                if s["job"] is None:
                    continue
                if s["conn"].poll(0.01):
                    try:
                        idx, verdict, detail, wall = s["conn"].recv()
                    except EOFError:  # the worker died (killed by the OS?)
                        idx, verdict, detail, wall = s["job"], "traceback", "worker died", 0.0
                        self.slots[i] = self._start()
                    results[idx] = _row(cases[idx], verdict, detail, wall)
                    s["job"] = None
                    done += 1
                    if verdict == "hang":  # an interrupted run may leave state behind
                        self._replace(i)
                elif time.monotonic() - s["t0"] > self.timeout_s + 30:
                    idx = s["job"]
                    results[idx] = _row(cases[idx], "hang", "killed: no answer", 0.0)
                    done += 1
                    self._replace(i)
                elif not s["proc"].is_alive():
                    idx = s["job"]
                    code = s["proc"].exitcode
                    results[idx] = _row(cases[idx], "traceback", f"worker exit {code}", 0.0)
                    done += 1
                    self._replace(i)
            if done >= shown + 200:
                shown = done
                print(f"  {done}/{len(cases)}", file=sys.stderr, flush=True)
        for s in self.slots:
            s["conn"].send(None)
        return [r for r in results if r is not None]

    def _replace(self, i: int) -> None:
        old = self.slots[i]
        if old["proc"].is_alive():
            old["proc"].kill()
        old["proc"].join(5)
        self.slots[i] = self._start()


def _row(fc: tuple[str, B.Case], verdict: str, detail: str, wall: float) -> dict[str, Any]:
    family, case = fc
    return {
        "family": family,
        "case": case.name,
        "argv": case.argv,
        "expect": case.expect,
        "verdict": verdict,
        "detail": detail,
        "wall_s": round(wall, 3),
    }


# -- report -----------------------------------------------------------------------------------


def machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} cores (shared), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(r["verdict"] for r in rows)
    by_family: dict[str, Counter] = {}
    for r in rows:
        by_family.setdefault(r["family"].split(":")[0], Counter())[r["verdict"]] += 1
    return {
        "cases": len(rows),
        "must_reject": sum(r["expect"] == "reject" for r in rows),
        "counts": {v: counts.get(v, 0) for v in VERDICTS},
        "by_family": {f: {v: c.get(v, 0) for v in VERDICTS} for f, c in sorted(by_family.items())},
        "problems": [r for r in rows if r["verdict"] in BAD],
        # exit 0 where the mutation may be valid: listed so that a reader can judge them
        "accepted": [r["case"] for r in rows if r["verdict"] == "accepted"],
    }


def write(results: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fuzz_inputs.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# Fuzzing moesim's inputs: bad configs, topologies, graphs, files and command lines",
        "",
        "Generated by `python benchmarks/fuzz_inputs.py` (cases from `tests/bad_inputs.py`, each "
        "run in-process in a worker with an alarm, a hard timeout and an address-space limit). "
        "Verdicts: `traceback` (an exception escaped, or a traceback was printed), `hang` (over "
        "the timeout), `nonsense_accepted` (exit 0 on an input that must be refused), "
        "`nonfinite_output` (exit 0 printing NaN or Infinity), `memory_error`, "
        "`messy_rejection` (refused, but not as exit 2 with one line), `clean_rejection`, "
        "`accepted` (exit 0 where the mutation may be valid: a zero, a huge number, a deleted "
        "optional key).",
        "",
    ]
    runs = sorted(results["runs"].items(), key=lambda kv: kv[0] != "before")
    for label, run in runs:
        s = run["summary"]
        lines += [
            f"## {label}: {run['tree']}",
            "",
            f"Machine: {run['machine']}. {s['cases']} cases ({s['must_reject']} that must be "
            f"refused), seed {run['seed']}, {run['workers']} workers, timeout {run['timeout_s']} "
            f"s per case, {run['wall_s']:.0f} s in all.",
            "",
            "| family | " + " | ".join(VERDICTS) + " |",
            "|---|" + "---:|" * len(VERDICTS),
        ]
        for fam, c in [*s["by_family"].items(), ("**all**", s["counts"])]:
            lines.append(f"| {fam} | " + " | ".join(str(c[v]) for v in VERDICTS) + " |")
        lines.append("")
        if s["problems"]:
            lines += [f"Cases that are not clean ({len(s['problems'])}; the first 60):", ""]
            for p in s["problems"][:60]:
                detail = p["detail"].replace("|", "\\|")
                lines.append(f"- `{p['verdict']}` {p['case']}: {detail[:200]}")
            lines.append("")
        else:
            lines += ["No traceback, no hang, no nonsense accepted.", ""]
    (OUT / "fuzz_inputs.md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2400, help="mutations (hostile cases added)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    ap.add_argument("--mem-gib", type=float, default=12.0, help="address space per worker")
    ap.add_argument("--base", help="run another tree's sim/ (e.g. the code before a change)")
    ap.add_argument("--label", default="current")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--describe", help="what the tree is, for the report (default: its path)")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    a = ap.parse_args()
    path = OUT / "fuzz_inputs.json"
    if a.render:
        write(json.loads(path.read_text()))
        return

    cases = corpus(a.cases, a.seed)
    if a.only:
        cases = [c for c in cases if a.only in c[1].name]
    print(f"{len(cases)} cases, {a.workers} workers", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="moesim-fuzz-"))
    # the cases' inputs that pass are remembered in a cache of their own, not the user's
    # (the workers inherit it); removed with the scratch folder
    os.environ["MOESIM_CACHE_DIR"] = str(scratch / "input-cache")
    t0 = time.perf_counter()
    try:
        rows = Pool(a.workers, a.base, a.mem_gib, a.timeout).run(cases, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0
    results = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    tree = a.describe or a.base or "this tree"
    results["runs"][a.label] = {
        "tree": tree,
        "machine": machine(),
        "seed": a.seed,
        "workers": a.workers,
        "timeout_s": a.timeout,
        "wall_s": wall,
        "summary": summarise(rows),
    }
    if not a.only:
        write(results)
    s = results["runs"][a.label]["summary"]
    print(json.dumps(s["counts"]), file=sys.stderr)
    for p in s["problems"][:40]:
        print(f"{p['verdict']:18s} {p['case']}: {p['detail'][:160]}", file=sys.stderr)


if __name__ == "__main__":
    main()
