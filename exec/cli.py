"""`moesim exec`: run a task graph (JSON) or a run config (YAML) for real.

Registered by sim.cli.build_parser through `add_parser`; nothing here imports torch until the
command runs, so `moesim simulate` never pays for (or needs) torch.

    moesim exec graph.json --nprocs 2                  # the graph as is
    moesim exec run.yaml --nprocs 2 --out out/exec     # the config's graph for 2 ranks
    moesim exec run.yaml --nprocs 2 --moe              # the real layer: strategy vs sequential
    torchrun --nproc-per-node 2 -m sim.cli exec run.yaml   # ranks started by torchrun
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    add_parser(sub)
    add_calibrate_parser(sub)
    add_validate_parser(sub)


def add_calibrate_parser(sub: Any) -> argparse.ArgumentParser:
    c = sub.add_parser("calibrate", help="measure this machine and fit the cost model")
    c.add_argument("--nprocs", type=int, default=2, help="local processes (default 2)")
    c.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    c.add_argument("--out", required=True, help="calibration file to write")
    c.add_argument("--quick", action="store_true", help="a small plan (for smoke tests)")
    c.add_argument(
        "--shapes-from",
        metavar="CONFIG",
        help="also profile the exact GEMM shapes of this run config's validation graphs",
    )
    c.add_argument(
        "--strategies",
        nargs="+",
        metavar="NAME[:k=v,...]",
        help="with --shapes-from: also the graphs of these strategies (as `validate`)",
    )
    c.add_argument("--timeout", type=float, default=120.0)
    c.set_defaults(fn=cmd_calibrate)
    return c


def add_validate_parser(sub: Any) -> argparse.ArgumentParser:
    v = sub.add_parser("validate", help="run graphs for real and in the simulator; report")
    v.add_argument("config", help="run config YAML (its layer; the world is --nprocs)")
    v.add_argument("--nprocs", type=int, default=2)
    v.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    v.add_argument("--calibration", help="calibration file (default: calibrate first)")
    v.add_argument(
        "--topology",
        default="localhost-cpu",
        help="topology the simulator replays on (default localhost-cpu)",
    )
    v.add_argument("--repeats", type=int, default=3, help="runs per graph; median kept")
    v.add_argument(
        "--strategies",
        nargs="+",
        metavar="NAME[:k=v,...]",
        help="validate these strategies (fwd and fwd+bwd) instead of sequential + pipelined "
        "r=1,2,4,8, e.g. tutel:degree=2 mpipemoe:degree=2,reuse=S1",
    )
    v.add_argument("--quick", action="store_true", help="quick calibration if one is needed")
    v.add_argument("--out", required=True, help="report directory")
    v.add_argument("--timeout", type=float, default=120.0)
    v.set_defaults(fn=cmd_validate)
    return v


def _check_procs(nprocs: int, timeout: float) -> None:
    from exec.errors import ExecError

    if nprocs < 1:
        raise ExecError(f"--nprocs must be >= 1, got {nprocs}")
    if timeout <= 0:
        raise ExecError(f"--timeout must be > 0 seconds, got {timeout:g}")


def _warn_cores(nprocs: int, threads: int | None = None) -> None:
    """One line on stderr when the local ranks' threads outnumber the host's cores: said
    once the inputs are checked, just before the ranks start (a refused input gets its
    one-line error alone)."""
    import sys

    from exec.runtime.launch import oversubscription

    msg = oversubscription(nprocs, threads)
    if msg:
        print(f"moesim: warning: {msg}", file=sys.stderr)


def cmd_calibrate(a: argparse.Namespace) -> int:
    from exec import api
    from exec.errors import require_torch
    from sim.core.io import check_output_file

    require_torch()
    _check_procs(a.nprocs, a.timeout)
    check_output_file(a.out, "--out")  # before measuring: a refused path must not cost a run
    plan = api.calibration_plan(a.nprocs, a.quick, a.shapes_from, a.strategies)
    _warn_cores(a.nprocs)
    print(f"calibrating {a.nprocs} ranks ({a.backend})")
    cal, path = api.calibrate(a.nprocs, a.backend, plan, a.out, a.timeout)
    for line in cal.describe():
        print(line)
    print(f"  wrote {path}")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    from exec import api
    from exec.errors import require_torch
    from exec.measure.validation import preflight, validate
    from sim.config import RunConfig

    require_torch()
    _check_procs(a.nprocs, a.timeout)
    cfg = RunConfig.load(a.config)
    out = Path(a.out)
    calibration = a.calibration
    # every strategy built and simulated on the topology before anything is measured (the
    # calibration included): one line naming what cannot be, exit 2
    preflight(cfg, a.nprocs, a.topology, a.strategies, calibration)
    _warn_cores(a.nprocs)
    if calibration is None:
        print(f"no --calibration: calibrating {a.nprocs} ranks first")
        calibration = api.calibrate_for(
            cfg, a.nprocs, a.backend, out, a.strategies, a.quick, a.timeout
        )
    print(f"validating on {a.nprocs} ranks ({a.backend})")
    res = validate(
        cfg,
        a.nprocs,
        calibration,
        out,
        a.backend,
        a.topology,
        a.repeats,
        a.timeout,
        strategies=a.strategies,
    )
    s = res["summary"]
    print(
        f"  MAPE {s['mape_pct']:.1f}% (worst {s['max_abs_error_pct']:.1f}%; against the "
        f"fastest runs {s['mape_fastest_run_pct']:.1f}%); best measured "
        f"{s['best_measured']!r}, simulated {' = '.join(s['best_simulated'])!r}"
    )
    from sim.analysis.validate import pick_lines

    for line in pick_lines(s):
        print(f"  {line}")
    for name, path in res["files"].items():
        print(f"  wrote {name:9s} {path}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    e = sub.add_parser(
        "exec",
        help="run a task graph (JSON) or a run config (YAML) for real with torch.distributed",
    )
    e.add_argument("graph", metavar="GRAPH_OR_CONFIG", help="task graph JSON or run config YAML")
    e.add_argument(
        "--nprocs",
        type=int,
        help="local processes, one per rank (under torchrun: its WORLD_SIZE)",
    )
    e.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="default gloo")
    e.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a communication may take before the run fails (default 60)",
    )
    e.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    e.add_argument(
        "--out", help="output directory for the measured trace (default: a config's output.dir)"
    )
    e.add_argument(
        "--moe",
        action="store_true",
        help="run the real MoE layer with the config's strategy and compare it to sequential",
    )
    e.add_argument("--seed", type=int, default=0, help="seed of the real layer's data (--moe)")
    e.add_argument(
        "--record-routing",
        metavar="FILE.npz",
        help="with --moe: write the real gate's choices as a router map, replayable with "
        "model.routing {kind: replay, file: FILE.npz}",
    )
    e.add_argument("--strategy", help="override strategy.name (a run config only)")
    e.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="override a strategy parameter (repeatable; a run config only), e.g. degree=4",
    )
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    e.set_defaults(fn=cmd_exec)
    return e


def cmd_exec(a: argparse.Namespace) -> int:
    from exec import api
    from exec.errors import ExecError, require_torch
    from exec.runtime.launch import under_torchrun

    require_torch()
    torchrun = under_torchrun()
    if torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if a.nprocs is not None and a.nprocs != world:
            raise ExecError(f"--nprocs {a.nprocs} disagrees with torchrun's WORLD_SIZE {world}")
        nprocs = world
    else:
        if a.nprocs is None:
            raise ExecError("--nprocs is required (the number of local processes, one per rank)")
        nprocs = a.nprocs
    if nprocs < 1:
        raise ExecError(f"--nprocs must be >= 1, got {nprocs}")
    if a.timeout <= 0:
        raise ExecError(f"--timeout must be > 0 seconds, got {a.timeout:g}")
    if a.warmup < 0:
        raise ExecError(f"--warmup must be >= 0, got {a.warmup}")
    if a.record_routing is not None:
        if not a.moe:
            raise ExecError("--record-routing records the real gate: it needs --moe")
        from sim.core.io import check_output_file

        check_output_file(a.record_routing, "--record-routing")
    graph, cfg, res = api.load_graph(a.graph, nprocs, a.strategy, a.param)
    where = a.out or (cfg.output.get("dir") if cfg is not None else None)
    if where is None and not a.moe:  # a measurement is kept, and only where asked for
        raise ExecError("--out DIR is required: where to keep the measured trace")
    from exec.runtime.launch import check_world

    check_world(graph, nprocs)  # its error before any warning about the cores
    if torchrun:  # the ranks torchrun started on this host, each with its own threads
        import torch

        local = int(os.environ.get("LOCAL_WORLD_SIZE", nprocs))
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            _warn_cores(local, torch.get_num_threads())
    else:
        _warn_cores(nprocs)
    out = Path(where or ".")
    if a.moe:
        check = api.check_layer(
            graph,
            cfg,
            nprocs,
            a.backend,
            a.timeout,
            a.seed,
            torchrun,
            resolution=res,
            record_routing=a.record_routing,
        )
        if check is None:  # not rank 0 under torchrun: rank 0 prints
            return 0
        _print_check(check, nprocs, a.backend, a.json)
        return 0 if check.equal else 1
    summary = api.run_graph(graph, nprocs, out, a.backend, a.timeout, a.warmup, torchrun)
    if summary is None:
        return 0
    if res is not None:
        summary["resolved"] = res.resolved.as_dict() | {"notes": res.notes}
    print(json.dumps(summary, indent=2) if a.json else _format(summary, res))
    return 0


def _resolved_lines(res: Any) -> list[str]:
    """'  degree: auto -> 4 (selector: theorem1, ...)' per auto parameter, and notes."""
    return [f"  {line}" for line in (res.describe() if res is not None else [])]


def _format(s: dict[str, Any], res: Any = None) -> str:
    lines = [
        f"executed {s['tasks']} tasks on {s['ranks']} ranks ({s['backend']}, {s['device']})",
        *_resolved_lines(res),
        f"  makespan (measured)  {s['makespan_s'] * 1e3:.3f} ms",
        f"  clock alignment      offsets to rank 0 within +-{s['clock_bound_us']:.1f} us",
    ]
    for stream, busy in s["busy_s"].items():
        lines.append(f"  busy {stream:14s}  {busy * 1e3:.3f} ms (mean over ranks)")
    lines.append(f"  exposed comm         {s['exposed_comm_s'] * 1e3:.3f} ms (mean over ranks)")
    for name, path in s.get("files", {}).items():
        lines.append(f"  wrote {name:13s} {path}")
    return "\n".join(lines)


def _print_check(check, nprocs: int, backend: str, as_json: bool) -> None:
    """A real-layer check (exec.api.LayerCheck) as JSON or as text."""
    r, spec = check.report, check.spec
    if as_json:
        print(json.dumps(r, indent=2, default=str))
        return
    res = r.get("resolved") or {}
    for k, v in (res.get("auto") or {}).items():
        print(f"{k}: auto -> {v} (chosen on the config's cluster, as `moesim simulate` would)")
    for note in r.get("notes", []):
        print(note)
    rel = r["max_rel_diff"]
    if check.layout:
        print(
            f"real MoE layer on {nprocs} ranks ({backend}): {r['strategy']}, "
            f"T={spec.tokens} M={spec.model_dim} H={spec.hidden_dim} E={spec.experts} "
            f"k={spec.top_k} C={spec.capacity}"
        )
        print("  max |layout - unsliced reference| / max |reference|")
        for what, d in rel.items():
            print(f"    {what:10s} {d:10.3g}")
    else:
        total = r["kept_choices"] + r["dropped_choices"]
        print(
            f"real MoE layer on {nprocs} ranks ({backend}): T={spec.tokens} M={spec.model_dim} "
            f"H={spec.hidden_dim} E={spec.experts} k={spec.top_k} C={spec.capacity}, "
            f"{r['dropped_choices']} of {total} choices dropped"
        )
        print(f"  max |{r['strategy']} - sequential|  (absolute, relative to max |sequential|)")
        for what, d in r["max_abs_diff"].items():
            print(f"    {what:10s} {d:10.3g} {rel[what]:10.3g}")
        if "routing" in r:
            _print_routing(r["routing"])
    print(f"  {'equal' if check.equal else 'DIFFERENT'} within float32 tolerance")


def _print_routing(g: dict[str, Any]) -> None:
    """The real gate's routing against the simulator's (exec.layers.split_check)."""
    same = "=" if g["kept_equal_simulator"] else "DIFFERENT from"
    print(
        f"  routing {g['kind']}: kept tokens per (rank, expert) {same} the simulator's "
        f"({g['dropped_choices']} choices dropped by capacity)"
    )
    if not g["realisable"]:
        print("  (the simulator's counts are no top-k routing; the gate routes the nearest:")
        for line in g["not_realised"][:8]:
            print(f"    {line}")
        print("  )")
    bad = g["splits_differ"] + g["splits_missing"]
    verdict = "all equal" if not bad else f"{len(bad)} DIFFERENT"
    print(
        f"  all-to-allv splits vs the simulator's graph: {g['splits_checked']} checked, {verdict}"
    )
    if bad and g.get("dropless_graph_vs_drops"):
        print("    (expected: DeepEP's graph is dropless, and this run dropped choices)")
    for line in bad[:8]:
        print(f"    {line}")
