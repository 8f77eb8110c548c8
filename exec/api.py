"""The executor's Python API: what `moesim exec`, `calibrate` and `validate` do, as functions.

`exec.cli` only parses arguments, calls these and prints. Every function needs torch (the
modules it calls import it); importing this module does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exec.layers.moe import MoESpec
    from exec.measure.microbench import Plan
    from sim.config import RunConfig
    from sim.config.cluster import Resolution
    from sim.core.graph import TaskGraph
    from sim.hardware.costs.calibration import Calibration

# float32: outputs agree to rounding; weight gradients are sums over chunks taken in another
# order, so they agree to a few ulps of their magnitude
Y_RTOL, GRAD_RTOL = 1e-5, 1e-4


def _graph_params(meta: dict) -> dict:
    """The parameters a graph was built with (`meta["params"]`, which sim.strategies writes
    on every graph), without the ones the real layer does not take; a graph from before it:
    the meta entries of its strategy's parameter names."""
    from sim.strategies import STRATEGIES

    strat = STRATEGIES.get(meta["strategy"])
    if strat is None:
        return {}
    names = strat.defaults
    given = meta.get("params")
    if not isinstance(given, dict):
        given = {k: meta[k] for k in names if meta.get(k) is not None}
    return {k: v for k, v in given.items() if k in names}


# -- calibration ------------------------------------------------------------------------------


def calibration_plan(
    nprocs: int,
    quick: bool = False,
    shapes_from: str | Path | None = None,
    strategies: list[str] | None = None,
) -> Plan:
    """The microbenchmark plan; with `shapes_from` (a run config) also the exact GEMM shapes
    of its validation graphs on `nprocs` ranks (and of `strategies`' graphs)."""
    from exec.measure.microbench import Plan

    plan = Plan.quick() if quick else Plan()
    if shapes_from:
        from exec.measure.validation import case_graphs
        from sim.config import RunConfig

        cfg = RunConfig.load(shapes_from)
        graphs = case_graphs(cfg, nprocs)
        if strategies:
            graphs += case_graphs(cfg, nprocs, strategies)
        plan = plan.with_shapes_of(graphs)
    return plan


def calibrate(
    nprocs: int, backend: str, plan: Plan, out: str | Path, timeout_s: float = 120.0
) -> tuple[Calibration, Path]:
    """Run the plan on `nprocs` local ranks, fit the cost model and save it at `out` (the raw
    measurements beside it, as <out>.measurements.csv); the calibration and its path."""
    from exec.measure.microbench import calibrate as measure_and_fit
    from sim.analysis.trace import write_table

    cal, rows = measure_and_fit(nprocs, backend, plan, timeout_s)
    path = Path(cal.save(out))
    write_table(rows, path.with_suffix(".measurements.csv"))
    return cal, path


def calibrate_for(
    cfg: RunConfig,
    nprocs: int,
    backend: str,
    out_dir: str | Path,
    strategies: list[str] | None = None,
    quick: bool = False,
    timeout_s: float = 120.0,
) -> str:
    """A calibration for validating `cfg` (its graphs' GEMM shapes profiled exactly), saved
    as <out_dir>/calibration.yaml; its path."""
    from exec.measure.microbench import Plan
    from exec.measure.microbench import calibrate as measure_and_fit
    from exec.measure.validation import case_graphs

    graphs = case_graphs(cfg, nprocs, strategies)
    plan = (Plan.quick() if quick else Plan()).with_shapes_of(graphs)
    cal, _ = measure_and_fit(nprocs, backend, plan, timeout_s)
    return str(cal.save(Path(out_dir) / "calibration.yaml"))


# -- running task graphs ------------------------------------------------------------------------


def load_graph(
    path: str | Path,
    nprocs: int,
    strategy: str | None = None,
    params: list[str] | None = None,
) -> tuple[TaskGraph, RunConfig | None, Resolution | None]:
    """(graph, config or None, resolution or None): a JSON graph as is, a YAML config built
    for nprocs ranks (with --strategy / --param applied, as `moesim simulate` does) with its
    `auto` parameters chosen on the config's cluster (`sim.config.cluster.resolve_for`)."""
    from sim.commands import parse_params
    from sim.config import RunConfig
    from sim.config.cluster import resolve_for
    from sim.core.errors import ConfigError
    from sim.core.graph import TaskGraph
    from sim.strategies import build

    if str(path).endswith(".json"):
        if strategy or params:
            raise ConfigError("--strategy / --param apply to a run config, not to a graph JSON")
        return TaskGraph.from_json(path), None, None
    cfg = RunConfig.load(path).with_overrides(strategy=strategy, params=parse_params(params))
    # the topology sizes the selectors' cluster; the world is the processes we start
    res = resolve_for(cfg, nprocs)
    wl = cfg.workload_for(nprocs)
    graph = build(cfg.strategy, wl.layer, wl.params, cfg.passes, res.cluster, layout=wl.layout)
    return graph, cfg, res


def run_graph(
    graph: TaskGraph,
    nprocs: int,
    out: str | Path,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    warmup: int = 1,
    torchrun: bool = False,
) -> dict[str, Any] | None:
    """Run the graph on `nprocs` local processes (or, with `torchrun`, as this rank of
    torchrun's world) and write the measured trace, Chrome trace and summary.json to `out`.
    The summary, with the files under "files"; None on ranks other than 0 under torchrun."""
    from exec.runtime.launch import check_world, launch, run_under_torchrun
    from exec.runtime.summary import summarize
    from sim.analysis.chrome import write_chrome_trace
    from sim.analysis.trace import write_table
    from sim.core.io import OutputSet, check_output_dir

    check_world(graph, nprocs)
    check_output_dir(out)  # an unusable --out fails before the measurement, not after
    if torchrun:
        res = run_under_torchrun(graph, backend, timeout_s, warmup)
        if res is None:  # not rank 0: rank 0 writes and prints
            return None
    else:
        res = launch(graph, nprocs, backend, timeout_s, warmup)
    summary = summarize(res)
    with OutputSet(out, "exec") as oset:
        write_table(res.trace, oset.path("trace.csv"))
        write_chrome_trace(res.trace, oset.path("trace.chrome.json"), None, graph)
        summary["files"] = {
            "trace": str(oset.final("trace.csv")),
            "chrome_trace": str(oset.final("trace.chrome.json")),
        }
        oset.write_text("summary.json", json.dumps(summary, indent=2))
    return summary


# -- the real MoE layer against its reference -----------------------------------------------------


@dataclass
class LayerCheck:
    """A strategy's real layer against `sequential` (or, for TED with a TP group and Tutel
    on sliced experts, `layout`: against the single-process unsliced reference)."""

    report: dict[str, Any]  # strategy, capacity, max_rel_diff, equal, ... (printed as JSON)
    spec: MoESpec
    layout: bool

    @property
    def equal(self) -> bool:
        return bool(self.report["equal"])


def _equal(rel: dict[str, float]) -> bool:
    return all(r <= (Y_RTOL if what == "y" else GRAD_RTOL) for what, r in rel.items())


def check_layer(
    graph: TaskGraph,
    cfg: RunConfig | None,
    nprocs: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    seed: int = 0,
    torchrun: bool = False,
    resolution: Resolution | None = None,
    record_routing: str | None = None,
) -> LayerCheck | None:
    """Run the real MoE layer of the config's strategy (or of a graph built by
    sim.strategies, whose meta carries its layer and strategy) forward and backward, and
    compare outputs and gradients with the reference. None on ranks other than 0 under
    torchrun. A config's `auto` parameters run as `resolution` (`load_graph`) resolved
    them; under a routing model the gate reproduces the simulator's token counts and the
    report compares them and the all-to-allv splits with the simulator's graph.
    `record_routing`: a router map file (`sim.workload.routing.replay`) to write the real
    gate's choices to, for `{kind: replay}` runs."""
    from dataclasses import replace

    from exec.errors import ExecError
    from exec.layers.layouts import needs_layouts
    from exec.layers.moe import MoESpec
    from sim.workload.moe import MoELayer

    if cfg is not None:
        lay = cfg.workload_for(nprocs).layout
        if lay is not None and lay.dp > 1:
            raise ExecError(
                f"parallel.dp {lay.dp}: the real layer (--moe) runs one expert-parallel group; "
                "run the graph without --moe to execute every replica"
            )
        layer = cfg.layer(nprocs)
        if resolution is None:
            from sim.config.cluster import resolve_for

            resolution = resolve_for(cfg, nprocs)
        # the config's parameters with every `auto` one as its selector chose it
        name, params = cfg.strategy, {**cfg.strategy_params, **resolution.resolved.chosen}
        if name == "deepep" and params.get("gpus_per_node") is None:
            # as `moesim simulate` builds it: nodes of the config's topology
            params["gpus_per_node"] = cfg.load_topology().gpus_per_node
    else:  # a graph from sim.strategies carries its layer and strategy in meta
        meta = graph.meta
        if "layer" not in meta or "strategy" not in meta:
            raise ExecError("--moe needs a run config, or a graph built by sim.strategies")
        fields = {k: v for k, v in meta["layer"].items() if k not in ("routing", "capacity")}
        layer = MoELayer(**fields)
        name = meta["strategy"]
        params = _graph_params(meta)
    layer, dropless_note = _dropless_for(layer, name)
    spec = MoESpec.from_layer(layer, seed=seed)
    resolved: dict[str, Any] = {}
    if resolution is not None:
        resolved["resolved"] = resolution.resolved.as_dict()
    if resolution is not None and resolution.notes:
        resolved["notes"] = resolution.notes
    if dropless_note:
        resolved["notes"] = [*resolved.get("notes", []), dropless_note]
    if needs_layouts(name, params, spec):  # sliced experts, TP groups: the gate's own routing
        if record_routing is not None:
            raise ExecError(
                f"--record-routing: {name}'s layout runs the reference layer, whose gate is "
                "not the one the strategy runs; record with another strategy"
            )
        spec = replace(spec, demand=None)
        report = _check_layout(spec, name, params, nprocs, backend, timeout_s, torchrun)
        return None if report is None else LayerCheck(report | resolved, spec, layout=True)
    passes = tuple(cfg.passes if cfg is not None else graph.meta.get("passes", []))
    report = _check_against_sequential(
        spec, name, params, nprocs, backend, timeout_s, "bwd" in passes, torchrun
    )
    if report is None:
        return None
    if record_routing is not None:
        _record_routing(record_routing, report["_ranks"], spec)
        report["recorded_routing"] = record_routing
    if spec.demand is not None:
        from exec.layers.split_check import compare
        from sim.workload.gate_plan import plan

        run_ranks = report.pop("_ranks")
        routing = compare(run_ranks, report["strategy"], layer, plan(layer), name, params, passes)
        report["routing"] = routing
        # a routing the gate can realise must be realised; one it cannot is reported
        report["equal"] = report["equal"] and (routing["matches"] or not routing["realisable"])
    report.pop("_ranks", None)
    return LayerCheck(report | resolved, spec, layout=False)


def _dropless_for(layer: Any, name: str) -> tuple[Any, str | None]:
    """A token-level real layer (DeepEP's) keeps every choice, as its kernels do and its
    graph models: the check runs the layer dropless (sequential too, so that both keep the
    same choices), with a note; other layers as configured."""
    from dataclasses import replace

    from exec.layers.registry import STRATEGIES as LAYERS

    fn = LAYERS.get(name)
    if layer.dropless or fn is None or not getattr(fn, "token_level", False):
        return layer, None
    note = (
        f"{name} is dropless: its layer and the sequential reference keep every routed choice "
        f"(the config's capacity factor {layer.capacity_factor:g} does not apply)"
    )
    return replace(layer, dropless=True), note


def _record_routing(path: str, ranks: list[dict[str, Any]], spec: Any) -> None:
    """The sequential run's gate choices of every rank as a one-step, one-layer router map."""
    import numpy as np

    from sim.workload.routing.replay import counts_from_choices, write

    choices = np.stack([r["variants"]["sequential"]["expert"] for r in ranks])  # [P, T, k]
    counts = counts_from_choices(choices, spec.experts)[None, None]
    write(path, counts, experts=spec.experts, top_k=spec.top_k, tokens=spec.tokens)


def _check_layout(
    spec: MoESpec,
    name: str,
    params: dict,
    nprocs: int,
    backend: str,
    timeout_s: float,
    torchrun: bool,
) -> dict[str, Any] | None:
    """TED with a TP group, or Tutel on sliced experts: checked against the single-process
    reference of the unsliced layer (there is no `sequential` run of such a layout)."""
    from exec.layers.layouts import Case, diff_from_reference, layout_job, run_layouts
    from exec.runtime.launch import call_under_torchrun

    case = Case(spec, name, dict(params))
    if torchrun:
        ranks = call_under_torchrun(layout_job, ([case], timeout_s, backend), backend)
        if ranks is None:
            return None
    else:
        ranks = run_layouts([case], nprocs, backend, timeout_s)
    rel = diff_from_reference(case, ranks)
    report = {"strategy": case.label, "capacity": spec.capacity, "max_rel_diff": rel}
    report["equal"] = _equal(rel)
    return report


def _check_against_sequential(
    spec: MoESpec,
    name: str,
    params: dict,
    nprocs: int,
    backend: str,
    timeout_s: float,
    backward: bool,
    torchrun: bool,
) -> dict[str, Any] | None:
    from exec.layers.run import MoERun, Variant, moe_job, run_moe
    from exec.runtime.launch import call_under_torchrun

    variants = [Variant("sequential")]
    if name != "sequential":
        variants.append(Variant(name, params))
    if torchrun:
        job_args = (spec, variants, timeout_s, backward, backend)
        ranks = call_under_torchrun(moe_job, job_args, backend)
        if ranks is None:
            return None
        run = MoERun(spec, ranks)
    else:
        run = run_moe(spec, variants, nprocs, backend, timeout_s, backward)
    label = variants[-1].label
    rel = run.max_rel_diff(label)
    kept = sum(int((r["variants"]["sequential"]["slot"] >= 0).sum()) for r in run.ranks)
    total = sum(r["variants"]["sequential"]["slot"].size for r in run.ranks)
    return {
        "strategy": label,
        "capacity": spec.capacity,
        "kept_choices": kept,
        "dropped_choices": total - kept,
        "max_abs_diff": run.max_abs_diff(label),
        "max_rel_diff": rel,
        "equal": _equal(rel),
        "forward_s": {v.label: run.ranks[0]["variants"][v.label]["forward_s"] for v in variants},
        "_ranks": run.ranks,  # for the routing check (removed from the report)
    }
