"""The `moesim predict` subcommand: parsing and printing only (sim.training.predict)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_predict(a: argparse.Namespace) -> int:
    from sim.core import progress
    from sim.core.errors import ConfigError
    from sim.core.io import check_output_dir
    from sim.training.predict import predict_rows, read_table
    from sim.training.report import text_table, write

    if a.out is not None:  # an unusable --out fails before anything is simulated
        check_output_dir(a.out)
    if a.workers < 1:
        raise ConfigError(f"--workers {a.workers}: expected an integer >= 1")
    from sim.training.predict import load_kernels

    kernels = dict(load_kernels(s) for s in a.kernels or [])
    rows = read_table(a.table)
    if a.rows:
        picked = []
        for n in a.rows:
            if not 1 <= n <= len(rows):
                raise ConfigError(f"--row {n}: the table has rows 1..{len(rows)}")
            picked.append(n)
        rows = [{**rows[n - 1], "_row": n} for n in picked]
    with progress.Bar(total=len(rows), desc="predict", unit="row") as bar:
        result = predict_rows(
            rows,
            progress=lambda i, n: bar.set(i),
            workers=a.workers,
            kernels=kernels,
            sensitivity=a.sensitivity,
            as_printed=a.as_printed,
        )
    files = write(result, a.out) if a.out is not None else {}
    if a.json:
        out = {**result, "files": {k: str(v) for k, v in files.items()}}
        print(json.dumps(out, indent=2, default=str))
    else:
        print(text_table(result), end="")
        for name, path in files.items():
            print(f"  wrote {name:17s} {path}")
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="predict the step time, tokens/s/GPU and memory of training runs in a table "
        "(Megatron-Bridge performance-summary columns)",
    )
    p.add_argument(
        "table",
        metavar="TABLE.csv",
        help="runs: system, model, gpus, precision, gbs, "
        "mbs, seq_len, fsdp, tp, pp, cp, vp, ep, ga (extra columns kept; "
        "tokens_per_s_per_gpu, where given, is compared)",
    )
    p.add_argument(
        "--row",
        dest="rows",
        type=int,
        action="append",
        metavar="N",
        help="repeatable: predict only row N (1 = the first data row)",
    )
    p.add_argument(
        "--out", metavar="DIR", help="write predictions.csv, .json, .html and .txt as one set"
    )
    p.add_argument("--workers", type=int, default=1, help="local processes (default 1)")
    p.add_argument(
        "--kernels",
        action="append",
        metavar="SYSTEM=FILE",
        help="repeatable: measured gpu.kernels (a GPU suite's proposed_kernels.yaml) over the "
        "preset's for that system's rows",
    )
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also each step's sensitivity to the GPU, the host and the links, and the one "
        "that paces it (three more steps simulated per row)",
    )
    p.add_argument(
        "--as-printed",
        action="store_true",
        help="predict every row at its printed layout (default: a row whose recipe records "
        "that the printed layout cannot be what ran is predicted at the recipe's, and says so)",
    )
    p.add_argument("--json", action="store_true", help='print {"rows": [...], "mape": ...}')
    p.set_defaults(fn=cmd_predict)
