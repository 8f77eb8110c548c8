"""Values that used to reach a traceback or pass as nonsense (issue 28): each is one line on
stderr and exit 2 (a sweep of only failed points: exit 1), before any simulation runs."""

from __future__ import annotations

import json

import pytest
import yaml

from sim.cli import main
from tests.configs import TINY_FLAT

TINY = TINY_FLAT


def _exit(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _one_line(argv: list[str], capsys, *needles: str) -> str:
    rc, err = _exit(argv, capsys)
    assert rc == 2, err
    assert err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err


def _no_simulation(monkeypatch) -> None:
    """Any simulation fails the test: the error must come before the run."""

    def ran(*a, **k):
        raise AssertionError("simulated before the inputs were checked")

    monkeypatch.setattr("sim.engine.engine.simulate", ran)
    monkeypatch.setattr("sim.analysis.whatif.study._run_config", ran)
    monkeypatch.setattr("sim.analysis.whatif.study._run_graph", ran)


@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            {"fabric": {"oversubscription": None}},
            "fabric.oversubscription: expected a valid number, got null",
        ),
        ({"output": {"dir": None}}, "output.dir: expected a valid string, got null"),
        ({"strategy": None}, "strategy: expected a mapping, got null"),
        ({"passes": None}, "passes: expected a valid list, got null"),
    ],
)
def test_null_is_not_the_default(tmp_path, capsys, edit, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "topology": "dgx-a100", **edit}))
    _one_line(["simulate", str(cfg)], capsys, needle)


def test_send_recv_sharing_a_collective_id(tmp_path, capsys):
    tasks = [
        {
            "id": "s",
            "rank": 0,
            "stream": "comm",
            "kind": "send",
            "peer": 1,
            "bytes": 1e6,
            "coll": "x",
        },
        {
            "id": "r",
            "rank": 1,
            "stream": "comm",
            "kind": "recv",
            "peer": 0,
            "bytes": 1e6,
            "coll": "x",
        },
    ] + [
        {
            "id": f"a{r}",
            "rank": r,
            "stream": "comm.b",
            "kind": "all_reduce",
            "group": [0, 1],
            "bytes": 1e6,
            "coll": "x",
        }
        for r in (0, 1)
    ]
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"schema_version": 1, "world_size": 2, "meta": {}, "tasks": tasks}))
    _one_line(
        ["simulate", str(g), "--topology", "dgx-a100", "--nodes", "1"],
        capsys,
        "send id 'x' is also the id of all_reduce task 'a0'",
    )


@pytest.mark.parametrize("size", ["infK", "nanK", "1e400"])
def test_collectives_size_not_a_number(capsys, size):
    _one_line(["collectives", "-b", size], capsys, f"size {size!r}")


def test_collectives_sendrecv_takes_no_algo(capsys):
    _one_line(["collectives", "-c", "sendrecv", "--algo", "bogus"], capsys, "sendrecv has no")


@pytest.mark.parametrize(
    "value, needle",
    [
        ("nodes=1e400", "expected a finite number"),
        ("nodes=nan", "expected a finite number"),
        ("compute.speed=inf", "expected a finite number"),
        ("compute.speed=*1e-300", "the factor must be from"),
        ("compute.speed=1e-300", "expected a factor from 0.001 to 1000"),
        ("compute.speed=*inf", "the factor must be from"),
        ("link.*.bw=inf", "expected a finite number"),
    ],
)
def test_whatif_values(tmp_path, capsys, monkeypatch, value, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    _no_simulation(monkeypatch)
    _one_line(["whatif", str(cfg), "--set", value], capsys, needle)


def test_whatif_graph_nodes_zero(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    g = tmp_path / "g.json"
    assert main(["graph", str(cfg), "-o", str(g)]) == 0
    capsys.readouterr()
    _no_simulation(monkeypatch)
    base = ["whatif", str(g), "--topology", "flat-switch"]
    _one_line(base + ["--nodes", "0", "--set", "compute.speed=*2"], capsys, "--nodes")
    _one_line(base + ["--set", "nodes=0"], capsys, "need >= 1")
    _one_line(base + ["--set", "nodes=1e400"], capsys, "expected a finite number")


def test_out_is_checked_before_the_run(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    g = tmp_path / "g.json"
    assert main(["graph", str(cfg), "-o", str(g)]) == 0
    capsys.readouterr()
    (tmp_path / "file").write_text("")
    bad = str(tmp_path / "file" / "x")
    _no_simulation(monkeypatch)
    _one_line(["whatif", str(cfg), "--set", "compute.speed=*2", "--out", bad], capsys, "--out")
    _one_line(["simulate", str(g), "--topology", "flat-switch", "--out", bad], capsys, "--out")


@pytest.mark.parametrize(
    "grid, needle",
    [
        ("nodes: [.inf]", "expected a finite number"),
        ("nodes: [.nan]", "expected a finite number"),
        ("nodes: [1e400]", "nodes=inf: expected a finite number"),  # YAML 1.2: a float
        ("compute.speed: [0]", "compute.speed=0: gives a speed of 0"),
        ("compute.speed: ['*1e-300']", "the factor must be from"),
    ],
)
def test_sweep_values_fail_up_front(tmp_path, capsys, grid, needle):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"base": TINY}) + f"grid:\n  {grid}\n")
    out = tmp_path / "out"
    _one_line(["sweep", str(spec), "--out", str(out), "--workers", "1"], capsys, needle)
    assert not out.exists()


@pytest.mark.parametrize("as_json", [False, True])
def test_a_sweep_of_only_failures_exits_1(tmp_path, capsys, as_json):
    """top_k 2 on one GPU of one expert fails in the layer (a row), not in validation."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"base": TINY, "grid": {"nodes": [1], "model.top_k": [2]}}))
    out = tmp_path / "out"
    rc, err = _exit(
        ["sweep", str(spec), "--out", str(out), "--workers", "1"] + ["--json"] * as_json, capsys
    )
    assert rc == 1 and "every point failed (1 of 1)" in err
    assert (out / "results.csv").exists()


def test_compare_empty_strategy_parameter(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    argv = ["compare", str(cfg), "--strategies", "pipelined:degree=4,,"]
    _one_line(argv, capsys, "an empty parameter")
