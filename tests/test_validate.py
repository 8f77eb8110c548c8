"""Sim-vs-measured comparison and its report."""

from __future__ import annotations

import pytest

from sim.analysis.trace import to_frame
from sim.analysis.validate import compare, summarize, write_report
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.workload.moe import MoELayer


def _trace(strategy: str, params: dict, scale: float = 1.0):
    topo = Topology.load("dgx-a100", nodes=1)
    L = MoELayer(batch=1, seq_len=256, model_dim=256, hidden_dim=512, experts=8, world=8)
    df = to_frame(simulate(build(strategy, L, params, ("fwd",)), topo, CostModel.build(topo, {})))
    for c in ("start", "end", "duration"):
        df[c] = df[c] * scale
    return df


def test_compare_and_report(tmp_path):
    seq, pip = _trace("sequential", {}), _trace("pipelined", {"degree": 2})
    # "measured" = simulated stretched by 10% / 30%: errors are -9.1% and -23.1%
    r1 = compare("sequential", _trace("sequential", {}, 1.1), seq)
    r2 = compare("pipelined r=2", _trace("pipelined", {"degree": 2}, 1.3), pip)
    assert r1["error_pct"] == pytest.approx(100 * (1 / 1.1 - 1))
    assert r1["tasks_matched"] == len(seq)
    assert r1["per_kind"]["gemm"]["error_pct"] == pytest.approx(100 * (1 / 1.1 - 1))
    s = summarize([r1, r2])
    assert s["mape_pct"] == pytest.approx((100 * (1 - 1 / 1.1) + 100 * (1 - 1 / 1.3)) / 2)
    assert seq["end"].max() < pip["end"].max()  # this tiny layer: no overlap gain
    assert s["best_simulated"] == ["sequential"] and s["best_measured"] == "sequential"
    assert s["same_best"]
    fast = compare("pipelined r=2", _trace("pipelined", {"degree": 2}, 0.5), pip)
    assert not summarize([r1, fast])["same_best"]
    tie = compare("pipelined r=1", _trace("pipelined", {"degree": 1}, 1.2), seq)
    s = summarize([r1, tie])  # the same schedule: both simulated equal, both first
    assert s["best_simulated"] == ["sequential", "pipelined r=1"] and s["same_best"]
    files = write_report([r1, r2], tmp_path, "test", {"device": "none"})
    md = files["markdown"].read_text()
    assert "MAPE" in md and "pipelined r=2" in md and "gemm" in md
    assert "plotly" in files["html"].read_text()


def test_error_against_the_fastest_run():
    """The second MAPE compares with each graph's fastest run (noise only adds time)."""
    r = {"graph": "g", "simulated_s": 1.0, "per_kind": {}}
    a = {**r, "measured_s": 1.25, "error_pct": -20.0, "measured_runs_s": [1.1, 1.25, 1.6]}
    b = {**r, "measured_s": 2.0, "error_pct": -50.0}  # no runs recorded: the median stands
    s = summarize([a, b])
    assert s["mape_pct"] == pytest.approx(35.0)
    assert s["mape_fastest_run_pct"] == pytest.approx((100 * 0.1 / 1.1 + 50.0) / 2)


def test_validation_says_when_it_cannot_be_trusted(monkeypatch):
    """Run-to-run spread and host load go into the report, with a warning when the spread is
    larger than the error reported (exec.measure.validation.trustworthiness)."""
    import exec.measure.validation as v

    monkeypatch.setattr(v.os, "cpu_count", lambda: 4)

    def res(measured, simulated, runs):
        return {
            "graph": f"g{measured}",
            "measured_s": measured,
            "simulated_s": simulated,
            "error_pct": 100 * (simulated / measured - 1),
            "measured_runs_s": runs,
        }

    steady = [res(1.0, 1.1, [0.99, 1.0, 1.01]), res(2.0, 1.8, [1.98, 2.0, 2.02])]
    t = v.trustworthiness(steady, [1.0, 2.0], 3)
    assert t["warning"] is None and t["spread_pct_median"] == pytest.approx(2.0)
    assert "run-to-run spread" in t["context"] and "4 CPUs" in t["context"]["host load"]
    noisy = [res(1.0, 1.05, [0.8, 1.0, 1.4]), res(2.0, 2.1, [1.5, 2.0, 2.6])]
    t = v.trustworthiness(noisy, [9.0], 3)
    assert "larger than the error" in t["warning"] and "busy (load 9.0" in t["warning"]
    assert t["context"]["WARNING"] == t["warning"]
    assert "spread is unknown" in v.trustworthiness([res(1.0, 1.1, [1.0])], [None], 1)["warning"]


def test_the_pick_per_config_its_margin_and_the_rank_correlation(tmp_path):
    """Issue 29 item 3: per config (pass set) the simulator's pick, by how much it measures
    slower than the measured best, and Spearman's rank correlation, beside the MAPE."""
    from sim.analysis.validate import picks, spearman

    def res(graph, group, measured, simulated):
        return {
            "graph": graph,
            "group": group,
            "measured_s": measured,
            "simulated_s": simulated,
            "error_pct": 100 * (simulated / measured - 1),
            "per_kind": {},
        }

    results = [
        # fwd: the simulator ranks r=2 first, but it measures 20% slower than sequential
        res("sequential fwd", "fwd", 1.0, 1.0),
        res("r=2 fwd", "fwd", 1.2, 0.8),
        res("r=4 fwd", "fwd", 1.5, 1.3),
        # fwd+bwd: same order on both sides
        res("sequential fwd+bwd", "fwd+bwd", 3.0, 2.9),
        res("r=2 fwd+bwd", "fwd+bwd", 3.1, 3.0),
        res("r=4 fwd+bwd", "fwd+bwd", 3.3, 3.2),
    ]
    c = picks(results)
    assert c["fwd"]["pick"] == "r=2 fwd" and c["fwd"]["best_measured"] == "sequential fwd"
    assert c["fwd"]["pick_slower_pct"] == pytest.approx(20.0) and not c["fwd"]["pick_right"]
    assert c["fwd"]["measured_slower_pct"]["r=4 fwd"] == pytest.approx(50.0)
    assert c["fwd"]["rank_correlation"] == pytest.approx(0.5)
    assert c["fwd+bwd"]["pick_right"] and c["fwd+bwd"]["rank_correlation"] == pytest.approx(1.0)
    s = summarize(results)
    assert s["rank_correlation_min"] == pytest.approx(0.5) and not s["picks_right"]
    assert s["pick_slower_pct_max"] == pytest.approx(20.0)
    assert spearman([1.0], [2.0]) is None and spearman([1.0, 1.0], [1.0, 2.0]) is None
    md = write_report(results, tmp_path, "t")["markdown"].read_text()
    assert "fwd: the simulator picks r=2 fwd: +20.0% slower than the measured best" in md
    assert "NOT within 5%" in md and "rank correlation simulated vs measured 0.50" in md


def test_validate_refuses_a_strategy_it_cannot_simulate_before_measuring():
    """Issue 29 item 5: DeepEP on localhost-cpu (no SM count) is refused in one line before
    any measurement; MPipeMoE's `auto` builds against a placeholder calibration."""
    from exec.measure.validation import preflight
    from sim.config import RunConfig
    from sim.core.errors import ConfigError

    cfg = RunConfig.load("benchmarks/validate_cpu.yaml")
    ok = preflight(cfg, 2, "localhost-cpu", ["sequential", "mpipemoe"])
    assert [c.name for c, _, _ in ok][:2] == ["sequential fwd", "mpipemoe fwd"]
    with pytest.raises(ConfigError, match=r"deepep cannot be simulated on localhost-cpu .*SM"):
        preflight(cfg, 2, "localhost-cpu", ["sequential", "deepep"])
