"""The sweep spec (`moesim sweep SPEC.yaml`): a base run config and the values to vary.

    base: my.yaml                 # relative to the spec file; or a mapping; omitted: the demo
    grid:                         # the cross product of these lists is run
      nodes: [1, 2]
      model.model_dim: [1024, 2048]
      strategy: [sequential, "pipelined:degree=4", {name: pipemoe}]
    zip:                          # each group varies together (one axis of the product)
      - {model.model_dim: [1024, 2048], model.hidden_dim: [4096, 8192]}
    passes: [fwd, bwd]            # replaces the base's passes

The keys are those of `moesim whatif --set` (sim.analysis.whatif.keys); they are checked,
and every point's config validated, by sim.analysis.sweep.spec before anything runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from sim.core.schema import Strict

Values = Annotated[list[Any], Field(min_length=1)]


class SweepSpec(Strict):
    base: str | dict[str, Any] | None = Field(
        default=None,
        description="run config: a YAML path relative to the spec, a mapping, or omitted "
        "for the embedded demo config",
    )
    grid: dict[str, Values] = Field(
        default_factory=dict,
        description="key -> list of values; the cross product of all lists (and zip groups) "
        "is run. Keys as `moesim whatif --set`: topology, nodes, model.<field>, "
        "fabric.<field>, parallel.<field>, costs.<field>, strategy (name[:k=v,...] or a "
        "mapping), strategy.<param>, link.<class>.bw/latency, compute.speed",
    )
    zip_: list[dict[str, Values]] = Field(
        default_factory=list,
        alias="zip",
        description="groups of keys whose lists (of equal length) vary together",
    )
    passes: list[Literal["fwd", "bwd"]] | None = Field(
        default=None, min_length=1, description="replaces the base config's passes"
    )
    name: str | None = Field(default=None, description="a label for the sweep")
