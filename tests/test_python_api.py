"""`import sim`: the API it exports (lazily), keyword overrides, one-line errors, the version."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from sim import commands
from sim.cli import main
from sim.core.errors import ConfigError
from tests.configs import SMALL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cfg_path(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    return p


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    p = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    return set(p.stdout.split())


def test_import_sim_loads_nothing_heavy_until_a_function_is_used():
    heavy = {"pandas", "numpy", "simpy", "torch", "plotly", "networkx", "yaml", "tqdm"}
    seen = _modules_after("import sim; sim.__version__; dir(sim); sim.__all__")
    assert not heavy & seen
    assert "sim.exports" not in seen and "sim.commands" not in seen
    # the first use loads what the function needs, and still no torch
    seen = _modules_after("import sim; sim.run")
    assert "sim.exports" in seen and "torch" not in seen


def test_one_python_api_surface():
    """`import sim` is the Python API; `sim.commands` (what the subcommands do) gives none of
    its functions an exported name unless it is that very object (issue 22, item 5:
    `sim.api.compare` returned a Comparison where `sim.compare` returns a DataFrame)."""
    import sim.commands

    for name in sim.__all__:
        if hasattr(sim.commands, name):
            assert getattr(sim.commands, name) is getattr(sim, name), name


def test_exports_are_listed_and_resolve():
    assert {"run", "compare", "sweep", "replay", "whatif", "RunConfig"} <= set(sim.__all__)
    assert set(sim.__all__) <= set(dir(sim))
    for name in sim.__all__:
        if name != "sweep":  # sim.analysis.sweep comes from another branch
            assert getattr(sim, name) is not None
    from sim.config import RunConfig

    assert sim.RunConfig is RunConfig and sim.load_config is commands.load_config
    assert isinstance(sim.demo_config(), RunConfig)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sim.nope  # noqa: B018


def test_run_overrides_equal_the_edited_config(cfg_path):
    r = sim.run(cfg_path, nodes=2, params={"degree": 4}, **{"model.top_k": 2})
    edited = {**SMALL, "nodes": 2, "model": {**SMALL["model"], "top_k": 2}}
    edited["strategy"] = {"name": "pipelined", "degree": 4}
    ref = commands.simulate_config(edited)
    assert r.summary["makespan_s"] == ref.summary["makespan_s"]
    assert r.summary["params"]["degree"] == 4 and r.graph.world_size == 16
    assert isinstance(r.trace, pd.DataFrame) and len(r.trace) == len(ref.trace) == len(r.graph)
    # a field given as a mapping changes that field only; the same by dotted path
    a = sim.run(cfg_path, model={"capacity_factor": 2.0})
    b = sim.run(cfg_path, **{"model.capacity_factor": 2.0})
    assert a.summary["makespan_s"] == b.summary["makespan_s"]
    assert a.summary["makespan_s"] != sim.run(cfg_path).summary["makespan_s"]


def test_run_strategy_and_costs(cfg_path):
    seq = sim.run(cfg_path, strategy="sequential")  # a new name starts from its defaults
    assert seq.summary["strategy"] == "sequential"
    same = sim.run(cfg_path, strategy="pipelined")  # the same name keeps the config's params
    assert same.summary["params"]["degree"] == 2
    ab = sim.run(cfg_path, costs={"network": "collective"}, topology="pipemoe-2080ti", nodes=4)
    assert ab.summary["topology"] == "pipemoe-2080ti"
    # params apply to the strategy named beside them, in any keyword order
    a = sim.run(cfg_path, params={"degree": 4}, strategy="tutel")
    assert a.summary["strategy"] == "tutel" and a.summary["params"]["degree"] == 4
    # the caller's config is not changed by an override
    cfg = sim.load_config({**SMALL, "model": {**SMALL["model"], "routing": {"kind": "uniform"}}})
    sim.run(cfg, **{"model.routing.kind": "zipf", "model.routing.s": 1.2})
    assert cfg.model["routing"] == {"kind": "uniform"}
    from_mapping = sim.run(dict(SMALL), strategy="sequential")
    assert from_mapping.summary["makespan_s"] == seq.summary["makespan_s"]


def test_run_a_task_graph(cfg_path, tmp_path):
    g = tmp_path / "g.json"
    commands.export_graph(commands.load_config(cfg_path), g)
    r = sim.run(g, topology="dgx-a100")
    assert r.summary["makespan_s"] == pytest.approx(sim.run(cfg_path).summary["makespan_s"])
    with pytest.raises(ConfigError, match="needs topology="):
        sim.run(g)
    with pytest.raises(ConfigError, match="'params'.*as it is"):
        sim.run(g, topology="dgx-a100", params={"degree": 2})


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ("CFG", {"nodez": 2}, "override 'nodez': unknown (did you mean 'nodes'?)"),
        ("CFG", {"nodes": "two"}, "nodes: expected a valid integer"),
        ("CFG", {"model.capacity_factr": 1.5}, "model.capacity_factr: unknown key (did you mean"),
        ("CFG", {"params": 4}, "override 'params': expected a mapping"),
        ("CFG", {"params.degree": 4}, "override 'params.degree': unknown"),
        ("CFG", {"limits": {"max_wrld": 9}}, "limits.max_wrld: unknown key"),
        ("CFG", {"strategy": "nope"}, "nope"),
        ("CFG", {"topology.x": 1}, "topology is 'dgx-a100', not a mapping"),
        (42, {}, "config: expected a RunConfig, a mapping or a path to a YAML file, got int"),
        ("missing.yaml", {}, "missing.yaml"),
    ],
)
def test_bad_arguments_are_one_line_config_errors(cfg_path, config, overrides, message):
    with pytest.raises(ConfigError) as e:
        sim.run(cfg_path if config == "CFG" else config, **overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_compare_returns_a_frame(cfg_path, tmp_path):
    df = sim.compare(cfg_path, ["sequential", "pipelined:degree=2"], nodes=2)
    assert isinstance(df, pd.DataFrame) and list(df["strategy"]) == [
        "sequential",
        "pipelined:degree=2",
    ]
    one = sim.run(cfg_path, nodes=2, strategy="sequential").summary["makespan_s"]
    assert df["makespan_s"].iloc[0] == pytest.approx(one)  # seconds, as in every summary
    for bad in ("sequential", [], [3]):
        with pytest.raises(ConfigError, match="strategies: expected"):
            sim.compare(cfg_path, bad)


def test_whatif_takes_a_mapping_or_set_strings(cfg_path):
    a = sim.whatif(cfg_path, {"link.*.bw": "*2", "compute.speed": 0.5})
    b = sim.whatif(cfg_path, ["link.*.bw=*2", "compute.speed=0.5"])
    assert a.after["makespan_s"] == b.after["makespan_s"] != a.before["makespan_s"]
    with pytest.raises(ConfigError, match="changes: expected"):
        sim.whatif(cfg_path, "link.*.bw=*2")


def test_replay_is_the_trace_replay():
    from sim.analysis.replay import replay

    r = sim.replay(ROOT / "traces" / "exec-gloo-2r")
    assert r.summary["makespan_s"] == replay(ROOT / "traces" / "exec-gloo-2r").summary["makespan_s"]


@pytest.mark.skipif(
    importlib.util.find_spec("sim.analysis.sweep") is None,
    reason="sim.analysis.sweep (run_sweep) is on another branch until the merge",
)
def test_sweep_forwards_to_run_sweep(monkeypatch):
    import sim.analysis.sweep as sweep_module

    seen = {}

    def fake(spec, **options):
        seen.update(spec=spec, **options)
        return pd.DataFrame({"row": [1]})

    monkeypatch.setattr(sweep_module, "run_sweep", fake)
    df = sim.sweep("spec.yaml", workers=2, progress=False)
    assert seen == {"spec": "spec.yaml", "workers": 2, "progress": False}
    assert list(df["row"]) == [1]


def test_version_is_single_sourced(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"moesim {sim.__version__}"
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sim.__version__"}
