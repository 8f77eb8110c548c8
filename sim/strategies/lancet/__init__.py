"""Lancet (paper 004): whole-graph overlap of the all-to-alls.

Alone (one MoE layer) the layer is Tutel-style pipelined (`degree` chunks of the capacity,
Tutel issue order). On a model of many blocks (`model.blocks`) both of Lancet's passes run:
- the operator partition pass (Sec. 5): `plan` picks, with the range DP and the pipeline
  cost simulation, the partition count k and how far before and after each MoE layer the
  forward is partitioned along the batch (`sim.strategies.lancet.plan`); the layer is built
  with k irregular chunks that pass the capacity on (`capacity`), and `model_pass` rewrites
  the ranges (`rewrite`). `partition: off` keeps Tutel's `degree` capacity chunks, an integer
  fixes k and lets the DP choose only the ranges; `gate` limits the ranges (switch: before
  and after the layer; batch_prioritized: only after);
- the weight-gradient schedule pass (Sec. 4, `dw_schedule`, `dw: on|off`) moves the
  backward's weight gradients into the all-to-all windows.
Both are timed by the run's cost model.
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.lancet.capacity import partition_sizes
from sim.strategies.lancet.dw_schedule import schedule_dw
from sim.strategies.lancet.plan import GATES, MAX_PARTITIONS, Plan, choose
from sim.strategies.lancet.profile import duration_fn
from sim.strategies.lancet.rewrite import partition_graph
from sim.strategies.layer import build_layer
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer

NAME = "lancet"


PLAN_KEY = "_plan"  # the partition plan, from `plan` to `build` and `model_pass`


def _check(params: dict[str, Any]) -> None:
    p = params["partition"]
    ok_int = isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= MAX_PARTITIONS
    if p not in ("auto", "off") and not ok_int:
        raise ConfigError(
            f"strategy.partition: expected auto, off or 1..{MAX_PARTITIONS} partitions, got {p!r}"
        )
    if params["dw"] not in ("on", "off", True, False):  # YAML 1.1 reads on/off as booleans
        raise ConfigError(f"strategy.dw: expected on or off, got {params['dw']!r}")
    if params["gate"] not in GATES:
        raise ConfigError(f"strategy.gate: expected one of {list(GATES)}, got {params['gate']!r}")


def dw_on(params: dict[str, Any]) -> bool:
    return params["dw"] in ("on", True)


def plan(
    layer: MoELayer, params: dict[str, Any], blocks: BlockModel, cluster: Any
) -> dict[str, Any]:
    """The partition plan of a model (needs the cluster's cost model; without one, or with
    `partition: off`, Tutel's chunks are kept)."""
    _check(params)
    if cluster is None or params["partition"] == "off":
        return params
    p = params["partition"]
    ks = list(range(1, MAX_PARTITIONS + 1)) if p == "auto" else [p]
    chosen = choose(
        blocks,
        layer,
        duration_fn(cluster),
        ks,
        params["gate"],
        params["algo"],
        baseline=params["degree"] if p == "auto" else None,
    )
    return {**params, PLAN_KEY: chosen}


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    _check(params)
    chosen: Plan | None = params.get(PLAN_KEY)
    if chosen is None or chosen.baseline:
        return build_layer(
            layer,
            degree=params["degree"],
            order="tutel",
            passes=passes,
            strategy=NAME,
            algo=params["algo"],
        )
    part = build_layer(
        layer,
        degree=chosen.k,
        order="tutel",
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
        sizes=partition_sizes(layer, chosen.k),
    )
    if "bwd" not in passes:
        return part
    plain = build_layer(
        layer,
        degree=params["degree"],
        order="tutel",
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
    )
    return _merge(part, plain)


def _merge(part: TaskGraph, plain: TaskGraph) -> TaskGraph:
    """The partitioned forward (k chunks) with the backward of Tutel's `degree` chunks. Both
    graphs stash the layer's whole tensors under the same names (`sim.strategies.activations`:
    chunks write slices of one buffer), so the plain backward releases what the partitioned
    forward stashed (the same rows in total, cut as the backward reads them)."""
    out = TaskGraph(plain.world_size, meta=dict(plain.meta) | {"degree": part.meta["degree"]})
    for t in part:
        if t.tags.get("phase") == "fwd":
            out.add(t)
    for t in plain:
        if t.tags.get("phase") == "bwd":
            out.add(t)
    out.validate()
    return out


def model_pass(graph: TaskGraph, params: dict[str, Any], cluster: Any) -> TaskGraph:
    """Both passes over the whole model's graph: the partition of the forward, then the dW
    schedule of the backward (they touch different phases: the order does not matter)."""
    chosen: Plan | None = params.get(PLAN_KEY)
    info: dict[str, Any] = {}
    if chosen is not None and chosen.baseline:
        info["plan"] = f"tutel chunks ({chosen.k}): no partition beats them"
    elif chosen is not None:
        graph = partition_graph(graph, chosen, int(graph.meta["layer"]["batch"]))
        info["partitions"] = chosen.k
        info["ranges"] = {b: [len(pre), len(post)] for b, (pre, post) in chosen.ranges.items()}
    if cluster is not None and dw_on(params) and "bwd" in graph.meta.get("passes", []):
        moved = schedule_dw(graph, duration_fn(cluster))
        info["dw_moved"] = len(moved)
    graph.meta["lancet"] = info
    graph.validate()
    return graph


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:LancetParams",
    build=build,
    real_layer="lancet",
    plan=plan,
    model_pass=model_pass,
)
