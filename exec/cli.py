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
    c.add_argument("--out", default="calibration.yaml", help="calibration file to write")
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
    v.add_argument("--out", default="reports/validation", help="report directory")
    v.add_argument("--timeout", type=float, default=120.0)
    v.set_defaults(fn=cmd_validate)
    return v


def _check_procs(nprocs: int, timeout: float) -> None:
    from exec.errors import ExecError

    if nprocs < 1:
        raise ExecError(f"--nprocs must be >= 1, got {nprocs}")
    if timeout <= 0:
        raise ExecError(f"--timeout must be > 0 seconds, got {timeout:g}")


def cmd_calibrate(a: argparse.Namespace) -> int:
    from exec.errors import require_torch
    from exec.measure.microbench import Plan, calibrate
    from sim.analysis.trace import write_table

    require_torch()
    _check_procs(a.nprocs, a.timeout)
    plan = Plan.quick() if a.quick else Plan()
    if a.shapes_from:
        from exec.measure.validation import case_graphs
        from sim.config import RunConfig

        cfg = RunConfig.load(a.shapes_from)
        graphs = case_graphs(cfg, a.nprocs)
        if a.strategies:
            graphs += case_graphs(cfg, a.nprocs, a.strategies)
        plan = plan.with_shapes_of(graphs)
    print(f"calibrating {a.nprocs} ranks ({a.backend})")
    cal, rows = calibrate(a.nprocs, a.backend, plan, a.timeout)
    path = cal.save(a.out)
    write_table(rows, Path(path).with_suffix(".measurements.csv"))
    for line in cal.describe():
        print(line)
    print(f"  wrote {path}")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    from exec.errors import require_torch
    from exec.measure.microbench import Plan, calibrate
    from exec.measure.validation import case_graphs, validate
    from sim.config import RunConfig

    require_torch()
    _check_procs(a.nprocs, a.timeout)
    cfg = RunConfig.load(a.config)
    out = Path(a.out)
    calibration = a.calibration
    if calibration is None:
        print(f"no --calibration: calibrating {a.nprocs} ranks first")
        graphs = case_graphs(cfg, a.nprocs, a.strategies)
        plan = (Plan.quick() if a.quick else Plan()).with_shapes_of(graphs)
        cal, _ = calibrate(a.nprocs, a.backend, plan, a.timeout)
        calibration = str(cal.save(out / "calibration.yaml"))
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
    e.add_argument("--out", help="output directory (default: output.dir of a config, or out/exec)")
    e.add_argument(
        "--moe",
        action="store_true",
        help="run the real MoE layer with the config's strategy and compare it to sequential",
    )
    e.add_argument("--seed", type=int, default=0, help="seed of the real layer's data (--moe)")
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
    graph, cfg = _load(a.graph, nprocs, a.strategy, a.param)
    out = Path(a.out or (cfg.output.get("dir") if cfg is not None else None) or "out/exec")
    if a.moe:
        return _run_moe(a, graph, cfg, nprocs, torchrun)
    return _run_graph(a, graph, nprocs, torchrun, out)


def _load(path: str, nprocs: int, strategy: str | None = None, params: list[str] | None = None):
    """(graph, config or None): a JSON graph as is, a YAML config built for nprocs ranks
    (with --strategy / --param applied, as `moesim simulate` does)."""
    from sim.api import parse_params
    from sim.config import RunConfig
    from sim.core.errors import ConfigError
    from sim.core.graph import TaskGraph
    from sim.strategies import build

    if str(path).endswith(".json"):
        if strategy or params:
            raise ConfigError("--strategy / --param apply to a run config, not to a graph JSON")
        return TaskGraph.from_json(path), None
    cfg = RunConfig.load(path).with_overrides(strategy=strategy, params=parse_params(params))
    # the topology only sizes simulations; here the world is the processes we start
    layer = cfg.layer(nprocs)
    return build(cfg.strategy, layer, cfg.strategy_params, cfg.passes), cfg


def _run_graph(a: argparse.Namespace, graph, nprocs: int, torchrun: bool, out: Path) -> int:
    from exec.runtime.launch import check_world, launch, run_under_torchrun
    from exec.runtime.summary import summarize
    from sim.analysis.trace import write_chrome_trace, write_table
    from sim.core.io import atomic_write_text

    check_world(graph, nprocs)
    if torchrun:
        res = run_under_torchrun(graph, a.backend, a.timeout, a.warmup)
        if res is None:  # not rank 0: rank 0 writes and prints
            return 0
    else:
        res = launch(graph, nprocs, a.backend, a.timeout, a.warmup)
    summary = summarize(res)
    summary["files"] = {
        "trace": str(write_table(res.trace, out / "trace.csv")),
        "chrome_trace": str(write_chrome_trace(res.trace, out / "trace.chrome.json")),
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_format(summary))
    return 0


def _format(s: dict[str, Any]) -> str:
    lines = [
        f"executed {s['tasks']} tasks on {s['ranks']} ranks ({s['backend']}, {s['device']})",
        f"  makespan (measured)  {s['makespan_s'] * 1e3:.3f} ms",
        f"  clock alignment      offsets to rank 0 within +-{s['clock_bound_us']:.1f} us",
    ]
    for stream, busy in s["busy_s"].items():
        lines.append(f"  busy {stream:14s}  {busy * 1e3:.3f} ms (mean over ranks)")
    lines.append(f"  exposed comm         {s['exposed_comm_s'] * 1e3:.3f} ms (mean over ranks)")
    for name, path in s.get("files", {}).items():
        lines.append(f"  wrote {name:13s} {path}")
    return "\n".join(lines)


def _run_layout(a: argparse.Namespace, spec, name: str, params: dict, nprocs: int, torchrun) -> int:
    """TED with a TP group, or Tutel on sliced experts: checked against the single-process
    reference of the unsliced layer (there is no `sequential` run of such a layout)."""
    from exec.layers.layouts import Case, diff_from_reference, layout_job, run_layouts
    from exec.runtime.launch import call_under_torchrun

    case = Case(spec, name, dict(params))
    if torchrun:
        ranks = call_under_torchrun(layout_job, ([case], a.timeout, a.backend), a.backend)
        if ranks is None:
            return 0
    else:
        ranks = run_layouts([case], nprocs, a.backend, a.timeout)
    rel = diff_from_reference(case, ranks)
    equal = all(r <= (1e-5 if what == "y" else 1e-4) for what, r in rel.items())
    report = {"strategy": case.label, "capacity": spec.capacity, "max_rel_diff": rel}
    report["equal"] = equal
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"real MoE layer on {nprocs} ranks ({a.backend}): {case.label}, "
            f"T={spec.tokens} M={spec.model_dim} H={spec.hidden_dim} E={spec.experts} "
            f"k={spec.top_k} C={spec.capacity}"
        )
        print("  max |layout - unsliced reference| / max |reference|")
        for what, d in rel.items():
            print(f"    {what:10s} {d:10.3g}")
        print(f"  {'equal' if equal else 'DIFFERENT'} within float32 tolerance")
    return 0 if equal else 1


def _run_moe(a: argparse.Namespace, graph, cfg, nprocs: int, torchrun: bool) -> int:
    from exec.errors import ExecError
    from exec.layers.moe import MoESpec
    from exec.layers.run import MoERun, Variant, moe_job, run_moe
    from exec.runtime.launch import call_under_torchrun
    from sim.workload.moe import MoELayer

    if cfg is not None:
        layer = cfg.layer(nprocs)
        name, params = cfg.strategy, dict(cfg.strategy_params)
    else:  # a graph from sim.strategies carries its layer and strategy in meta
        meta = graph.meta
        if "layer" not in meta or "strategy" not in meta:
            raise ExecError("--moe needs a run config, or a graph built by sim.strategies")
        fields = {k: v for k, v in meta["layer"].items() if k not in ("routing", "capacity")}
        layer = MoELayer(**fields)
        name = meta["strategy"]
        params = {k: meta[k] for k in ("degree", "order") if name == "pipelined" and k in meta}
    spec = MoESpec.from_layer(layer, seed=a.seed)
    from exec.layers.layouts import needs_layouts

    if needs_layouts(name, params, spec):
        return _run_layout(a, spec, name, params, nprocs, torchrun)
    variants = [Variant("sequential")]
    if name != "sequential":
        variants.append(Variant(name, params))
    backward = "bwd" in (cfg.passes if cfg is not None else graph.meta.get("passes", []))
    if torchrun:
        job_args = (spec, variants, a.timeout, backward, a.backend)
        ranks = call_under_torchrun(moe_job, job_args, a.backend)
        if ranks is None:
            return 0
        run = MoERun(spec, ranks)
    else:
        run = run_moe(spec, variants, nprocs, a.backend, a.timeout, backward)
    label = variants[-1].label
    diff = run.max_abs_diff(label)
    rel = run.max_rel_diff(label)
    # float32: outputs agree to rounding; weight gradients are sums over chunks taken in
    # another order, so they agree to a few ulps of their magnitude
    equal = all(r <= (1e-5 if what == "y" else 1e-4) for what, r in rel.items())
    kept = sum(int((r["variants"]["sequential"]["slot"] >= 0).sum()) for r in run.ranks)
    total = sum(r["variants"]["sequential"]["slot"].size for r in run.ranks)
    report = {
        "strategy": label,
        "capacity": spec.capacity,
        "kept_choices": kept,
        "dropped_choices": total - kept,
        "max_abs_diff": diff,
        "max_rel_diff": rel,
        "equal": equal,
        "forward_s": {v.label: run.ranks[0]["variants"][v.label]["forward_s"] for v in variants},
    }
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"real MoE layer on {nprocs} ranks ({a.backend}): T={spec.tokens} M={spec.model_dim} "
            f"H={spec.hidden_dim} E={spec.experts} k={spec.top_k} C={spec.capacity}, "
            f"{total - kept} of {total} choices dropped"
        )
        print(f"  max |{label} - sequential|  (absolute, relative to max |sequential|)")
        for what, d in diff.items():
            print(f"    {what:10s} {d:10.3g} {rel[what]:10.3g}")
        print(f"  {'equal' if equal else 'DIFFERENT'} within float32 tolerance")
    return 0 if equal else 1
