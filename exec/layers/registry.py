"""The real layers by name, and the strategies of `sim.strategies` mapped onto them.

A layer module registers its layer under its own name (`register("sliced")`); a strategy
names the layer that is its real form by `Strategy.real_layer` (`sim.strategies.base`), so
that which layer runs a strategy is the strategy object's to say, whatever order the layer
modules are imported in. `STRATEGIES` and `SCHEDULES` are read by strategy name."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from exec.errors import ExecError
from sim.strategies import STRATEGIES as BY_NAME  # read afresh on every access
from sim.strategies import resolve_params

if TYPE_CHECKING:
    import torch

# A layer: (moe, x, params) -> y over capacity slots, or, marked `token_level` (DeepEP:
# it moves tokens and decodes itself), (moe, x, routing, params) -> y; DistMoE.forward reads
# the mark, so the two signatures share one type
Strategy = Callable[..., "torch.Tensor"]
# Layers whose real form is a schedule over micro-batches or pipeline stages, not one MoE
# layer call (`megatron_ep`: exec.layers.ep_overlap, `dualpipe`: exec.layers.dualpipe); kept
# apart from LAYERS, whose every entry is a `DistMoE` layer checked against `sequential`.
Schedule = Callable[..., Any]
LAYERS: dict[str, Strategy] = {}
SCHEDULE_LAYERS: dict[str, Schedule] = {}
L = TypeVar("L", bound=Strategy)


def register(name: str) -> Callable[[L], L]:
    """Add a real layer under `name` (a strategy's `real_layer`); it keeps its own signature."""

    def add(fn: L) -> L:
        LAYERS[name] = fn
        return fn

    return add


def register_schedule(name: str) -> Callable[[Schedule], Schedule]:
    """Add a real schedule under `name` (a strategy's `real_layer`)."""

    def add(fn: Schedule) -> Schedule:
        SCHEDULE_LAYERS[name] = fn
        return fn

    return add


class _ByStrategy(Mapping[str, Any]):
    """Strategy name -> its real layer in `table` (strategies without one left out)."""

    def __init__(self, table: dict[str, Any]) -> None:
        self.table = table

    def _now(self) -> dict[str, Any]:
        importlib.import_module("exec.layers")  # every layer module registered
        return {
            s.name: self.table[s.real_layer] for s in BY_NAME.values() if s.real_layer in self.table
        }

    def __getitem__(self, name: str) -> Any:
        return self._now()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


STRATEGIES: Mapping[str, Strategy] = _ByStrategy(LAYERS)
SCHEDULES: Mapping[str, Schedule] = _ByStrategy(SCHEDULE_LAYERS)


def resolve_strategy(name: str, params: dict[str, Any]) -> dict[str, Any]:
    full = resolve_params(name, params)  # the simulator's defaults and parameter checks
    if name not in STRATEGIES:
        raise ExecError(
            f"strategy {name!r} has no real-layer implementation yet (have: {sorted(STRATEGIES)})"
        )
    return full
