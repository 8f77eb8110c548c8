"""The `moesim report` subcommand: parsing and printing only (sim.analysis.report)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def cmd_report(a: argparse.Namespace) -> int:
    from sim.analysis.report import build, markdown, write
    from sim.analysis.results import parse_threshold
    from sim.core.errors import ConfigError
    from sim.core.io import check_output_dir

    threshold = parse_threshold(a.threshold)
    if a.timelines < 0:  # a count: a negative one would silently mean none
        raise ConfigError(f"--timelines {a.timelines}: expected a count >= 0 (0: no timelines)")
    if a.out is not None:  # an unusable --out fails before anything is read
        check_output_dir(a.out)
    rep = build(a.results, a.baseline, threshold)
    files = write(rep, a.out, a.timelines) if a.out is not None else {}
    if a.json:
        print(
            json.dumps(
                {**rep.summary(), "files": {k: str(v) for k, v in files.items()}},
                indent=2,
                default=str,
            )
        )
    else:
        print(markdown(rep), end="")
        for name, path in files.items():
            print(f"  wrote {name:9s} {path}")
    if rep.regressed:  # CI gates on the status; the configs on stderr say where to look
        print(
            f"moesim: regression: {len(rep.regressed)} config(s) slower than the baseline by "
            f"more than {100 * threshold:g}% or now failing: {'; '.join(rep.regressed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def add_parsers(sub: Any) -> None:
    """`moesim report`."""
    r = sub.add_parser(
        "report",
        help="regression report over results (sweep, compare --out, validate): HTML + Markdown",
        description="Exit status: 0 no regression, 1 a regression against --baseline (named "
        "on stderr), 2 bad input.",
    )
    r.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="results.parquet/.csv of moesim sweep, a compare --out or validate directory",
    )
    r.add_argument("--baseline", nargs="+", metavar="OLD", help="results to compare against")
    r.add_argument(
        "--threshold",
        default="5%",
        help="relative change of time per token that counts (5%% or 0.05; default 5%%)",
    )
    r.add_argument(
        "--out", metavar="DIR", help="write report.html (self-contained), report.md, report.json"
    )
    r.add_argument(
        "--timelines",
        type=int,
        default=2,
        metavar="N",
        help="timelines of the best and worst strategy of N configs where traces exist (2)",
    )
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.set_defaults(fn=cmd_report)
