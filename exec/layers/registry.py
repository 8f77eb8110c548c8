"""The real layer's strategies by name, with the names and parameters of `sim.strategies`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exec.errors import ExecError
from sim.strategies import resolve_params

if TYPE_CHECKING:
    import torch

    from exec.layers.moe import DistMoE

Strategy = Callable[["DistMoE", "torch.Tensor", dict[str, Any]], "torch.Tensor"]
STRATEGIES: dict[str, Strategy] = {}


def register(name: str) -> Callable[[Strategy], Strategy]:
    """Add an executor strategy; `name` and its parameters are those of sim.strategies."""

    def add(fn: Strategy) -> Strategy:
        STRATEGIES[name] = fn
        return fn

    return add


def resolve_strategy(name: str, params: dict[str, Any]) -> dict[str, Any]:
    full = resolve_params(name, params)  # the simulator's defaults and parameter checks
    if name not in STRATEGIES:
        raise ExecError(
            f"strategy {name!r} has no real-layer implementation yet (have: {sorted(STRATEGIES)})"
        )
    return full


# Strategies whose real form is a schedule over micro-batches or pipeline stages, not one MoE
# layer call (`megatron_ep`: exec.layers.ep_overlap, `dualpipe`: exec.layers.dualpipe); kept
# apart from STRATEGIES, whose every entry is a `DistMoE` layer checked against `sequential`.
Schedule = Callable[..., Any]
SCHEDULES: dict[str, Schedule] = {}


def register_schedule(name: str) -> Callable[[Schedule], Schedule]:
    """Add a real schedule; `name` and its parameters are those of sim.strategies."""

    def add(fn: Schedule) -> Schedule:
        SCHEDULES[name] = fn
        return fn

    return add
