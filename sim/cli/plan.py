"""The `moesim plan` subcommand: parsing and printing only (sim.training.plan)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_plan(a: argparse.Namespace) -> int:
    from sim.core import progress
    from sim.core.errors import ConfigError
    from sim.core.io import check_output_dir
    from sim.training.plan import Request, parse_layout, plan
    from sim.training.plan_report import text_plan, write

    if a.out is not None:  # an unusable --out fails before anything is simulated
        check_output_dir(a.out)
    if a.workers < 1:
        raise ConfigError(f"--workers {a.workers}: expected an integer >= 1")
    req = Request(a.model, a.system, a.gpus, a.gbs, a.seq_len, a.precision.upper())
    given = parse_layout(a.layout) if a.layout else None
    with progress.Bar(total=None, desc="plan", unit="candidate") as bar:
        result = plan(req, given=given, workers=a.workers, progress=lambda i, n: bar.set(i))
    files = write(result, a.out) if a.out is not None else {}
    if a.json:
        print(
            json.dumps(
                {**result.as_dict(), "files": {k: str(v) for k, v in files.items()}},
                indent=2,
                default=str,
            )
        )
    else:
        print(text_plan(result, a.top), end="")
        for name, path in files.items():
            print(f"  wrote {name:17s} {path}")
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="the fastest layout and overlap choices for a model on a cluster, within memory",
    )
    p.add_argument("model", help="a model of `moesim predict` (e.g. DeepSeekV3, LLAMA3_70B)")
    p.add_argument("--system", required=True, help="DGX-H100, DGX-B200, DGX-GB200 (or a preset)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs of the run")
    p.add_argument("--gbs", type=int, required=True, help="global batch, sequences")
    p.add_argument("--seq-len", type=int, required=True, help="sequence length, tokens")
    p.add_argument("--precision", default="BF16", help="BF16, FP8-CS, MXFP8, NVFP4, ...")
    p.add_argument(
        "--layout",
        metavar="tp=1,pp=2,vp=12,ep=8,mbs=1",
        help="also score this layout (cp, overlap=on|off, recompute=none|selective|"
        "full, fsdp=on|off) and say its rank",
    )
    p.add_argument("--workers", type=int, default=1, help="local processes (default 1)")
    p.add_argument("--top", type=int, default=10, help="candidates printed (default 10)")
    p.add_argument("--out", metavar="DIR", help="write plan.csv, plan.json, plan.html, best.csv")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(fn=cmd_plan)
