"""The `moesim` command line: demo, simulate (config and graph JSON), graph, topology, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from sim.cli import main
from tests.configs import SMALL


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def _write_config(path, cfg: dict | None = None):
    path.write_text(yaml.safe_dump(cfg or SMALL, sort_keys=False))
    return path


@pytest.fixture
def small_cfg(tmp_path):
    return _write_config(tmp_path / "small.yaml")


def _run_json(capsys, *args) -> dict:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


# -- demo ------------------------------------------------------------------------------------


def test_demo_writes_outputs(tmp_path):
    out = tmp_path / "demo"
    p = _cli("demo", "--out", out, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["makespan_s"] > 0
    for name in ("trace.csv", "trace.chrome.json", "summary.json", "config.yaml"):
        assert (out / name).is_file(), name
    assert json.loads((out / "summary.json").read_text())["makespan_s"] == pytest.approx(
        summary["makespan_s"], rel=1e-12
    )
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["topology"] == "dgx-a100"
    trace = json.loads((out / "trace.chrome.json").read_text())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)
    named = {
        e["pid"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"].startswith("rank")
    }
    assert named == set(range(summary["world_size"]))
    assert {e["pid"] for e in xs} == named
    header = (out / "trace.csv").read_text().splitlines()[0]
    assert "rank" in header and "stream" in header


# -- simulate a config -------------------------------------------------------------------------


def test_simulate_config_subprocess(small_cfg, tmp_path):
    p = _cli("simulate", small_cfg, "--json", "--out", tmp_path / "o")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["makespan_s"] > 0
    assert s["strategy"] == "pipelined" and s["world_size"] == 8
    assert (tmp_path / "o" / "trace.csv").is_file()


@pytest.mark.parametrize(
    "extra, check",
    [
        ([], {"strategy": "pipelined", "world_size": 8}),
        (["--strategy", "sequential"], {"strategy": "sequential"}),
        (["--param", "degree=4"], {"strategy": "pipelined"}),
        (["--nodes", "2"], {"world_size": 16, "nodes": 2}),
        (["--fidelity", "flow"], {}),
    ],
    ids=["plain", "sequential", "degree4", "nodes2", "fidelity_flow"],
)
def test_simulate_overrides(small_cfg, tmp_path, capsys, extra, check):
    s = _run_json(capsys, "simulate", small_cfg, "--json", "--out", tmp_path / "o", *extra)
    assert s["makespan_s"] > 0
    for k, v in check.items():
        assert s[k] == v, (k, s[k])


def test_degree_override_changes_the_graph(small_cfg, tmp_path, capsys):
    main(["graph", str(small_cfg), "-o", str(tmp_path / "g2.json")])
    main(["graph", str(small_cfg), "-o", str(tmp_path / "g4.json"), "--param", "degree=4"])
    capsys.readouterr()
    g2 = json.loads((tmp_path / "g2.json").read_text())
    g4 = json.loads((tmp_path / "g4.json").read_text())
    assert g2["meta"]["degree"] == 2 and g4["meta"]["degree"] == 4
    assert len(g4["tasks"]) > len(g2["tasks"])


def test_network_collective_without_fits_derives_them(small_cfg, tmp_path):
    """A topology without measured alpha-beta fits: they are fitted to its flow model
    (sim.hardware.costs.derived, tests/test_derived_fits.py), so the run works."""
    p = _cli("simulate", small_cfg, "--json", "--out", tmp_path / "o", "--network", "collective")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["makespan_s"] > 0


def test_network_collective_with_fits_works(tmp_path, capsys):
    cfg = {**SMALL, "topology": "pipemoe-2080ti", "nodes": 4}
    path = _write_config(tmp_path / "pm.yaml", cfg)
    s = _run_json(
        capsys, "simulate", path, "--json", "--out", tmp_path / "o", "--network", "collective"
    )
    assert s["makespan_s"] > 0


# -- graph export and replay -------------------------------------------------------------------


def test_graph_json_replays_to_same_makespan(small_cfg, tmp_path):
    g = tmp_path / "g.json"
    p = _cli("graph", small_cfg, "-o", g)
    assert p.returncode == 0, p.stderr
    assert g.is_file() and "tasks" in json.loads(g.read_text())
    direct = _cli("simulate", small_cfg, "--json", "--out", tmp_path / "a")
    replay = _cli(
        "simulate", g, "--topology", "dgx-a100", "--nodes", "1", "--json", "--out", tmp_path / "b"
    )
    assert direct.returncode == 0, direct.stderr
    assert replay.returncode == 0, replay.stderr
    m1 = json.loads(direct.stdout)["makespan_s"]
    m2 = json.loads(replay.stdout)["makespan_s"]
    assert m2 == pytest.approx(m1, rel=1e-12)


def test_graph_json_replay_sizes_the_cluster_to_the_graph(small_cfg, tmp_path, capsys):
    g = tmp_path / "g.json"
    assert main(["graph", str(small_cfg), "-o", str(g)]) == 0
    capsys.readouterr()
    # the preset's default is 2 nodes; the 8-rank graph needs one
    assert (
        main(["simulate", str(g), "--topology", "dgx-a100", "--json", "--out", str(tmp_path / "o")])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 1 and out["world_size"] == 8


def test_graph_json_needs_topology(small_cfg, tmp_path, capsys):
    g = tmp_path / "g.json"
    assert main(["graph", str(small_cfg), "-o", str(g)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(g), "--out", str(tmp_path / "o")]) == 2
    assert "--topology" in capsys.readouterr().err


# -- bad inputs --------------------------------------------------------------------------------


def _cfg(**changes) -> dict:
    """SMALL with nested changes: _cfg(model={'hidden_dim': None}) removes model.hidden_dim."""
    cfg = json.loads(json.dumps(SMALL))
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            for kk, vv in v.items():
                if vv is None:
                    cfg[k].pop(kk)
                else:
                    cfg[k][kk] = vv
        else:
            cfg[k] = v
    return cfg


def _yaml_file(cfg):
    def make(tmp_path):
        return [_write_config(tmp_path / "bad.yaml", cfg)]

    return make


def _text_file(text: str, name: str = "bad.yaml"):
    def make(tmp_path):
        p = tmp_path / name
        p.write_text(text)
        return [p]

    return make


def _cycle_graph(tmp_path):
    p = tmp_path / "cycle.json"
    p.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "world_size": 1,
                "tasks": [
                    {"id": "ta", "rank": 0, "stream": "compute", "kind": "gemm", "deps": ["tb"]},
                    {"id": "tb", "rank": 0, "stream": "compute", "kind": "gemm"},
                ],
            }
        )
    )
    return [p, "--topology", "dgx-a100", "--nodes", "1"]


def _p(name, make, needles, marks=()):
    return pytest.param(make, needles, id=name, marks=marks)


BAD = [
    _p("unknown_top_field", _yaml_file(_cfg(colour="red")), ["colour"]),
    _p(
        "experts_not_divisible",
        _yaml_file(_cfg(model={"experts_per_gpu": None, "experts": 3})),
        ["model.experts"],
    ),
    _p("missing_hidden_dim", _yaml_file(_cfg(model={"hidden_dim": None})), ["hidden_dim"]),
    _p(
        "unknown_strategy", _yaml_file(_cfg(strategy={"name": "bogus"})), ["strategy.name", "bogus"]
    ),
    _p(
        "unknown_strategy_param",
        _yaml_file(_cfg(strategy={"name": "pipelined", "depth": 3})),
        ["strategy", "depth"],
    ),
    _p(
        "degree_zero",
        _yaml_file(_cfg(strategy={"name": "pipelined", "degree": 0})),
        ["strategy.degree"],
    ),
    _p(
        "bad_order",
        _yaml_file(_cfg(strategy={"name": "pipelined", "order": "sideways"})),
        ["strategy.order", "sideways"],
    ),
    _p(
        "negative_capacity_factor",
        _yaml_file(_cfg(model={"capacity_factor": -1})),
        ["model.capacity_factor"],
    ),
    _p(
        "unknown_topology",
        _yaml_file(_cfg(topology="no-such-cluster")),
        ["no-such-cluster", "dgx-a100"],
    ),
    _p("missing_config", lambda tmp_path: [tmp_path / "absent.yaml"], ["absent.yaml", "not found"]),
    _p("invalid_yaml", _text_file("model: [1, 2\n  foo: {\n"), ["not valid YAML", "line"]),
    _p(
        "unknown_routing_kind",
        _yaml_file(_cfg(model={"routing": {"kind": "bogus"}})),
        ["model.routing.kind", "bogus"],
    ),
    _p("graph_json_cycle", _cycle_graph, ["cycle", "ta", "tb"]),
    _p(
        "bogus_fidelity", _yaml_file(_cfg(costs={"fidelity": "bogus"})), ["costs.fidelity", "bogus"]
    ),
]


def _check_error(rc: int, stdout: str, stderr: str, needles) -> None:
    assert rc == 2, (rc, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert lines and lines[0].startswith("moesim: error:"), stderr
    for n in needles:
        assert n in lines[0], (n, stderr)
    assert len(lines) == 1, stderr
    assert "makespan" not in stdout


@pytest.mark.parametrize("make, needles", BAD)
def test_bad_input_in_process(tmp_path, capsys, make, needles):
    args = make(tmp_path)
    rc = main(["simulate", str(args[0]), *map(str, args[1:]), "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    _check_error(rc, out, err, needles)
    assert not (tmp_path / "o" / "summary.json").exists()


# Every message is checked in process above; as a real process (exit code 2, one line, no
# traceback) two cases suffice by default, the rest are slow (a process start each)
BAD_SUBPROCESS = [
    p if i < 2 else pytest.param(*p.values, id=p.id, marks=pytest.mark.slow)
    for i, p in enumerate(BAD)
]


@pytest.mark.parametrize("make, needles", BAD_SUBPROCESS)
def test_bad_input_subprocess(tmp_path, make, needles):
    args = make(tmp_path)
    p = _cli("simulate", *args, "--out", tmp_path / "o")
    _check_error(p.returncode, p.stdout, p.stderr, needles)


# -- topology --------------------------------------------------------------------------------


def test_topology_list():
    p = _cli("topology", "list")
    assert p.returncode == 0, p.stderr
    names = p.stdout.split()
    assert "dgx-a100" in names and "pipemoe-2080ti" in names


def test_topology_show_routes(capsys):
    assert main(["topology", "show", "dgx-a100", "--routes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dgx-a100:")
    assert "routes from gpu0" in out
    assert "rank 0 -> 8: n0/gpu0->" in out  # crosses the fabric at the default 2 nodes
    assert "fabric" in out.split("rank 0 -> 8:")[1].splitlines()[0]


def test_topology_show_unknown(capsys):
    assert main(["topology", "show", "no-such-cluster"]) == 2
    assert capsys.readouterr().err.startswith("moesim: error: unknown topology")


# -- import hygiene --------------------------------------------------------------------------


def test_import_sim_does_not_import_torch():
    code = (
        "import sim, sim.engine.engine, sim.cli, sim.strategies, sim.analysis.trace; "
        "import sim.analysis.summary; "
        "import sys; assert 'torch' not in sys.modules"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
