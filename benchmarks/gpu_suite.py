"""Everything a lent GPU can tell the project, in one command (issue 27): the machine, the
kernels the cost models need (attention, grouped expert GEMMs, FP8, memory-bound kernels,
copies, the host's time per eager op), the twin calibrated and validated on the bf16 layer
set, on a larger GPU-bound layer (its own calibration) and on one transformer block, a Kineto
trace of the executor's block step replayed, and the GPU's SM / memory clocks, power and
temperature sampled every 100 ms while the twin and GEMM parts run (clocks.csv).

    python benchmarks/gpu_suite.py --out DIR [--budget 480] [--parts a,b] [--dry-run]

One process tree, one output folder (CSVs, the validation reports, the traces, summary.md
with the device named, every part's status and the proposed `gpu.kernels` values), written
as one set (staged inside DIR and swapped in whole, manifest.json last; a run that fails or is
interrupted still writes what it measured). `--budget` drops the least valuable parts first,
in the fixed priority order below; a part that would not fit in what is left at run time is
dropped then, and every part has a time allowance it cannot outlive. `--dry-run` runs the
same code paths on a CPU (gloo, tiny shapes) in about a minute: CI runs it
(tests/test_gpu_suite.py). How to run it on a lent device and fold the results into the
presets: reports/gpu-suite/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_suite_parts import clocks  # noqa: E402 - no torch: --help needs none
from benchmarks.gpu_suite_parts import plan as P  # noqa: E402

# what runs each part: (module in gpu_suite_parts, function)
RUNNERS = {
    "env": ("env", "run"),
    "calibrate": ("twin", "run_calibrate"),
    "validate": ("twin", "run_validate"),
    "validate_big": ("twin_big", "run"),
    "block": ("twin", "run_block"),
    "replay": ("replay", "run"),
    "attention": ("attention", "run"),
    "grouped": ("gemm", "run_grouped"),
    "gemm": ("gemm", "run_gemm"),
    "fp8": ("gemm", "run_fp8"),
    "memory": ("memory", "run_memory"),
    "copy": ("memory", "run_copy"),
    "launch": ("memory", "run_launch"),
}
# run `moesim` / import exec
NEEDS_SIM = {"calibrate", "validate", "validate_big", "block", "replay"}
ENV_ALLOWANCE_S = 120.0  # env runs whatever the budget; torch's import and CUDA start bound it


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _budget(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return v


def _parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected part names separated by commas")
    for n in names:
        if n not in P.BY_NAME and n not in P.GROUPS:
            raise argparse.ArgumentTypeError(
                f"unknown part {n!r} (parts: {', '.join(P.BY_NAME)}; groups: {', '.join(P.GROUPS)})"
            )
    return names


def parts_table() -> str:
    lines = [
        "parts, in priority order (a budget drops them from the bottom up; env always runs):",
        f"  {'#':>2}  {'part':<12} {'group':<8} {'expected s on an H100':>21}  what",
    ]
    for i, p in enumerate(P.PARTS, 1):
        lines.append(f"  {i:>2}  {p.name:<12} {p.group:<8} {p.expected_s:>21}  {p.what}")
    total = sum(p.expected_s for p in P.PARTS)
    lines.append(f"      {'total':<21} {total:>21}  (target <= {P.TARGET_S} s)")
    lines.append(
        "expected seconds: estimated from the shared H100 figures (../shared/reference/"
        "measurements/h100-sxm-2026-11-23/), validate_big's from the H200 runs "
        "(reports/gpu-h200-2026-11-27/); see benchmarks/gpu_suite_parts/plan.py"
    )
    lines.append(
        "clocks: sampled while " + ", ".join(clocks.SAMPLED) + " run (clocks.csv; summary.md)"
    )
    return "\n".join(lines)


def parser() -> Parser:
    p = Parser(
        prog="gpu_suite.py",
        description=__doc__.split("\n\n")[0],
        epilog=parts_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", help="output folder (the whole set is written there)")
    p.add_argument(
        "--budget",
        type=_budget,
        default=float(P.TARGET_S),
        help=f"seconds the suite may take (default {P.TARGET_S}); parts are dropped from the "
        "least valuable up until the rest fits",
    )
    p.add_argument(
        "--parts",
        type=_parts,
        help="comma-separated parts or groups to run (default: all); what a part needs is added",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="the same code paths on a CPU: gloo, tiny shapes, 1-2 repeats (CI)",
    )
    p.add_argument(
        "--preset",
        help="topology preset name or YAML whose gpu peaks the shares are of "
        "(default: the preset whose gpu.model names the device)",
    )
    p.add_argument(
        "--source",
        help="the folder the results will be recorded in, named in the proposed values' "
        "sources (default reports/gpu-<device>-<date>)",
    )
    p.add_argument(
        "--plan", action="store_true", help="print which parts the budget keeps and exit"
    )
    return p


def slug(device: str) -> str:
    s = re.sub(r"^nvidia\s+", "", device.strip(), flags=re.I).lower()
    s = re.sub(r"\(.*?\)", "", s)
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "device"


class _Log:
    def __init__(self) -> None:
        self.path: Path | None = None

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(msg + "\n")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    selected = P.select(args.parts)
    run_set, dropped = P.plan(selected, args.budget)
    if args.plan:
        print(f"budget {args.budget:g} s:")
        for p in selected:
            state = "run" if p in run_set else "drop"
            print(f"  {state:<4} {p.name:<12} {p.expected_s:>4} s")
        return 0
    if not args.out:
        parser().error("--out DIR is required")

    from benchmarks.gpu_suite_parts import common
    from sim.core.io import OutputSet  # the one import from sim (atomic output sets)

    try:
        oset = OutputSet(args.out, "gpu-suite")
    except Exception as e:  # noqa: BLE001 - an unusable --out: one line, exit 2
        print(f"gpu_suite.py: error: --out: {common.first_line(e)}", file=sys.stderr)
        return 2
    log = _Log()
    log.path = oset.stage / "suite.log"
    ctx = common.Ctx(dry=args.dry_run, out=oset.stage, preset={}, log=log)
    old = signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    suite_deadline = t0 + args.budget
    records: list[dict[str, Any]] = []
    order = {p.name: i for i, p in enumerate(P.PARTS, 1)}
    status: dict[str, str] = {}
    interrupted = ""
    runtime_drop = ""
    sampler = clocks.Sampler(t0)
    log(
        f"gpu suite{' (dry run)' if args.dry_run else ''}: budget {args.budget:g} s, parts "
        f"{', '.join(p.name for p in run_set)}"
        + (f"; dropped by the budget: {', '.join(p.name for p in dropped)}" if dropped else "")
    )
    try:
        for p in P.PARTS:
            rec: dict[str, Any] = {
                "priority": order[p.name],
                "name": p.name,
                "group": p.group,
                "expected_s": p.expected_s,
                "status": "",
                "reason": "",
                "wall_s": None,
            }
            records.append(rec)
            if p not in selected:
                rec.update(status="not selected", reason="not in --parts")
                continue
            if interrupted:
                rec.update(status="not run", reason=f"the suite was interrupted ({interrupted})")
                continue
            if p in dropped:
                rec.update(status="dropped", reason=f"by the budget ({args.budget:g} s, planned)")
                status[p.name] = "dropped"
                continue
            left = suite_deadline - time.monotonic()
            if p.name not in P.ALWAYS and (runtime_drop or left < p.expected_s):
                runtime_drop = runtime_drop or p.name
                rec.update(
                    status="dropped",
                    reason=f"by the budget at run time ({max(left, 0):.0f} s left, expects "
                    f"{p.expected_s} s)",
                )
                status[p.name] = "dropped"
                continue
            needs = p.needs if p.name in P.ALWAYS else ("env", *p.needs)
            missing = [n for n in needs if status.get(n) != "ran"]
            if missing:
                rec.update(
                    status="skipped",
                    reason=", ".join(
                        f"needs {n}, which {status.get(n, 'was not selected')}" for n in missing
                    ),
                )
                status[p.name] = "skipped"
                continue
            deps = (ctx.shared.get("env") or {}).get("sim_deps_missing")
            if p.name in NEEDS_SIM and deps:
                rec.update(
                    status="skipped",
                    reason=f"moesim's dependencies do not import here: {', '.join(deps)} "
                    "(carry them as wheels: reports/gpu-suite/README.md)",
                )
                status[p.name] = "skipped"
                continue
            allowance = (
                ENV_ALLOWANCE_S
                if p.name in P.ALWAYS
                else min(left, max(2.0 * p.expected_s, p.expected_s + 30.0))
            )
            ctx.deadline = time.monotonic() + allowance
            log(f"[{order[p.name]:>2}] {p.name}: expected {p.expected_s} s on an H100 ...")
            start = time.monotonic()
            try:
                if p.name in clocks.SAMPLED:
                    sampler.start(ctx, p.name)
                if news := sampler.news():  # once: why the clocks are not (or no more) sampled
                    log(f"     clocks {news}")
                res = _run_part(p.name, ctx, args)
            except KeyboardInterrupt as e:
                interrupted = str(e) or "interrupted"
                res = {"status": "interrupted", "reason": interrupted}
            except common.Cut as e:
                res = {"status": "dropped", "reason": f"by the budget at run time: {e}"}
            except Exception as e:  # noqa: BLE001 - a part's failure is recorded, the rest run
                with open(oset.stage / "suite.log", "a") as f:
                    f.write(traceback.format_exc())
                res = {"status": "failed", "reason": f"{type(e).__name__}: {common.first_line(e)}"}
            finally:  # the part's sampling ends with it, whatever ended the part
                sampler.stop()
            rec["wall_s"] = time.monotonic() - start
            rec["status"] = res.pop("status")
            rec["reason"] = res.pop("reason", "")
            rec["numbers"] = ", ".join(f"{k} {_num(v)}" for k, v in res.items() if v is not None)
            status[p.name] = rec["status"]
            log(
                f"     {rec['status']} in {rec['wall_s']:.1f} s"
                + (f": {rec['reason']}" if rec["reason"] else "")
                + (f" ({rec['numbers']})" if rec["numbers"] else "")
            )
        wall = time.monotonic() - t0
        device = (ctx.shared.get("env") or {}).get("device", "device")
        date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        meta = {
            "date": date,
            "wall_s": wall,
            "budget_s": args.budget,
            "command": " ".join(
                shlex.quote(a)
                for a in ["python", "benchmarks/gpu_suite.py", *(argv or sys.argv[1:])]
            ),
            "source": args.source or f"reports/gpu-{slug(device)}-{date}",
        }
        from benchmarks.gpu_suite_parts import summary

        ctx.shared["clocks"] = clocks.result(ctx, sampler)
        summary.write(ctx, records, meta)
        common.write_rows(
            ctx,
            "parts.csv",
            records,
            ["priority", "name", "group", "expected_s", "wall_s", "status", "reason", "numbers"],
        )
        log(f"gpu suite: {wall:.0f} s; {sum(r['status'] == 'ran' for r in records)} parts ran")
        _register(oset)
        oset.close()
    except BaseException:
        oset.abort()
        raise
    finally:
        sampler.close()
        signal.signal(signal.SIGTERM, old)
    print(f"wrote {Path(args.out) / 'summary.md'}")
    if interrupted:
        return 130
    return 1 if any(r["status"] == "failed" for r in records) else 0


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _run_part(name: str, ctx: Any, args: argparse.Namespace) -> dict[str, Any]:
    import importlib

    mod, fn = RUNNERS[name]
    m = importlib.import_module(f"benchmarks.gpu_suite_parts.{mod}")
    if name == "env":
        return dict(m.run(ctx, args.preset))
    return dict(getattr(m, fn)(ctx))


def _register(oset: Any) -> None:
    """Every file the parts (and the commands they ran) wrote in the staging folder joins the
    set; hidden files (temporaries, other sets' staging folders) do not."""
    for d, dirs, files in os.walk(oset.stage):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in files:
            if f.startswith("."):
                continue
            rel = (Path(d) / f).relative_to(oset.stage).as_posix()
            if rel != "manifest.json":
                oset.path(rel)


if __name__ == "__main__":
    sys.exit(main())
