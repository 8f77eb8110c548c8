"""Calibration fits and the calibration file (the measuring side lives in exec/)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.calibration import Calibration, fit_alpha_beta
from sim.hardware.topology import Topology


def test_fit_recovers_exact_alpha_beta():
    x = np.array([1e6, 2e6, 4e6, 8e6])
    a, b, r2 = fit_alpha_beta(x, 5e-6 + 2e-9 * x)
    assert a == pytest.approx(5e-6) and b == pytest.approx(2e-9) and r2 == pytest.approx(1.0)


def test_fit_is_relative_so_small_sizes_stay_right():
    """One large size measured 5% slow must not move the small sizes' prediction by more
    than that (plain least squares would put alpha off by a factor of 10 here)."""
    x = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    t = 1e-4 + 1e-9 * x
    t[-1] *= 1.05
    a, b, _ = fit_alpha_beta(x, t)
    pred = a + b * x
    assert np.abs(pred[:-1] / t[:-1] - 1).max() < 0.05
    ols_alpha = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), t, rcond=None)[0][0]
    assert abs(ols_alpha - 1e-4) > 5 * abs(a - 1e-4)


def test_fit_keeps_parameters_non_negative():
    x = np.array([1.0, 2.0, 3.0])
    a, b, _ = fit_alpha_beta(x, np.array([0.5, 2.0, 3.5]))  # unconstrained alpha = -1
    assert a == 0.0 and b > 0
    t = np.array([3.0, 2.0, 1.0])
    a, b, _ = fit_alpha_beta(x, t)  # unconstrained beta < 0: the best constant
    # minimises sum((a - t)^2 / t^2): a = sum(1/t) / sum(1/t^2)
    assert b == 0.0 and a == pytest.approx((1 / t).sum() / (1 / t**2).sum())


def _rows() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for x in (1e8, 2e8, 4e8, 8e8):
        t = 1e-4 + 1e-11 * x
        rows += [("gemm", 1, x, t * (1 + 0.01 * rng.standard_normal()), "compute", "")]
        rows += [("gemm", 1, x, t / 0.8, "compute", "comm")]  # 80% speed beside comm
    for x in (1e5, 1e6, 1e7):
        t = 2e-5 + 1e-9 * x
        rows += [
            ("all_to_all", 2, x, t, "comm", ""),
            ("all_to_all", 2, x, t / 0.5, "comm", "compute"),
        ]
        rows += [("all_to_all", 4, x, 2 * t, "comm", "")]
        rows += [("d2h", 1, x, 1e-5 + 1e-10 * x, "copy", "")]
    return pd.DataFrame(rows, columns=["op", "ranks", "x", "t", "stream", "others"])


def test_fit_measurements_and_round_trip(tmp_path):
    cal = Calibration.fit(_rows(), meta={"device": "test"})
    assert cal.compute["gemm"]["beta"] == pytest.approx(1e-11, rel=0.05)
    assert cal.compute["d2h"]["alpha"] == pytest.approx(1e-5)
    fits = {f["ranks"]: f for f in cal.collectives["all_to_all"]}
    assert fits[2]["alpha"] == pytest.approx(2e-5) and fits[4]["beta"] == pytest.approx(2e-9)
    assert cal.interference["compute"]["comm"] == pytest.approx(0.8, rel=0.03)
    assert cal.interference["comm"]["compute"] == pytest.approx(0.5)
    back = Calibration.load(cal.save(tmp_path / "cal.yaml"))
    assert back.to_dict() == cal.to_dict()


def test_calibration_drives_the_cost_model(tmp_path):
    path = Calibration.fit(_rows()).save(tmp_path / "cal.yaml")
    topo = Topology.load("flat-switch", nodes=2)
    costs = CostModel.build(topo, {"calibration": str(path)})
    assert costs.network == "collective" and not costs.interference.trivial
    g = TaskGraph(2)
    for r in range(2):
        g.add(Task(f"a{r}", r, "comm", "all_to_all", bytes=1e6, group=[0, 1], coll="x"))
        g.add(Task(f"c{r}", r, "copy", "d2h", bytes=1e6, deps=[f"a{r}"]))
    res = simulate(g, topo, costs)
    expect = (2e-5 + 1e-9 * 1e6) + (1e-5 + 1e-10 * 1e6)
    assert math.isclose(res.makespan, expect, rel_tol=1e-6)
    # explicit config costs still win over the calibration
    assert CostModel.build(topo, {"calibration": str(path), "network": "flow"}).network == "flow"


def test_dispatch_gaps_and_their_fit(tmp_path):
    """Gaps are start - ready, attributed to whichever of stream predecessor and dependency
    finished last; the fitted means become the cost model's dispatch latencies."""
    from exec.measure.timings import dispatch_gaps

    g = TaskGraph(1)
    g.add(Task("a", 0, "compute", "elementwise"))
    g.add(Task("b", 0, "compute", "elementwise"))  # after a: a stream gap
    g.add(Task("c", 0, "copy", "d2h", deps=["a"]))  # woken by a: a cross gap
    g.add(Task("d", 0, "copy", "d2h", deps=["b"]))  # b ends after c: cross again
    g.add(Task("e", 0, "copy", "d2h"))  # after d: a stream gap
    trace = pd.DataFrame(
        {
            "id": list("abcde"),
            "start": [0.0, 1.1, 1.3, 2.4, 3.45],
            "end": [1.0, 2.1, 2.0, 3.4, 4.0],
        }
    )
    gaps = dispatch_gaps(g, trace).set_index("id")
    assert list(gaps.index) == ["b", "c", "d", "e"]  # a had nothing to wait for
    assert list(gaps["via"]) == ["stream", "cross", "cross", "stream"]
    assert gaps["gap"].to_numpy() == pytest.approx([0.1, 0.3, 0.3, 0.05])
    cal = Calibration.fit(_rows(), gaps=gaps.reset_index())
    assert cal.dispatch["cross"]["mean"] == pytest.approx(0.3)
    assert cal.dispatch["stream"] == {
        "mean": pytest.approx(0.075),
        "median": pytest.approx(0.075),
        "n": 2,
    }
    topo = Topology.load("flat-switch", nodes=2)
    costs = CostModel.build(topo, {"calibration": str(cal.save(tmp_path / "cal.yaml"))})
    assert (costs.dispatch.stream, costs.dispatch.cross) == pytest.approx((0.075, 0.3))


def test_launch_costs_per_kind_fitted_saved_and_used(tmp_path):
    """A GPU run's host seconds per issued task (exec.runtime.runner) become the launch
    thread's cost per kind: the mean of the quiet ones (a 10x outlier left out), in the
    file, and in the cost model (`costs.launch`; other kinds keep resources.launch_s)."""
    from exec.measure.timings import issue_rows

    g = TaskGraph(1)
    for i in range(4):
        g.add(Task(f"m{i}", 0, "compute", "gemm", flops=1.0))
    g.add(Task("x", 0, "comm", "all_to_all", bytes=8.0, group=[0]))
    issued = {"m0": 10e-6, "m1": 12e-6, "m2": 11e-6, "m3": 110e-6, "x": 60e-6}
    cal = Calibration.fit(_rows(), issues=issue_rows(g, issued))
    assert cal.launch["gemm"] == {
        "mean": pytest.approx(11e-6),
        "median": pytest.approx(11e-6),
        "n": 3,
    }
    assert cal.launch["all_to_all"]["mean"] == pytest.approx(60e-6)
    assert any("launch gemm" in line for line in cal.describe())
    path = cal.save(tmp_path / "cal.yaml")
    assert Calibration.load(path).launch == cal.launch
    topo = Topology.load("flat-switch", nodes=2)
    costs = CostModel.build(topo, {"calibration": str(path), "resources": {"launch_s": 1e-6}})
    assert costs.launch.of(g.tasks["m0"]) == pytest.approx(11e-6)
    assert costs.launch.of(Task("e", 0, "compute", "elementwise")) == pytest.approx(1e-6)
    v = Task("v", 0, "comm", "all_to_allv", group=[0])  # not issued: its stand-in's cost
    assert costs.launch.of(v) == pytest.approx(60e-6)
    b = Task("b", 0, "comm", "broadcast", group=[0])  # nor its stand-in (all_reduce): default
    assert costs.launch.of(b) == pytest.approx(1e-6)
    # a calibration without launch costs (a CPU one) leaves the thread as it was
    assert CostModel.build(
        topo, {"calibration": str(Calibration.fit(_rows()).save(tmp_path / "c.yaml"))}
    ).launch.free


def test_exact_gemm_shapes_override_alpha_beta(tmp_path):
    """A GEMM whose (batch, m, n, k) was profiled takes its measured median; any other shape,
    even of the same m*n*k, stays on the alpha-beta fit."""
    rows = _rows().assign(shape="")
    prof = [
        ("gemm", 1, 2 * 64 * 32 * 16, t, "compute", "", "2,64,32,16") for t in (3e-3, 5e-3, 4e-3)
    ]
    rows = pd.concat([rows, pd.DataFrame(prof, columns=rows.columns)], ignore_index=True)
    cal = Calibration.fit(rows)
    want = {"batch": 2, "m": 64, "n": 32, "k": 16, "layout": "nn", "seconds": 4e-3}
    assert cal.gemm_shapes == [want]
    topo = Topology.load("flat-switch", nodes=1)
    costs = CostModel.build(topo, {"calibration": str(cal.save(tmp_path / "c.yaml"))})
    a, b = cal.compute["gemm"]["alpha"], cal.compute["gemm"]["beta"]
    same = Task("x", 0, "compute", "gemm", shape={"batch": 2, "m": 64, "n": 32, "k": 16})
    other = Task("y", 0, "compute", "gemm", shape={"batch": 1, "m": 128, "n": 32, "k": 16})
    assert costs.compute.duration(same) == 4e-3
    assert costs.compute.duration(other) == pytest.approx(a + b * 128 * 32 * 16)
    with pytest.raises(ConfigError, match=r"gemm_shapes\[0\]"):
        CostModel.build(topo, {"compute": "alpha_beta", "gemm_shapes": [{"m": 1}]})


def test_plan_profiles_the_shapes_of_given_graphs():
    from exec.measure.microbench import Plan, gemm_graph
    from sim.strategies import build
    from sim.workload.moe import MoELayer

    layer = MoELayer(batch=1, seq_len=64, model_dim=32, hidden_dim=64, experts=4, world=2)
    g = build("pipelined", layer, {"degree": 2}, ("fwd", "bwd"))
    plan = Plan.quick().with_shapes_of([g])

    def key(t: Task, dtype: str) -> tuple:
        s = t.shape
        return (s["batch"], s["m"], s["n"], s["k"], dtype, s.get("layout", "nn"))

    want = {key(t, "bf16") for t in g if t.kind == "gemm"}
    assert set(plan.gemm_shapes) == want and len(want) >= 4  # fc1, fc2 and their grads
    assert {s[5] for s in want} == {"nn", "nt", "tn"}  # forward, dgrad and wgrad layouts
    # on a CPU the bf16 shapes run (and are tagged) as fp32, their stand-in
    measured = {key(t, t.tags["dtype"]) for t in gemm_graph(2, plan, "cpu") if t.rank == 0}
    assert {(*s[:4], "fp32", s[5]) for s in want} <= measured
    cuda = {t.tags["dtype"] for t in gemm_graph(1, plan, "cuda")}
    assert cuda == {"bf16", "fp16", "fp32", "tf32"}


def test_bad_calibration_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        Calibration.load(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("meta: {}\n")
    with pytest.raises(ConfigError, match="compute"):
        Calibration.load(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="column"):
        Calibration.fit(pd.DataFrame({"op": ["gemm"], "t": [1.0]}))


def test_ops_measured_only_under_overlap_do_not_break_the_fit():
    rows = _rows()
    extra = pd.DataFrame([("encode", 1, 1e6, 1e-3, "compute", "comm")], columns=rows.columns)
    cal = Calibration.fit(pd.concat([rows, extra], ignore_index=True))
    assert "encode" not in cal.compute and cal.interference["compute"]["comm"] < 1
