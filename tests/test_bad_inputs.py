"""Bad inputs end in one line and exit 2: no traceback, no hang, no nonsense accepted.

A hypothesis sample of the corpus in `tests/bad_inputs.py` (mutations of valid run configs,
topologies and task graphs), every hostile file and command line, a few of them through a real
subprocess with a timeout, and the guards themselves: size limits, finite results, the
schemas' messages. `benchmarks/fuzz_inputs.py` runs thousands of these cases.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.errors import ConfigError, GraphError, MoesimError, TopologyError
from sim.core.finite import check_finite
from sim.core.limits import DEFAULT, Limits, applied, parse
from tests import bad_inputs as B

CLEAN = ("clean_rejection", "accepted")


def _check(case: B.Case) -> B.Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        o = B.run_case(case, Path(tmp) / "case", timeout_s=60)
    verdict = o.verdict(case.expect)
    detail = o.raised or o.stderr or o.stdout[:300]
    assert verdict in CLEAN, f"{case.name}: {verdict}: {detail}"
    return o


@pytest.mark.parametrize("name", sorted(B.CONFIGS))
def test_seed_configs_run(name):
    assert _check(B.config_case(name, B.CONFIGS[name], "any")).rc == 0


def test_seed_topology_and_graph_run():
    assert _check(B.topology_case("topo", B.seed_topology(), "any")).rc == 0
    assert _check(B.topology_case("show", B.seed_topology(), "any", show=True)).rc == 0
    assert _check(B.graph_case("graph", B.seed_graph(), "any")).rc == 0
    assert _check(B.calibration_case("cal", B.seed_calibration(), "any")).rc == 0


def _mutants(seed, make):
    all_paths = B.paths(seed)

    @st.composite
    def draw(draw_):
        m = None
        while m is None:
            path = draw_(st.sampled_from(all_paths))
            op = draw_(st.sampled_from(B.OPS))
            m = B.mutate(seed, path, op, draw_(st.integers(0, 3)))
        return make(f"{op}@{B.dotted(path)}", m.doc, m.expect)

    return draw()


_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(
    st.sampled_from(sorted(B.CONFIGS)).flatmap(
        lambda name: _mutants(B.CONFIGS[name], B.config_case)
    )
)
def test_mutated_configs(case):
    _check(case)


@_SETTINGS
@given(_mutants(B.seed_topology(), B.topology_case))
def test_mutated_topologies(case):
    _check(case)


@_SETTINGS
@given(_mutants(B.seed_graph(), B.graph_case))
def test_mutated_graphs(case):
    _check(case)


@_SETTINGS
@given(_mutants(B.seed_calibration(), B.calibration_case))
def test_mutated_calibration_files(case):
    _check(case)


@pytest.mark.parametrize("case", B.hostile_cases(), ids=lambda c: c.name)
def test_hostile_files_and_command_lines(case):
    assert _check(case).rc == 2


@pytest.mark.parametrize("case", B.exec_cases(), ids=lambda c: c.name)
def test_executor_options_are_refused_in_one_line(case):
    """Before any process starts; a warning that the ranks outnumber the cores is said only
    for inputs that run (exec_world_mismatch asks for 3 processes: on a 2-core host the
    warning came before its error, two lines)."""
    pytest.importorskip("torch")
    assert _check(case).rc == 2


@pytest.mark.parametrize("case", B.fault_cases(), ids=lambda c: c.name)
def test_issue_28_surfaces_are_refused_in_one_line(case):
    assert _check(case).rc == 2


@pytest.mark.parametrize("case", B.predict_cases(), ids=lambda c: c.name)
def test_predict_tables_fail_in_one_line_or_give_reasons(case):
    o = _check(case)
    assert o.rc == (0 if case.expect == "any" else 2)


@pytest.mark.parametrize("case", B.plan_cases(), ids=lambda c: c.name)
def test_plan_requests_fail_in_one_line(case):
    o = _check(case)
    assert o.rc == (0 if case.expect == "any" else 2)


@pytest.mark.parametrize("case", B.extreme_cases(), ids=lambda c: c.name)
def test_extreme_valid_inputs_end_with_finite_numbers(case):
    _check(case)


@pytest.mark.parametrize(
    "files, argv",
    [
        ({"cfg.yaml": "fifo"}, ["simulate", "cfg.yaml"]),
        ({"cfg.yaml": B.BOMB.encode()}, ["simulate", "cfg.yaml"]),
        ({"g.json": b"[" * 100_000}, ["simulate", "g.json", "--topology", "dgx-a100"]),
        (
            {"cfg.yaml": B.yaml_bytes(B.CONFIGS["layout"])},
            ["simulate", "cfg.yaml", "--nodes", "100000"],
        ),
    ],
    ids=["fifo", "alias_bomb", "deep_json", "nodes_100000"],
)
def test_real_process_ends_at_once_in_one_line(tmp_path, files, argv):
    B.Case("x", argv, files).materialise(tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "sim.cli", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={
            "PYTHONPATH": str(B.ROOT),
            "PATH": "/usr/bin:/bin",
            "MOESIM_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


# -- the guards themselves ----------------------------------------------------------------------


def test_limits_name_the_field_and_the_flag():
    with pytest.raises(ConfigError) as e:
        DEFAULT.check("max_ranks", 800_000, "cfg.yaml: ranks")
    msg = str(e.value)
    assert "800,000" in msg and "16,384" in msg
    assert "limits.max_ranks" in msg and "--limit max_ranks=N" in msg


def test_limit_flags_parse():
    assert parse(["max_ranks=1e6", "max_tasks=2_000_000", "max_world=16,384"]) == {
        "max_ranks": 1_000_000,
        "max_tasks": 2_000_000,
        "max_world": 16_384,
    }
    for bad in (["max_ranks=0"], ["max_ranks=1.5"], ["max_rank=3"], ["max_ranks"]):
        with pytest.raises(ConfigError):
            parse(bad)


def test_a_graph_never_grows_past_max_tasks():
    from sim.core.graph import Task, TaskGraph

    with applied(Limits(max_tasks=3)):
        g = TaskGraph(1)
        for i in range(3):
            g.add(Task(f"t{i}", 0, "compute", "elementwise"))
        with pytest.raises(ConfigError, match="limits.max_tasks"):
            g.add(Task("t3", 0, "compute", "elementwise"))


def test_limits_raised_in_the_config_let_a_run_through(capsys, tmp_path):
    from sim.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(B.yaml_bytes({**B.CONFIGS["layout"], "limits": {"max_ranks": 8}}).decode())
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "limits.max_ranks" in capsys.readouterr().err
    assert (
        main(["simulate", str(cfg), "--out", str(tmp_path / "o"), "--limit", "max_ranks=16"]) == 0
    )


def test_jitter_replicas_bounded_by_a_limit(capsys, tmp_path):
    from sim.cli import main

    doc = {**B.CONFIGS["alpha_beta"]}
    doc["costs"] = {**doc["costs"], "jitter": {"quantiles": {"gemm": [1, 2]}, "replicas": 10**6}}
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(B.yaml_bytes(doc))
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "limits.max_replicas" in capsys.readouterr().err


def test_non_finite_results_are_refused_by_key():
    check_finite({"a": [1.0, {"b": 2}], "c": "x", "d": None, "e": True}, "summary")
    with pytest.raises(MoesimError, match=r"summary\.busy_s\.comm is inf"):
        check_finite({"makespan_s": 1.0, "busy_s": {"comm": math.inf}}, "summary")
    with pytest.raises(MoesimError, match=r"rows\[1\]\.t is nan"):
        check_finite({"rows": [{"t": 1.0}, {"t": math.nan}]}, "x")


def test_a_summary_with_infinity_never_leaves_run(monkeypatch):
    from sim import commands
    from sim.analysis import summary

    real = summary.summarize

    def broken(res, df):
        return {**real(res, df), "makespan_s": math.inf}

    monkeypatch.setattr(summary, "summarize", broken)
    with pytest.raises(MoesimError, match="summary.makespan_s is inf"):
        commands.simulate_config(B.CONFIGS["layout"])


@pytest.mark.parametrize("name", ["config", "topology", "graph", "calibration"])
def test_schema_subcommand_prints_json_schema(capsys, name):
    from sim.cli import main

    assert main(["schema", name]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["title"].startswith("moesim")
    assert schema["properties"]


def test_every_preset_loads_and_the_schema_names_bad_links():
    from sim.hardware.topology import Topology
    from sim.hardware.topology.spec import list_presets

    for name in list_presets():
        Topology.load(name)
    for bw, needle in ((1e-300, "must be >= 1000"), (math.inf, "finite"), (1e30, r"<= 1e\+15")):
        spec = B.seed_topology()
        spec["link_classes"]["edr"]["bw"] = bw
        with pytest.raises(TopologyError, match=r"link_classes\.edr\.bw: .*" + needle):
            Topology(spec)


@pytest.mark.parametrize(
    "task, needle",
    [
        ({"shape": {"m": -5, "n": 1, "k": 1}}, "task 'g0': shape.m: must be > 0, got -5"),
        ({"shape": {"m": 1, "n": 1}}, "task 'g0': shape.k: required"),
        ({"shape": {"m": "x", "n": 1, "k": 1.5}}, "shape.k: expected a valid integer"),
        ({"bytes": True}, "task 'g0': bytes: expected a valid number, got True"),
        ({"flops": 1e300}, "task 'g0': flops: must be <="),
        ({"tags": {"dtype": "fp64"}}, "tags.dtype: expected one of"),
        ({"kind": "elementwise"}, "shape does not apply to a elementwise task"),
    ],
)
def test_graph_fields_named_by_task(task, needle):
    from sim.core.graph import TaskGraph

    g = B.seed_graph()
    g["tasks"][0].update(task)
    with pytest.raises(GraphError) as e:
        TaskGraph.from_dict(g)
    assert needle in str(e.value)


def test_graph_splits_and_cross_rank_deps():
    from sim.core.graph import TaskGraph

    g = B.seed_graph()
    g["tasks"][4]["split"] = [1.0]
    with pytest.raises(GraphError, match="'split' has 1 entries for a group of 2"):
        TaskGraph.from_dict(g)
    g = B.seed_graph()
    g["tasks"][1]["deps"] = ["g0"]  # rank 1 waiting for rank 0's GEMM, with nothing sent
    with pytest.raises(GraphError, match="depends on 'g0' of rank 0"):
        TaskGraph.from_dict(g)
