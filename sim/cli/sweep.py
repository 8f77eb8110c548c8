"""The `moesim sweep` subcommand: parsing and printing only (sim.analysis.sweep runs it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

SHOWN = 8  # configs (best strategy) and distinct errors printed; the files hold them all


def cmd_sweep(a: argparse.Namespace) -> int:
    from sim.analysis.sweep import run_sweep

    stats: dict[str, Any] = {}
    df = run_sweep(
        a.spec,
        out=a.out,
        scheduler=a.scheduler,
        workers=a.workers,
        progress=not a.json and sys.stderr.isatty(),
        restart=a.restart,
        retry_errors=a.retry_errors,
        stats=stats,
    )
    ok = df[df["status"] == "ok"]
    best = []
    for config, group in ok.groupby("config", sort=False):
        r = group.loc[group["time_per_token_s"].idxmin()]
        best.append(
            {"config": config, "strategy": r["strategy"], "time_per_token_s": r["time_per_token_s"]}
        )
    errors = df.loc[df["status"] != "ok", "error"].value_counts()
    note = _work_note(ok)
    if a.json:
        doc = stats | {"best": best, "errors": {str(k): int(v) for k, v in errors.items()}}
        doc |= {"notes": [note]} if note else {}
        print(json.dumps(doc, indent=2, default=str))
        return _all_failed(df, a.out)
    print(
        f"sweep: {stats['points']} runs: {stats['ran']} ran now, {stats['skipped']} from an "
        f"earlier run; {stats['failed']} failed"
    )
    for b in best[:SHOWN]:
        print(
            f"  best on {b['config']}: {b['strategy']} "
            f"({b['time_per_token_s'] * 1e9:.4g} ns per token)"
        )
    if len(best) > SHOWN:
        print(f"  ... and {len(best) - SHOWN} more configs (results.csv has every row)")
    if note:
        print(f"  {note}")
    for message, n in list(errors.items())[:SHOWN]:
        print(f"  {n} x error: {message}")
    for name, path in stats["files"].items():
        print(f"  wrote {name:8s} {path}")
    return _all_failed(df, a.out)


def _all_failed(df: Any, out: str) -> int:
    """1 (with a line on stderr) when no point ran: a sweep of only errors is a failure for
    a script, not a result; its rows stay in `out` for --retry-errors."""
    if len(df) and not (df["status"] == "ok").any():
        print(
            f"moesim: error: sweep: every point failed ({len(df)} of {len(df)}); the rows "
            f"with their errors are kept in {out}",
            file=sys.stderr,
        )
        return 1
    return 0


def add_parsers(sub: Any) -> None:
    """`moesim sweep` (sim.analysis.sweep)."""
    sp = sub.add_parser(
        "sweep",
        help="run the cross product of a spec's parameters (local processes or Dask); "
        "resumable, one Parquet row per run",
    )
    sp.add_argument("spec", metavar="SPEC.yaml", help="sweep spec (`moesim schema sweep`)")
    sp.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="rows/ (one part per finished run), results.parquet, results.csv; running "
        "again into it resumes, skipping finished runs",
    )
    sp.add_argument(
        "--workers", type=int, help="local worker processes (default: CPU count; 1: in-process)"
    )
    sp.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run on this Dask distributed scheduler (e.g. tcp://head:8786) instead, or "
        "dask-local: a Dask cluster of --workers local processes",
    )
    sp.add_argument(
        "--restart",
        action="store_true",
        help="discard the rows of another spec found in --out (refused without it)",
    )
    sp.add_argument(
        "--retry-errors", action="store_true", help="run again the points whose row is an error"
    )
    sp.add_argument("--json", action="store_true", help="print counts and files as JSON")
    sp.set_defaults(fn=cmd_sweep)


def _work_note(ok: Any) -> str | None:
    """A note when the runs keep different numbers of (token, expert) choices per MoE layer
    (a swept routing or capacity factor): their times are not for the same work."""
    if "tokens_kept" not in ok.columns:
        return None
    kept = ok["tokens_kept"].dropna()
    if kept.nunique() <= 1:
        return None
    drop = ok["dropped_fraction"].dropna()
    return (
        f"note: rows differ in tokens kept per MoE layer ({int(kept.min()):,} to "
        f"{int(kept.max()):,}; up to {drop.max():.1%} dropped), so their times are not for "
        "the same work (tokens_kept, dropped_fraction in the results)"
    )
