"""FastMoE / DeepSpeed-MoE layer: gate -> dispatch all-to-all -> experts -> combine all-to-all.

Nothing overlaps: every step waits for the one before it.
"""

from __future__ import annotations

from typing import Any

from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.layer import build_layer
from sim.workload.moe import MoELayer

NAME = "sequential"


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    return build_layer(
        layer, degree=1, order="tutel", passes=passes, strategy=NAME, algo=params["algo"]
    )


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:SequentialParams",
    build=build,
    real_layer="sequential",
)
