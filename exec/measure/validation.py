"""`moesim validate`: the same graphs measured and simulated, compared in a report.

The set: `sequential` and `pipelined` r = 1, 2, 4, 8 (those the layer's capacity allows),
forward only and forward + backward, for the config's layer on `nprocs` ranks. Each graph is
executed `repeats` times and the run with the median makespan is kept (a 2-core machine is
noisy); the simulator replays it on `topology` (default `localhost-cpu`, one node per rank)
with the calibration. The report (sim.analysis.validate) gives per-graph makespan error, per-kind
error and, per config (pass set), the simulator's pick against the measured best, the measured
margins and the rank correlation of the two sides (sim.analysis.validate.picks), and says how
far it can be trusted: the host's load while measuring and the run-to-run spread of each
graph's makespan, with a warning when the spread is larger than the error the report gives
(noise the model cannot be judged by), and when the ranks' threads outnumber the cores.

Every case is built and simulated before anything is measured (`preflight`): a strategy the
topology cannot simulate (DeepEP on localhost-cpu: no SM count) fails the command at once, in
one line naming it (exit 2). It is refused rather than skipped: a report that silently lacks
a strategy the user asked for would answer another question than the one asked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exec.runtime.launch import launch_runs
from sim.analysis.trace import to_frame, write_table
from sim.analysis.validate import compare, summarize, write_report
from sim.config import RunConfig
from sim.core.graph import TaskGraph
from sim.core.io import atomic_write_text
from sim.core.progress import echo, iterate
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.calibration import Calibration
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.workload.moe import MoELayer


@dataclass
class Case:
    name: str
    strategy: str
    params: dict[str, Any]
    passes: tuple[str, ...]
    entry: str = ""  # as the user named it ('name' or 'name:key=value,...')

    @property
    def group(self) -> str:
        """The config it belongs to: its pass set (the pick is among the same passes)."""
        return "+".join(self.passes)


def cases(capacity: int, strategies: list[str] | None = None) -> list[Case]:
    """Sequential and pipelined r = 1, 2, 4, 8, forward and forward + backward; with
    `strategies` (`moesim compare` entries: 'name' or 'name:key=value,...') those instead."""
    from sim.analysis.compare import parse_entry

    out = []
    for passes in (("fwd",), ("fwd", "bwd")):
        tag = "+".join(passes)
        if strategies:
            for entry in strategies:
                name, params = parse_entry(entry)
                out.append(Case(f"{entry} {tag}", name, params, passes, entry))
            continue
        out.append(Case(f"sequential {tag}", "sequential", {}, passes, "sequential"))
        for r in (1, 2, 4, 8):
            if r <= capacity:
                name, entry = f"pipelined r={r} {tag}", f"pipelined:degree={r}"
                out.append(Case(name, "pipelined", {"degree": r}, passes, entry))
    return out


def case_graph(
    cfg: RunConfig, layer: MoELayer, case: Case, cluster: Cluster | None = None
) -> TaskGraph:
    """The case's graph; `cluster` (the calibrated one) is what strategies' selectors read."""
    params = {**case.params}
    if case.strategy == "pipelined":
        params.setdefault("order", cfg.strategy_params.get("order", "tutel"))
    return build(case.strategy, layer, params, case.passes, cluster)


def case_graphs(
    cfg: RunConfig, nprocs: int, strategies: list[str] | None = None
) -> list[TaskGraph]:
    """The graphs `validate` runs, e.g. to profile their GEMM shapes before it does; a case
    whose `auto` parameters need the calibrated cluster (not measured yet) is left out:
    its GEMMs are then costed by the alpha-beta fit, not profiled."""
    from sim.core.errors import ConfigError

    layer = cfg.layer(nprocs)
    out = []
    for c in cases(layer.capacity, strategies):
        try:
            out.append(case_graph(cfg, layer, c))
        except ConfigError as e:
            if "auto" not in str(e):
                raise
    return out


def _placeholder(nprocs: int) -> Calibration:
    """A calibration with a fit for every kind a graph may cost (1 ms + 1 ns per unit of
    work; every GEMM dtype), standing in for the one not measured yet, so that `preflight`
    can build and simulate every case on the topology before anything is measured."""
    from sim.core.kinds import COLLECTIVE_KINDS, COMPUTE_KINDS, COPY_KINDS
    from sim.hardware.costs.gemm import DTYPE_BYTES

    fit = {"alpha": 1e-3, "beta": 1e-9}
    compute: dict[str, Any] = {k: dict(fit) for k in sorted(COMPUTE_KINDS | COPY_KINDS)}
    compute["gemm"] = {dt: dict(fit) for dt in DTYPE_BYTES}
    coll = {k: [{"ranks": nprocs, **fit}] for k in sorted(COLLECTIVE_KINDS)} if nprocs > 1 else {}
    return Calibration(compute, coll)


def preflight(
    cfg: RunConfig,
    nprocs: int,
    topology: str = "localhost-cpu",
    strategies: list[str] | None = None,
    calibration: str | None = None,
) -> list[tuple[Case, TaskGraph, Any]]:
    """Build and simulate every case on the topology before anything is measured (with a
    placeholder calibration when none is named yet: what fails there fails whatever the
    measurement). A case that cannot be simulated fails the command at once, in one line
    naming the strategy and why: `validate` never measures for minutes and then dies (issue
    29: DeepEP on localhost-cpu, whose CPU "GPU" has no SM count). The cases, their graphs
    and simulated results."""
    import tempfile

    from sim.core.errors import ConfigError, MoesimError

    layer = cfg.layer(nprocs)
    per_node = Topology.load(topology, nodes=1).gpus_per_node
    topo = Topology.load(topology, nodes=-(-nprocs // per_node))
    with tempfile.TemporaryDirectory() as tmp:
        cal = calibration
        if cal is None:
            cal = str(_placeholder(nprocs).save(Path(tmp) / "placeholder.yaml"))
        costs = CostModel.build(topo, {"calibration": cal, **measured_host(topo, nprocs)})
        cluster = Cluster(topo, costs)
        out = []
        for c in cases(layer.capacity, strategies):
            try:
                graph = case_graph(cfg, layer, c, cluster)
                out.append((c, graph, simulate(graph, topo, costs)))
            except MoesimError as e:
                raise ConfigError(
                    f"validate: {c.entry or c.strategy} cannot be simulated on {topology} "
                    f"({'+'.join(c.passes)}): {e}; leave it out of --strategies or name a "
                    f"--topology that can simulate it (nothing was measured)"
                ) from None
    return out


def measured_host(topo: Topology, nprocs: int) -> dict[str, Any]:
    """`costs.shared_cpu` of the host the ranks run on here (its cores, and the threads the
    executor gives each rank), so that the simulated host is the measured one; nothing for
    a topology without a shared CPU (a GPU's)."""
    from exec.runtime.launch import host_cores, rank_threads

    if topo.spec.get("shared_cpu") is None:
        return {}
    return {"shared_cpu": {"cores": host_cores(), "threads_per_rank": rank_threads(nprocs)}}


def validate(
    cfg: RunConfig,
    nprocs: int,
    calibration: str,
    out_dir: Path,
    backend: str = "gloo",
    topology: str = "localhost-cpu",
    repeats: int = 3,
    timeout_s: float = 120.0,
    log: Callable[[str], None] = echo,
    strategies: list[str] | None = None,
) -> dict[str, Any]:
    from exec.runtime.launch import oversubscription

    layer = cfg.layer(nprocs)
    results = []
    # every graph is built and simulated before anything is measured: a case that cannot be
    # fails the command at once, not after minutes of measurements
    todo = preflight(cfg, nprocs, topology, strategies, calibration)
    loads = [_load()]
    for case, graph, sim in iterate(todo, "validate", "graph"):  # a bar on stderr, if watched
        measured, spans = _median_run(graph, nprocs, backend, repeats, timeout_s)
        loads.append(_load())
        simulated = to_frame(sim)
        r = compare(case.name, measured, simulated)
        r["group"] = case.group
        r["measured_runs_s"] = spans
        results.append(r)
        slug = re.sub(r"[^A-Za-z0-9.]+", "_", case.name.replace("=", "")).strip("_")
        write_table(measured, out_dir / "traces" / f"{slug}.measured.csv")
        write_table(simulated, out_dir / "traces" / f"{slug}.simulated.csv")
        log(
            f"  {case.name:26s} measured {r['measured_s'] * 1e3:9.3f} ms "
            f"({min(spans) * 1e3:.2f}-{max(spans) * 1e3:.2f})  simulated "
            f"{r['simulated_s'] * 1e3:9.3f} ms  error {r['error_pct']:+6.1f}%"
        )
    context = {
        "layer": f"B={layer.batch} L={layer.seq_len} M={layer.model_dim} H={layer.hidden_dim} "
        f"E={layer.experts} top-{layer.top_k} f={layer.capacity_factor} "
        f"C={layer.capacity} {layer.dtype}",
        "ranks": f"{nprocs} ({backend})",
        "measured": f"median makespan of {repeats} runs per graph",
        "simulated": f"{topology} with calibration {calibration}",
    }
    shared = oversubscription(nprocs)
    if shared:
        context["cores"] = shared
    trust = trustworthiness(results, loads, repeats)
    context.update(trust.pop("context"))
    if trust["warning"]:
        log(f"  WARNING: {trust['warning']}")
    files = write_report(results, out_dir, "moesim validation: simulated vs measured", context)
    summary = {
        "summary": {**summarize(results), "trust": trust},
        "results": results,
        "context": context,
        "files": {k: str(v) for k, v in files.items()},
    }
    import json

    atomic_write_text(out_dir / "validation.json", json.dumps(summary, indent=2, default=str))
    return summary


def _median_run(graph: TaskGraph, nprocs: int, backend: str, repeats: int, timeout_s: float):
    """The trace of the run with the median makespan, and every run's makespan (the spread
    says how much of a graph-to-graph difference is noise); the runs share one launch."""
    runs = launch_runs(graph, nprocs, max(repeats, 1), backend, timeout_s)
    spans = [r.makespan for r in runs]
    order = np.argsort(spans)
    return runs[int(order[len(order) // 2])].trace, spans


BUSY_LOAD = 1.25  # load average per CPU above which the host counts as busy


def _load() -> float | None:
    """The host's 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def trustworthiness(
    results: list[dict[str, Any]], loads: list[float | None], repeats: int
) -> dict[str, Any]:
    """How far the comparison can be trusted: the run-to-run spread of each graph's makespan
    ((max - min) / median over its runs), the host's load while measuring, and a warning when
    the spread is larger than the error the report gives."""
    spread = [
        100.0 * (max(r) - min(r)) / float(np.median(r))
        for r in (res.get("measured_runs_s") or [res["measured_s"]] for res in results)
        if len(r) > 1 and np.median(r) > 0
    ]
    mape = summarize(results)["mape_pct"]
    seen = [x for x in loads if x is not None]
    cpus = os.cpu_count() or 1
    out: dict[str, Any] = {
        "spread_pct_median": float(np.median(spread)) if spread else None,
        "spread_pct_max": max(spread) if spread else None,
        "load_max": max(seen) if seen else None,
        "cpus": cpus,
        "warning": None,
    }
    ctx = {}
    if spread:
        ctx["run-to-run spread"] = (
            f"median {out['spread_pct_median']:.1f}%, worst {out['spread_pct_max']:.1f}% of a "
            f"graph's makespan ((max - min) / median of {repeats} runs)"
        )
    if seen:
        ctx["host load"] = (
            f"1-minute load average {min(seen):.1f} to {max(seen):.1f} on {cpus} CPUs"
        )
    problems = []
    if spread and out["spread_pct_median"] > mape:
        problems.append(
            f"the run-to-run spread (median {out['spread_pct_median']:.1f}%) is larger than the "
            f"error reported (MAPE {mape:.1f}%): noise, not the model, decides this comparison"
        )
    # the load counts this validation's own ranks, whose threads alone bring it near the CPU
    # count: well above that, something else was running
    if seen and max(seen) > BUSY_LOAD * cpus:
        problems.append(f"the host was busy (load {max(seen):.1f} on {cpus} CPUs) while measuring")
    if not spread:
        problems.append("one run per graph: the run-to-run spread is unknown (--repeats 3+)")
    if problems:
        out["warning"] = "; ".join(problems) + ". Measure again on an idle machine."
        ctx["WARNING"] = out["warning"]
    out["context"] = ctx
    return out
