"""The run config's fields that every config has (`RunCore`) and its `strategy:` entry.

`sim.config.run_schema.RunSpec` is RunCore with its optional sections (fabric, parallel,
costs, output, limits) typed by their models; RunCore types them Any. A config that leaves
them all out (`sim.config.run_spec`) is checked by RunCore, exactly as by RunSpec (an absent
section is never validated), so that a small run neither builds those sections' validators
nor makes their classes: importing run_schema is ~2% of a small `moesim simulate`.
"""

# Annotations evaluated as the classes are made (see sim.config.run_schema).

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from sim.config.model_schema import ModelSpec, model_preset
from sim.core.errors import ConfigError
from sim.core.schema import PosInt, Strict, short

# The optional sections' descriptions, RunCore's and RunSpec's alike
SECTIONS = {
    "fabric": "fields replacing the topology's inter-node fabric ones, e.g. {type: "
    "fat_tree, nodes_per_leaf: 4, oversubscription: 2}",
    "parallel": "the parallel layout {ep, dp, tp, esp, pp}; omitted: one expert-parallel "
    "group of every GPU",
    "costs": "the cost model and its parameters, over the topology's",
    "output": "what `moesim simulate` writes, where",
    "limits": "size limits for this run (sim.core.limits); --limit NAME=N on the command line",
}


def _named(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


Name = Annotated[str, Field(min_length=1, max_length=256)]


class StrategySpec(Strict):
    """`name` plus the strategy's own parameters (typed by its `Params` model: `check_params`;
    documented per strategy by `moesim schema config`: `strategy_schemas`)."""

    model_config = Strict.model_config | {"extra": "allow"}
    name: Name = Field(
        description="the graph builder: sequential, pipelined, pipemoe, tutel, ted, "
        "fastermoe, mpipemoe, lancet, parm, deepep, megatron_ep or dualpipe; its parameters "
        "(degree, order, algo, ...) sit beside the name"
    )


def check_params(name: str, params: dict[str, Any], source: str) -> None:
    """Each parameter of strategy `name` has the type its `Params` model gives it (one
    ConfigError naming each `strategy.<param>` and what it expects). A name the strategy does
    not take is typed as the first strategy that takes it types it, so that a wrong value is
    named before `sim.strategies.resolve_params` says the strategy does not take it; an
    unknown strategy is resolve_params' to name."""
    import sim.strategies as strategies  # STRATEGY_LIST (every strategy) read only if needed

    own = strategies.STRATEGIES.get(name)
    found: dict[str, str] = {}
    for key, value in params.items():
        strat = own if own is not None and key in own.params_model().model_fields else None
        if strat is None:  # not this strategy's: the type of the name where one declares it
            every = strategies.STRATEGY_LIST
            strat = next((s for s in every if key in s.params_model().model_fields), None)
        if strat is not None:
            found |= strat.problems({key: value})
    problems = [f"strategy.{k}: expected {h}, got {short(params[k])}" for k, h in found.items()]
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


def strategy_schemas() -> dict[str, Any]:
    """Each strategy's entry in a config as JSON Schema, from its `Params` model (types,
    defaults, descriptions): what `moesim schema config` documents under `strategy`."""
    from sim.strategies import STRATEGY_LIST

    return {s.name: s.describe() for s in STRATEGY_LIST}


def _listed(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


# A run config's fields, its optional sections unchecked (Any): RunSpec's base. (No
# docstring, as RunSpec has none: it would be a JSON Schema's description.)
class RunCore(Strict):
    topology: Annotated[str, Field(min_length=1)] = Field(
        description="a preset in topologies/ (`moesim topology list`) or a path to a "
        "topology YAML file"
    )
    nodes: PosInt | None = Field(
        None,
        description="node count: GPUs = nodes x the topology's gpus_per_node; default: the "
        "topology's nodes",
    )
    fabric: Any = Field(None, description=SECTIONS["fabric"])
    parallel: Any = Field(None, description=SECTIONS["parallel"])
    model: Annotated[ModelSpec, BeforeValidator(model_preset)] = Field(
        description="the MoE layer (and the transformer around it); {preset: NAME} fills "
        "the fields from a preset (gpt2-s-moe, gpt2-l-moe, deepseek-v3, qwen3-235b-a22b), "
        "fields given beside it win"
    )
    # strategy and passes may be omitted (the defaults) but not null: a null is a mistake
    # (an emptied key), refused rather than silently read as the default (hence the type
    # ignores: a None default outside the type, as in run_schema.FabricSpec)
    strategy: Annotated[StrategySpec, BeforeValidator(_named)] = Field(  # type: ignore[assignment]
        None,
        description="the strategy: {name, its parameters} or a bare name; default sequential",
    )
    passes: Annotated[
        list[Literal["fwd", "bwd"]], Field(min_length=1), BeforeValidator(_listed)
    ] = Field(
        None,  # type: ignore[arg-type]
        description="the passes built: fwd, bwd or both (a bare string is one); default [fwd]",
    )
    costs: Any = Field(None, description=SECTIONS["costs"])
    output: Any = Field(None, description=SECTIONS["output"])
    limits: Any = Field(None, description=SECTIONS["limits"])
