"""Pipelined MoE layer (PipeMoE / Tutel / MPipeMoE): r capacity chunks, dispatch and combine
chunks on the communication stream(s) overlapping expert chunks on the compute stream.

`order` picks how chunks are queued: `tutel` (all dispatches, then all combines, one
stream), `alternating` (MPipeMoE Fig. 4b) or `two_streams` (dispatch and combine on separate
communication streams, the setting PipeMoE's Eq. 9-12 describe).
"""

from __future__ import annotations

from typing import Any

from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.layer import build_layer
from sim.workload.moe import MoELayer

NAME = "pipelined"


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    return build_layer(
        layer,
        degree=params["degree"],
        order=params["order"],
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
    )


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:PipelinedParams",
    build=build,
    real_layer="pipelined",
)
