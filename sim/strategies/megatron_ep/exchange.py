"""A dispatcher's exchange alone: what the payload communication of a layer costs by itself."""

from __future__ import annotations

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.megatron_ep.nodes import Emitter, LayerSpec


def exchange_graph(spec: LayerSpec, direction: str) -> TaskGraph:
    """The forward `direction` ("dispatch" or "combine") of the dispatcher on every rank of
    one EP group, alone: no count exchange, no compute before or after. What the payload
    exchange costs by itself, as DeepSpeed PR #8213 times its all-to-all; inside a layer the
    span of a collective also holds the wait for its slowest rank's experts."""
    if direction not in ("dispatch", "combine"):
        raise ConfigError(f"direction: expected 'dispatch' or 'combine', got {direction!r}")
    g = TaskGraph(spec.world, meta={"strategy": "megatron_ep-exchange", "direction": direction})
    for p in range(spec.world):
        Emitter(g, spec, p, shared_overlap=False)._exchange(
            0, 0, "fwd", direction, direction, direction, []
        )
    g.validate()
    return g
