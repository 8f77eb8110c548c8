"""One strategy, one typed object: `Strategy` holds a strategy's name, its parameters (a
pydantic `Params` model: types, defaults, help text), its graph builder, its optional hooks
and the name of its real (executor) layer. Each strategy module defines `STRATEGY`, and
`sim.strategies.STRATEGY_LIST` is the one list of them that every other part reads: the
config's checks and schema, summaries, compare and sweep rows, the executor's registry.

The parameter types below are shared by the strategies that take a parameter of that name;
a `Hint` in a type's metadata is what a wrong value's error says was expected. A parameter
typed `Any` is checked by its builder (its own message, on the values it accepts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


@dataclass(frozen=True)
class Hint:
    """What a parameter's value must be, as its error says it (`expected <text>`)."""

    text: str


Count = Annotated[int, Field(gt=0, le=2**20)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Degree = Annotated[Count | Literal["auto"], Hint("a positive integer or 'auto'")]
Candidates = Annotated[
    Annotated[list[Count], Field(min_length=1)] | None, Hint("a list of positive integers")
]
PosInt = Annotated[Count, Hint("a positive integer")]
AName = Annotated[Name, Hint("a name")]
Algo = Annotated[Name | None, Hint("an algorithm name")]
Shadow = Annotated[
    Literal["auto", "none"] | list[Annotated[int, Field(ge=0, le=2**20)]],
    Hint("'auto', 'none' or a list of expert ids"),
]
Flag = Annotated[bool, Hint("true or false")]


class StrategyParams(BaseModel):
    """Base of every strategy's `Params`: strict types (no bool for an int, no NaN)."""

    # defer_build: built when first used (`problems`, `describe`), not at import
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", defer_build=True)


def hint(field: Any) -> str:
    for m in field.metadata:
        if isinstance(m, Hint):
            return m.text
    return "valid"


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
    devices: DualPipe's stages per device)."""

    name: str
    Params: type[StrategyParams]
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

    @property
    def defaults(self) -> dict[str, Any]:
        return {k: f.default for k, f in self.Params.model_fields.items()}

    @property
    def builds_model(self) -> bool:
        return self.build_model is not None

    def problems(self, params: dict[str, Any]) -> dict[str, str]:
        """Per parameter of this strategy given a value of the wrong type: what it expects."""
        fields = self.Params.model_fields
        given = {k: v for k, v in params.items() if k in fields}
        try:
            self.Params.model_validate(given)
        except ValidationError as e:
            bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
            return {k: hint(fields[k]) for k in given if k in bad}
        return {}

    def describe(self) -> dict[str, Any]:
        """The JSON Schema of the strategy's entry in a config: `name` and its parameters."""
        schema = self.Params.model_json_schema()
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
