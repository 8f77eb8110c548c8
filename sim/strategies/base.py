"""One strategy, one typed object: `Strategy` holds a strategy's name, its parameters (a
pydantic `Params` model: types, defaults, help text), its graph builder, its optional hooks
and the name of its real (executor) layer. Each strategy module defines `STRATEGY`, and
`sim.strategies.STRATEGY_LIST` is the one list of them that every other part reads: the
config's checks and schema, summaries, compare and sweep rows, the executor's registry.

The shipped strategies' `Params` models are in `sim.strategies.params` (with the parameter
types they share), each named by its strategy ("module:Class") and imported where a parameter
is checked or described: a builder's module imports no pydantic, and a run whose config passed
its checks before (`sim.core.inputcache`) reads the defaults from the cache.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.strategies.params import StrategyParams

DEFAULTS = "strategy parameter defaults"  # their entry in the validated-input cache


@dataclass(frozen=True)
class Strategy:
    """A strategy: `build(layer, params, passes, cluster) -> TaskGraph` over its `Params`.

    Optional hooks (see `sim.strategies`): `resolve` (every `auto` parameter chosen on the
    cluster), `plan` / `model_pass` (model-wide choices and passes, Lancet), `build_model`
    (the graph is the whole model or step: Megatron's merged 1F1B, DualPipe), `pair_weight`
    (memory per rank pair, limits.max_pairs). `real_layer` names the executor's layer or
    schedule (`exec.layers.registry`); None: the strategy has no real form.

    How the config lays the strategy over `parallel:` (sim.config): `layout_tp` (its
    `strategy.tp` is the layout's TP size: TP groups inside the MoE layer, TED),
    `tp_overlay` (its model-parallel groups, `strategy.tp` and `.esp`, laid over the MoE
    ranks: Parm), `stages_per_device(params) -> int` (a pipeline over `parallel.pp`
    devices: DualPipe's stages per device).

    `Params` is the model itself or its name, "module:Class" (imported on first use:
    `params_model`), as the shipped strategies give theirs (`sim.strategies.params`)."""

    name: str
    Params: type[StrategyParams] | str
    build: Callable[..., Any]
    real_layer: str | None
    resolve: Callable[..., Any] | None = None
    plan: Callable[..., Any] | None = None
    model_pass: Callable[..., Any] | None = None
    build_model: Callable[..., Any] | None = None
    pair_weight: Callable[..., Any] | None = None
    layout_tp: bool = False
    tp_overlay: bool = False
    stages_per_device: Callable[[dict[str, Any]], int] | None = None
    # What its summary counts (sim.workload.accounting): `dropless`, its experts compute every
    # (token, expert) choice (no capacity C: DeepEP, Megatron-Core's dispatchers); its graph
    # holds `layer_copies` MoE layers per GPU for each of `meta["layers"]` (DualPipe: a
    # forward and a backward chunk on every device).
    dropless: bool = False
    layer_copies: int = 1

    def params_model(self) -> type[StrategyParams]:
        """The `Params` model (imported where `Params` names it)."""
        if isinstance(self.Params, str):
            module, _, name = self.Params.partition(":")
            model: type[StrategyParams] = getattr(importlib.import_module(module), name)
            return model
        return self.Params

    @property
    def defaults(self) -> dict[str, Any]:
        if isinstance(self.Params, str):  # a shipped model: its defaults kept with the cache's
            from sim.core import inputcache

            found = inputcache.derived(DEFAULTS, _shipped_defaults).get(self.Params)
            if found is not None:
                return dict(found)
        return {k: f.default for k, f in self.params_model().model_fields.items()}

    @property
    def builds_model(self) -> bool:
        return self.build_model is not None

    def problems(self, params: dict[str, Any]) -> dict[str, str]:
        """Per parameter of this strategy given a value of the wrong type: what it expects."""
        from pydantic import ValidationError

        from sim.strategies.params import hint

        model = self.params_model()
        fields = model.model_fields
        given = {k: v for k, v in params.items() if k in fields}
        try:
            model.model_validate(given)
        except ValidationError as e:
            bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
            return {k: hint(fields[k]) for k in given if k in bad}
        return {}

    def describe(self) -> dict[str, Any]:
        """The JSON Schema of the strategy's entry in a config: `name` and its parameters."""
        schema = self.params_model().model_json_schema()
        props = {"name": {"const": self.name, "description": "the strategy"}}
        props |= schema.get("properties", {})
        out: dict[str, Any] = {
            "type": "object",
            "title": self.name,
            "properties": props,
            "required": ["name"],
        }
        out["additionalProperties"] = False
        if "$defs" in schema:
            out["$defs"] = schema["$defs"]
        return out


def _shipped_defaults() -> dict[str, dict[str, Any]]:
    from sim.strategies.params import defaults

    return defaults()
