"""A YAML alias inside the node it names (`&a [*a]`) is refused in one line by every reader.

The expansion check used to walk the cyclic node graph forever, its stack growing ~55 MB/s;
each case runs under an alarm so that a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import signal

import pytest
import yaml

from sim.cli import main
from sim.core.errors import ConfigError
from sim.core.safeload import load_yaml_text
from tests.configs import SMALL

CYCLES = [
    "output: &a [*a]\n",
    "a: &a {b: *a}\n",
    "&a [[[*a]]]\n",
    "a: &a {<<: *a}\n",
    "x: &a [1, {y: [2, *a]}]\n",
]


class _Hung(Exception):
    pass


@pytest.fixture
def alarm():
    """Fails the test after 5 s (SIGALRM interrupts the pure-Python loop that hung)."""

    def hung(signum, frame):
        raise _Hung("timed out: a cyclic alias loops")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 5)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("text", CYCLES)
def test_a_cyclic_alias_is_refused(alarm, text):
    with pytest.raises(ConfigError) as e:
        load_yaml_text(text, "cyc.yaml")
    assert "cyclic alias" in str(e.value) and str(e.value).startswith("cyc.yaml: ")


def test_shared_aliases_still_load(alarm):
    got = load_yaml_text("a: &x [1, 2]\nb: [*x, *x, [*x]]\nc: &m {k: 1}\nd: {<<: *m}\n", "t")
    assert got == {"a": [1, 2], "b": [[1, 2], [1, 2], [[1, 2]]], "c": {"k": 1}, "d": {"k": 1}}


def _cli(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cyclic alias" in err, err
    return err


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    return p


@pytest.fixture
def cyc(tmp_path):
    p = tmp_path / "cyc.yaml"
    p.write_text("a: &a [*a]\n")
    return p


def test_config_file(alarm, capsys, cfg):
    cfg.write_text(cfg.read_text() + "output: &a [*a]\n")
    assert f"config file {cfg}:" in _cli(capsys, ["simulate", str(cfg)])


def test_param_option(alarm, capsys, cfg):
    assert "--param degree:" in _cli(capsys, ["simulate", str(cfg), "--param", "degree=&a [*a]"])


def test_cost_option(alarm, capsys, cfg):
    err = _cli(capsys, ["simulate", str(cfg), "--cost", "finish_rtol=&a [*a]"])
    assert "--cost finish_rtol:" in err


def test_sweep_spec(alarm, capsys, cfg, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"base: {cfg.name}\ngrid: &a {{nodes: [*a]}}\n")
    err = _cli(capsys, ["sweep", str(spec), "--out", str(tmp_path / "sw")])
    assert f"sweep spec {spec}:" in err


def test_calibration_file(alarm, capsys, cfg, cyc):
    err = _cli(capsys, ["simulate", str(cfg), "--calibration", str(cyc)])
    assert f"calibration file {cyc}:" in err


def test_topology_file(alarm, capsys, cfg, cyc):
    err = _cli(capsys, ["simulate", str(cfg), "--topology", str(cyc)])
    assert f"topology file {cyc}:" in err
