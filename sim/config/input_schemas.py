"""The JSON Schemas of moesim's inputs, for editors and validators (`moesim schema NAME`):
the run config (`sim.config.run_schema`), the topology (`sim.hardware.topology.schema`), the
task graph (`sim.core.graph_schema`), the calibration file (`sim.hardware.calibration_schema`)
and the sweep spec (`sim.config.sweep_schema`)."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.schema import json_schema

INPUTS = ("config", "topology", "graph", "calibration", "sweep")


def input_schema(name: str) -> dict[str, Any]:
    if name == "config":
        from sim.config.run_core import strategy_schemas
        from sim.config.run_schema import RunSpec

        schema = json_schema(RunSpec, "moesim run config")
        # each strategy's parameters, from its Params model: one of them is the entry
        spec = schema.get("$defs", {}).get("StrategySpec")
        if spec is not None:
            per = strategy_schemas()
            for name, sub in per.items():
                schema["$defs"] |= {f"strategy.{k}": v for k, v in sub.pop("$defs", {}).items()}
                schema["$defs"][f"strategy.{name}"] = sub
            spec["anyOf"] = [{"$ref": f"#/$defs/strategy.{n}"} for n in per]
        return schema
    if name == "topology":
        from sim.hardware.topology.schema import TopologySpec

        return json_schema(TopologySpec, "moesim topology")
    if name == "graph":
        from sim.core.graph_schema import adapter

        return json_schema(adapter(), "moesim task graph")
    if name == "calibration":
        from sim.hardware.calibration_schema import CalibrationFile

        return json_schema(CalibrationFile, "moesim calibration file")
    if name == "sweep":
        from sim.config.sweep_schema import SweepSpec

        return json_schema(SweepSpec, "moesim sweep spec")
    raise ConfigError(f"schema {name!r}: expected one of {', '.join(INPUTS)}")
