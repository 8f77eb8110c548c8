"""One strategy, one typed object (sim.strategies.base.Strategy): a strategy defined here and
put on the one list is found by simulate, compare, the summary and `moesim schema config`
without touching any other module; a graph carries its parameters (`meta["params"]`), and
`moesim exec g.json --moe` runs the graph's parameters, not the strategy's defaults."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import Field

import sim.strategies as strategies
from sim.core.errors import ConfigError
from sim.strategies.base import Strategy
from sim.strategies.layer import build_layer
from sim.strategies.params import PipelinedParams, PosInt, StrategyParams

CFG: dict[str, Any] = {
    "topology": "dgx-a100",
    "nodes": 1,
    "model": {
        "batch": 1,
        "seq_len": 64,
        "model_dim": 32,
        "hidden_dim": 64,
        "experts_per_gpu": 1,
        "top_k": 1,
    },
    "passes": ["fwd"],
}


class LeadParams(PipelinedParams):
    lead: PosInt = Field(2, description="chunks dispatched ahead (a test's parameter)")


def _build(layer: Any, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None):
    return build_layer(
        layer, degree=params["degree"], order=params["order"], passes=passes, strategy="leadpipe"
    )


LEAD = Strategy(name="leadpipe", Params=LeadParams, build=_build, real_layer=None)


@pytest.fixture
def lead(monkeypatch):
    monkeypatch.setattr(strategies, "STRATEGY_LIST", [*strategies.STRATEGY_LIST, LEAD])
    return LEAD


def test_every_strategy_is_one_object_on_the_list():
    names = [s.name for s in strategies.STRATEGY_LIST]
    assert len(names) == len(set(names)) and set(strategies.STRATEGIES) == set(names)
    for s in strategies.STRATEGY_LIST:
        assert isinstance(s, Strategy) and issubclass(s.params_model(), StrategyParams)
        for name, field in s.params_model().model_fields.items():
            assert field.description, f"{s.name}.{name} has no description"
        assert s.real_layer is None or isinstance(s.real_layer, str)


def test_new_strategy_simulates_and_shows_its_params(lead):
    import sim.commands as commands

    r = commands.simulate_config({**CFG, "strategy": {"name": "leadpipe", "degree": 2, "lead": 3}})
    assert r.summary["strategy"] == "leadpipe"
    assert r.summary["params"] == {"degree": 2, "order": "tutel", "lead": 3}
    assert r.graph.meta["params"]["lead"] == 3
    same = commands.simulate_config({**CFG, "strategy": {"name": "pipelined", "degree": 2}})
    assert r.summary["makespan_s"] == pytest.approx(same.summary["makespan_s"])


def test_new_strategy_in_compare(lead):
    from sim.analysis.compare import compare
    from sim.config import RunConfig

    df = compare(RunConfig.from_dict(CFG), ["leadpipe:lead=5", "sequential"])
    row = df.set_index("strategy").loc["leadpipe:lead=5"]
    assert "lead=5" in row["params"]


def test_new_strategy_params_typed_and_checked(lead):
    import sim.commands as commands

    with pytest.raises(ConfigError, match=r"strategy\.lead: expected a positive integer, got 'x'"):
        commands.simulate_config({**CFG, "strategy": {"name": "leadpipe", "lead": "x"}})
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['tail'\] for 'leadpipe'"):
        commands.simulate_config({**CFG, "strategy": {"name": "leadpipe", "tail": 1}})
    with pytest.raises(ConfigError, match=r"strategy\.degree: expected a positive integer"):
        commands.simulate_config({**CFG, "strategy": {"name": "leadpipe", "degree": True}})


def test_new_strategy_in_schema_config(lead, capsys):
    from sim.cli import main

    assert main(["schema", "config"]) == 0
    schema = json.loads(capsys.readouterr().out)
    entry = schema["$defs"]["strategy.leadpipe"]
    assert entry["properties"]["lead"]["description"].startswith("chunks dispatched ahead")
    assert entry["properties"]["lead"]["default"] == 2
    refs = [a["$ref"] for a in schema["$defs"]["StrategySpec"]["anyOf"]]
    assert "#/$defs/strategy.leadpipe" in refs and "#/$defs/strategy.tutel" in refs


def test_graph_meta_params_for_every_strategy():
    from sim.strategies import build
    from sim.workload.moe import MoELayer

    layer = MoELayer(batch=2, seq_len=64, model_dim=128, hidden_dim=256, experts=4, world=4)
    for name, given in (
        ("sequential", {}),
        ("tutel", {"degree": 2}),
        ("ted", {"tp": 2}),
        ("deepep", {"sms": 8}),
        ("lancet", {"degree": 2}),
    ):
        g = build(name, layer, given, ("fwd",))
        assert set(g.meta["params"]) == set(strategies.STRATEGIES[name].defaults), name
        assert given.items() <= g.meta["params"].items(), name


def test_exec_moe_runs_the_graphs_params(tmp_path, capsys):
    """A degree-2 tutel graph runs as degree 2 (the strategy's default is 1)."""
    pytest.importorskip("torch")
    from sim.cli import main
    from sim.strategies import build
    from sim.workload.moe import MoELayer

    layer = MoELayer(batch=1, seq_len=32, model_dim=16, hidden_dim=32, experts=4, world=2)
    g = build("tutel", layer, {"degree": 2}, ("fwd", "bwd"))
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g.to_dict()))
    assert json.loads(path.read_text())["meta"]["params"]["degree"] == 2
    rc = main(["exec", str(path), "--nprocs", "2", "--moe", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert report["strategy"].startswith("tutel(") and "degree=2" in report["strategy"]
    assert report["equal"] is True


def test_executor_finds_layers_by_real_layer(monkeypatch):
    """The executor's registry maps a strategy to the layer its `real_layer` names: a new
    strategy whose real form is the pipelined layer is runnable, with no registration."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from exec.layers.registry import LAYERS, STRATEGIES

    assert STRATEGIES["tutel"] is LAYERS["sliced"]  # not import order: tutel's real_layer
    assert "leadpipe" not in STRATEGIES
    monkeypatch.setattr(
        strategies,
        "STRATEGY_LIST",
        [*strategies.STRATEGY_LIST, replace(LEAD, real_layer="pipelined")],
    )
    assert STRATEGIES["leadpipe"] is LAYERS["pipelined"]
    assert "parm" not in STRATEGIES  # real_layer None: no real form


def test_each_strategy_module_is_named_as_its_strategy():
    """`STRATEGIES[name]` imports the module `sim.strategies.<name>` alone (start-up), so a
    strategy's module and its name must agree, in STRATEGY_LIST's order."""
    import importlib

    assert list(strategies._MODULES) == [s.name for s in strategies.STRATEGY_LIST]
    for name in strategies._MODULES:
        module = importlib.import_module(f"sim.strategies.{name}")
        assert module.STRATEGY is strategies.STRATEGIES[name]
