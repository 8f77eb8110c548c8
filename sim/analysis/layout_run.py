"""One replica's graph simulated over every data-parallel replica of a parallel layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.core.graph import TaskGraph
from sim.engine.result import SimResult
from sim.engine.symmetric import simulate_replicas
from sim.hardware.topology import Topology
from sim.workload.parallel import ParallelLayout, replicate


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
    ranks = np.stack([layout.replica_ranks(d) for d in range(layout.dp)])
    meta = dict(one.meta) | {"layout": layout.as_dict()}

    def full() -> TaskGraph:
        if before_full is not None:
            before_full()
        return replicate(one, layout)

    return simulate_replicas(
        one, topo, costs, ranks, full=full, prefix="dp0/", meta=meta, record_links=record_links
    )
