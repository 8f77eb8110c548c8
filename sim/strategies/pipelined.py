"""Pipelined MoE layer (PipeMoE / Tutel / MPipeMoE): r capacity chunks, dispatch and combine
chunks on the communication stream(s) overlapping expert chunks on the compute stream.

`order` picks how chunks are queued: `tutel` (all dispatches, then all combines, one
stream), `alternating` (MPipeMoE Fig. 4b) or `two_streams` (dispatch and combine on separate
communication streams, the setting PipeMoE's Eq. 9-12 describe).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sim.core.graph import TaskGraph
from sim.strategies.base import Algo, AName, Degree, Strategy, StrategyParams
from sim.strategies.layer import build_layer
from sim.workload.moe import MoELayer

NAME = "pipelined"


class Params(StrategyParams):
    degree: Degree = Field(4, description="capacity chunks r pipelined per all-to-all")
    order: AName = Field(
        "tutel",
        description="how chunks are queued: tutel, alternating or two_streams (chunking.ORDERS)",
    )
    algo: Algo = Field(
        None,
        description="the all-to-all algorithm (sim.hardware.collectives); null: the default one",
    )


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
    Params=Params,
    build=build,
    real_layer="pipelined",
)
