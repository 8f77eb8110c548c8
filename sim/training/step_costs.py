"""The cost models a training step is simulated on (`sim.training.step`), built once per
process: its collectives' flows on the topology, and the step's graph of timed tasks on the
run's hardware queues."""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=32)
def costs(topo: Any, network: str, queues: int | None = None) -> Any:
    """The topology's cost model with the given network mode ("flow" for the collectives'
    simulations, "collective" for the pipeline of timed tasks) and hardware queues (None:
    CUDA's default)."""
    from sim.hardware.costs import CostModel

    spec: dict[str, Any] = {} if network == "flow" else {"network": network}
    if queues is not None:
        spec["resources"] = {"max_connections": queues}
    return CostModel.build(topo, spec)


def step_costs(topo: Any, queues: int | None) -> Any:
    """The cost model the step's graph of timed tasks runs on (`sim.training.step`): its
    collectives already timed, the recipe's hardware queues (`Recipe.max_connections`)."""
    return costs(topo, "collective", queues)
