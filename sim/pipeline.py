"""The run pipeline: a run config built and simulated (`build_and_simulate`: what `sim.run`,
`moesim simulate` and sweeps share), one replica's graph simulated over every data-parallel
replica of its parallel layout (`simulate_layout`: also what `compare` runs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.core.graph import TaskGraph
from sim.engine.result import SimResult
from sim.engine.symmetric import simulate_replicas
from sim.hardware.topology import Topology
from sim.workload import dp_span
from sim.workload.parallel import ParallelLayout, check_replica, replicate


def simulate_layout(
    one: TaskGraph,
    layout: ParallelLayout | None,
    topo: Topology,
    costs: Any,
    before_full: Callable[[], None] | None = None,
    record_links: bool = False,
) -> SimResult:
    """On representatives where the replicas and nodes are equivalent (`costs.symmetry`,
    sim.engine.symmetric), else on the full graph that `replicate` lays over the world; so
    16,384 GPUs never build 16,384 ranks' tasks where symmetry holds. `before_full` runs
    before the full graph is built (the size guards of what it will build); `record_links`
    keeps the utilisation of each link class over time (for a trace's counters)."""
    import numpy as np

    if layout is None or layout.dp == 1:
        return simulate_replicas(one, topo, costs, record_links=record_links)
    check_replica(one, layout)
    ranks = np.stack([layout.replica_ranks(d) for d in range(layout.dp)])
    meta = dict(one.meta) | {"layout": layout.as_dict()}

    def full() -> TaskGraph:
        if before_full is not None:
            before_full()
        return dp_span.spread(replicate(one, layout), layout.replica)  # gradient reductions

    return simulate_replicas(
        one, topo, costs, ranks, full=full, prefix="dp0/", meta=meta, record_links=record_links
    )


@dataclass
class ConfigRun:
    """A run config built and simulated: its result, trace table, summary and workload."""

    result: SimResult
    table: Any  # sim.analysis.trace.columns.TraceTable, one row per executed task
    summary: dict[str, Any]
    workload: Any  # sim.config.Workload
    wall_s: dict[str, float]


def build_and_simulate(
    cfg: Any,
    edit_topology: Callable[[Topology], Topology] | None = None,
    edit_costs: Callable[[Any], Any] | None = None,
    record_links: bool = False,
) -> ConfigRun:
    """Build one config's graph (one replica's) and simulate it over its layout, inside the
    config's size limits: the ranks, tasks and flows bounded before they are built or run.
    The one path `sim.run` and sweeps share; `edit_topology` / `edit_costs` apply what-if
    changes (link speeds, compute speed) to the loaded cluster; `record_links` samples each
    link class's utilisation over time (for the Chrome trace's counters)."""
    from sim.analysis.guards import check_flows, finite_summary, jitter_replicas
    from sim.analysis.summary import summarize
    from sim.analysis.trace import table
    from sim.core.limits import applied
    from sim.hardware.costs import CostModel
    from sim.strategies import Cluster, build

    with applied(cfg.size_limits()) as lim:
        topo = cfg.load_topology()
        if edit_topology is not None:
            topo = edit_topology(topo)
        wl = cfg.workload(topo)
        costs = CostModel.build(topo, cfg.costs)
        if edit_costs is not None:
            costs = edit_costs(costs)
        reps = jitter_replicas(costs)
        # the ranks actually built: one replica's (the others are folded onto it by symmetry,
        # or laid over the world only where it does not hold, checked again then)
        lim.check_run(wl.layer.world, cfg.source, replicas=reps)
        t0 = time.perf_counter()
        one = build(
            cfg.strategy, wl.layer, wl.params, cfg.passes, Cluster(topo, costs), blocks=wl.blocks
        )
        lim.check_run(one.world_size, cfg.source, len(one), reps)
        dp = 1 if wl.layout is None else wl.layout.dp
        check_flows(lim, one, costs, cfg.source)  # one replica's: the others are folded
        t1 = time.perf_counter()
        res = simulate_layout(
            one,
            wl.layout,
            topo,
            costs,
            before_full=lambda: lim.check_run(one.world_size * dp, cfg.source, len(one) * dp, reps),
            record_links=record_links,
        )
        t2 = time.perf_counter()
        df = table(res)  # no pandas: `sim.run` makes the DataFrame
        summary = summarize(res, df)
    if cfg.parallel is not None and wl.layout is not None:
        summary["parallel"] = wl.layout.as_dict()
    wall = {"build": t1 - t0, "simulate": t2 - t1}
    return ConfigRun(res, df, finite_summary(summary), wl, wall)
