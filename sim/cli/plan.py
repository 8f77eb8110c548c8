"""The `moesim plan` subcommand: parsing and printing only (sim.training.plan)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_plan(a: argparse.Namespace) -> int:
    from sim.core.errors import ConfigError
    from sim.core.io import check_output_dir
    from sim.training.plan import plan
    from sim.training.plan_parse import parse_grid, parse_layout
    from sim.training.plan_report import text_plan
    from sim.training.plan_space import Request

    if a.out is not None:  # an unusable --out fails before anything is simulated
        check_output_dir(a.out)
    if a.workers is not None and a.workers < 1:
        raise ConfigError(f"--workers {a.workers}: expected an integer >= 1")
    if a.top < 0:
        raise ConfigError(f"--top {a.top}: expected an integer >= 0 (0: no table)")
    req = Request(
        a.model, a.system, a.gpus, a.gbs, a.seq_len, a.precision.upper(), release=a.release
    )
    if a.release:  # a release with no recorded recipe would silently run another one's
        from sim.training.recipe import releases

        known = releases(req.model, req.system, req.precision)
        if a.release not in known:
            raise ConfigError(
                f"--release {a.release}: no recipe recorded for {req.model} on {req.system} "
                f"in {req.precision} (recorded: {', '.join(known) or 'none'})"
            )
    given = parse_layout(a.layout) if a.layout else None
    grid = parse_grid(a.grid or [])
    workers = a.workers if a.workers is not None else (1 if a.scheduler is None else None)
    with _Bar(a.scheduler) as bar:
        result = plan(
            req,
            given=given,
            workers=workers,
            progress=bar,
            grid=grid or None,
            scheduler=a.scheduler,
            out=a.out,
        )
    files = result.files
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


class _Bar:
    """The plan's progress on stderr: candidates settled (dropped or simulated) of all, with
    the counts screened, simulated (and taken from the journal), running and pruned."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.bar: Any = None
        self.last = -1
        self.drawn = 0.0

    def __enter__(self) -> _Bar:
        from sim.core import progress

        self.bar = progress.Bar(total=None, desc="plan", unit="candidate")
        return self

    def __call__(self, s: Any) -> None:
        import time

        from sim.core import progress

        bar = self.bar
        if bar is None or not bar.shown:
            return
        bar.set_total(s.total)
        moved = s.settled != self.last
        self.last = s.settled
        bar.set(s.settled)
        pruned = ", ".join(f"{k} {v}" for k, v in sorted(s.pruned.items()))
        note = (
            f"screened {s.screened}/{s.total}"
            if s.phase == "screening"
            else f"simulated {s.simulated}"
            + (f" ({s.resumed} resumed)" if s.resumed else "")
            + f", running {s.running}"
        )
        if s.phase != "screening" and s.simulated == 0 and self.scheduler is not None:
            note += f", waiting for {self.scheduler}"
        bar.note(note + (f", pruned: {pruned}" if pruned else ""))
        now = time.monotonic()
        if not moved and now - self.drawn >= progress.REFRESH_S:
            # nothing settled (a heartbeat, or a candidate screened in): redraw, so the
            # elapsed time moves; tqdm throttles the rest
            bar.refresh()
            self.drawn = now

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()


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
        "--release",
        default="",
        help="start from the recipe recorded for this Megatron-Bridge release (e.g. 26.02; "
        "default: the newest recorded for the model, system and precision)",
    )
    p.add_argument(
        "--layout",
        metavar="tp=1,pp=2,vp=12,ep=8,mbs=1",
        help="also score this layout (cp, overlap=on|off, recompute=none|selective|"
        "full, recompute_layers=N with recompute=full: the first N layers of each model "
        "chunk, as Megatron-Core's --recompute-method block --recompute-num-layers N, "
        "fsdp=on|off, dispatcher, sms, offload=LAYERS, pipeline=1f1b|dualpipe|dualpipev, "
        "queues=N: the GPU's hardware queues, CUDA_DEVICE_MAX_CONNECTIONS) and say its rank",
    )
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        help="the values tried for a key (tp, cp, pp, vp, ep, mbs, recompute, dispatcher, "
        "comm_sms, queues, offload, pipeline), e.g. pp=1,2,4, pipeline=1f1b,dualpipev or "
        "queues=1,32 (default queues 0: as Megatron-Bridge's scripts set them); repeatable",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="local processes (default 1), or with --scheduler dask-local the Dask "
        "cluster's (default: the CPU count)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="simulate on this Dask distributed scheduler (e.g. tcp://head:8786), or "
        "dask-local: a Dask cluster of --workers local processes",
    )
    p.add_argument("--top", type=int, default=10, help="candidates printed (default 10)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="journal the simulated candidates there (candidates.jsonl; running the same "
        "plan again resumes from it) and write plan.parquet, plan.csv, plan.json, "
        "plan.html, best.csv",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(fn=cmd_plan)
