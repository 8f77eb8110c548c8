"""The JSON Schemas of moesim's inputs, for editors and validators (`moesim schema NAME`):
the run config (`sim.config.schema`), the topology (`sim.hardware.topology_schema`) and the
task graph (`sim.core.graph_schema`)."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.schema import json_schema

INPUTS = ("config", "topology", "graph")


def input_schema(name: str) -> dict[str, Any]:
    if name == "config":
        from sim.config.schema import RunSpec

        return json_schema(RunSpec, "moesim run config")
    if name == "topology":
        from sim.hardware.topology_schema import TopologySpec

        return json_schema(TopologySpec, "moesim topology")
    if name == "graph":
        from sim.core.graph_schema import adapter

        return json_schema(adapter(), "moesim task graph")
    raise ConfigError(f"schema {name!r}: expected one of {', '.join(INPUTS)}")
