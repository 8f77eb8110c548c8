"""Lancet (paper 004): whole-graph overlap of the all-to-alls.

The MoE layer is Tutel-style pipelined (`degree` chunks of the capacity, Tutel issue order);
on a model of many blocks (`model.blocks`) the weight-gradient schedule pass
(`sim.strategies.lancet.dw_schedule`, Sec. 4 / Alg. 1) then moves the backward's weight
gradients into the all-to-all windows, timed by the run's cost model. The operator
partition pass of Sec. 5.1 is not built yet.
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.lancet.dw_schedule import schedule_dw
from sim.strategies.layer import build_layer
from sim.workload.moe import MoELayer

NAME = "lancet"
DEFAULTS: dict[str, Any] = {"degree": 1, "algo": None}


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    return build_layer(
        layer,
        degree=params["degree"],
        order="tutel",
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
    )


def model_pass(graph: TaskGraph, params: dict[str, Any], cluster: Any) -> TaskGraph:
    """The dW schedule over the whole model's graph (needs the cluster's cost model)."""
    if cluster is None or "bwd" not in graph.meta.get("passes", []):
        return graph
    costs, topo = cluster.costs, cluster.topology

    def duration(t: Any) -> float:
        if not t.is_comm:
            return costs.compute.duration(t)
        group = t.group or [t.rank]
        try:
            return costs.comm_duration(t, t.kind, len(group))
        except ConfigError:  # no collective fit: the bottleneck route of an even exchange
            return a2a_estimate(topo, group, t.bytes, costs.alpha)

    moved = schedule_dw(graph, duration)
    graph.meta["lancet"] = {"dw_moved": len(moved)}
    graph.validate()
    return graph


def a2a_estimate(topo: Any, group: list[int], nbytes: float, alpha: float) -> float:
    """An all-to-all's time as Lancet's profiled model would see it, where no fit is given:
    every member sends (n-1)/n of its bytes, as fast as the slowest link on a route from
    the first member allows (its NIC where the group spans nodes)."""
    n = len(group)
    if n < 2:
        return alpha
    cap = min(float(topo.link_cap[topo.route(group[0], p)].min()) for p in group[1:])
    return alpha + nbytes * (n - 1) / n / cap
