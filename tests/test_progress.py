"""Progress on long work: the helper's rules (terminal, MOESIM_PROGRESS, --json), bars from
the engine and from compare on stderr, none under --json, and the finish_rtol hint."""

from __future__ import annotations

import json

import pytest
import yaml

from sim.cli import main
from sim.core import progress
from sim.engine import watch
from tests.configs import SMALL

# skewed routing: all-to-allv simulated flow by flow, a rate solve per flow finish
ZIPF = {**SMALL, "model": {**SMALL["model"], "routing": {"kind": "zipf", "s": 1.2, "seed": 0}}}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test starts with the rule from the environment, no hint printed yet, and bars
    drawn at once and at every step, so that short runs show them."""
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.delenv(watch.SLOW_SOLVE_ENV, raising=False)
    monkeypatch.setattr(progress, "_hinted", set())
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "REFRESH_S", 0.0)
    progress.set_enabled(None)
    yield
    progress.set_enabled(None)


def _config(tmp_path, cfg: dict) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(p)


def test_rule_terminal_environment_and_override(monkeypatch):
    assert not progress.enabled()  # pytest's stderr is not a terminal
    monkeypatch.setenv(progress.ENV, "1")
    assert progress.enabled()
    progress.set_enabled(False)  # what --json does: wins over the environment
    assert not progress.enabled()
    progress.set_enabled(None)
    monkeypatch.setenv(progress.ENV, "0")
    assert not progress.enabled()


def test_bar_draws_on_stderr_only_when_on(monkeypatch, capsys):
    with progress.Bar(3, "work", "step") as bar:
        assert not bar.shown
        bar.update()
        bar.note("x")
    assert capsys.readouterr() == ("", "")
    monkeypatch.setenv(progress.ENV, "1")
    with progress.Bar(3, "work", "step") as bar:
        assert bar.shown
        bar.update()
        bar.set(3)
    out, err = capsys.readouterr()
    assert out == "" and "work" in err and "3/3" in err
    assert list(progress.iterate(["a", "b"], "items")) == ["a", "b"]
    assert "2/2" in capsys.readouterr().err


def test_a_long_solve_redraws_the_bar_by_wall_time(monkeypatch, capsys):
    """Issue 21, item 11: a few slow rate solves (no task finishing) still move the simulated
    time shown: the bar redraws once REFRESH_S of wall time has passed, not every N solves."""
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "REFRESH_S", 0.5)
    t = [100.0]
    monkeypatch.setattr(watch, "clock", lambda: t[0])
    w = watch.Watch(10, 1e-3)
    capsys.readouterr()
    for k, now in enumerate((1e-3, 2e-3, 3e-3)):  # three solves, 0.6 s of wall time apart
        t[0] += 0.6
        w.solved(0.6, 0, now)
        assert f"{now * 1e3:.3f} ms simulated" in capsys.readouterr().err, k
    w.solved(0.0, 0, 4e-3)  # at once: no redraw
    assert "4.000 ms" not in capsys.readouterr().err
    w.close()


def test_hint_once_per_key(capsys):
    progress.hint("k", "do this")
    progress.hint("k", "do this")
    progress.hint("other", "and that")
    err = capsys.readouterr().err
    assert err.count("moesim: hint: do this") == 1 and "moesim: hint: and that" in err


def test_simulate_shows_a_bar_except_under_json(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    cfg = _config(tmp_path, SMALL)
    assert main(["simulate", cfg, "--out", str(tmp_path / "a")]) == 0
    out, err = capsys.readouterr()
    assert "simulate" in err and "task" in err and "makespan" in out
    assert main(["simulate", cfg, "--out", str(tmp_path / "b"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out)["makespan_s"] > 0


def test_compare_steps_once_per_strategy(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    cfg = _config(tmp_path, SMALL)
    args = ["compare", cfg, "--strategies", "sequential", "pipelined:degree=2"]
    assert main([*args, "--out", str(tmp_path / "c")]) == 0
    assert "compare" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "d"), "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_slow_solve_hint_names_finish_rtol(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(watch.SLOW_SOLVE_ENV, "0")  # "slow" from the first solve
    cfg = _config(tmp_path, ZIPF)
    assert main(["simulate", cfg, "--out", str(tmp_path / "a"), "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count("moesim: hint:") == 1 and "costs.finish_rtol" in err
    assert "--cost finish_rtol=1e-3" in err
    # with finish_rtol set (the option the hint names), no hint
    monkeypatch.setattr(progress, "_hinted", set())
    args = ["simulate", cfg, "--out", str(tmp_path / "b"), "--cost", "finish_rtol=1e-3"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "hint" not in err
    written = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    assert written["costs"]["finish_rtol"] == 1e-3


def test_no_hint_below_the_threshold(tmp_path, capsys):
    assert main(["simulate", _config(tmp_path, ZIPF), "--out", str(tmp_path / "a")]) == 0
    assert "hint" not in capsys.readouterr().err


def test_cost_option_errors_in_one_line(tmp_path, capsys):
    cfg = _config(tmp_path, SMALL)
    assert main(["simulate", cfg, "--cost", "finish_rtol"]) == 2
    assert capsys.readouterr().err.strip() == (
        "moesim: error: --cost 'finish_rtol': expected KEY=VALUE"
    )
    assert main(["simulate", cfg, "--cost", "finish_rtol=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moesim: error:") and "finish_rtol" in err and "\n" not in err
