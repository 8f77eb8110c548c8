"""Lancet's cost sources (Sec. 5: a caching op profiler and a communication cost model built
by profiling all-to-alls at many sizes), as the simulator has them.

Compute: the run's compute cost model on the (partitioned) operator. Communication: where the
run's network is `collective` (alpha-beta fits per collective), the fit; where it is `flow`
(per-message start-up and shared links), the exchange is "profiled": simulated alone on the
cluster by the engine, every member sending the task's bytes (the paper's static-shape
estimate of an irregular all-to-all: its uniform equivalent), and cached by size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph

A2A_KINDS = ("all_to_all", "all_to_allv")


def duration_fn(cluster: Any) -> Callable[[Task], float]:
    """A task's time as Lancet's profiler and communication cost model see it."""
    costs, topo = cluster.costs, cluster.topology
    cache: dict[tuple, float] = {}

    def duration(t: Task) -> float:
        if not t.is_comm:
            return costs.compute.duration(t)
        group = t.group or [t.rank]
        if costs.network != "collective" and t.kind in A2A_KINDS and len(group) > 1:
            key = (t.kind, tuple(group), float(t.bytes), t.algo)
            if key not in cache:
                cache[key] = profile_a2a(topo, costs, group, float(t.bytes), t.algo)
            return cache[key]
        try:
            return costs.comm_duration(t, t.kind, len(group))
        except ConfigError:  # no collective fit: the bottleneck route of an even exchange
            return a2a_estimate(topo, group, t.bytes, costs.alpha)

    return duration


def profile_a2a(topo: Any, costs: Any, group: list[int], nbytes: float, algo: str | None) -> float:
    """The time of one even all-to-all of `nbytes` per member, simulated alone."""
    from sim.engine.engine import simulate

    g = TaskGraph(max(group) + 1, meta={"strategy": "lancet-profile"})
    for r in group:
        g.add(
            Task(
                f"r{r}/a2a",
                r,
                "comm",
                "all_to_all",
                bytes=nbytes,
                group=list(group),
                coll="profile",
                algo=algo,
                tags={"phase": "fwd"},
            )
        )
    return float(simulate(g, topo, costs).makespan)


def a2a_estimate(topo: Any, group: list[int], nbytes: float, alpha: float) -> float:
    """An all-to-all's time as Lancet's profiled model would see it, where no fit is given:
    every member sends (n-1)/n of its bytes, as fast as the slowest link on a route from
    the first member allows (its NIC where the group spans nodes)."""
    n = len(group)
    if n < 2:
        return alpha
    cap = min(float(topo.link_cap[topo.route(group[0], p)].min()) for p in group[1:])
    return alpha + nbytes * (n - 1) / n / cap
