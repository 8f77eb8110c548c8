"""Run-to-run noise (sim.hardware.costs.jitter): degenerate cases in closed form, one draw per
collective, replicas, the fit from repetitions, and the amplification a synchronising step
gives it as ranks are added."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.calibration import Calibration
from sim.hardware.costs.jitter import Jitter, ratio_quantiles
from sim.hardware.topology import Topology
from tests.test_network import star

TOPO = star()


def costs(jitter=None, **extra) -> CostModel:
    spec = {
        "compute": "alpha_beta",
        "alpha": 0.0,
        "network": "collective",
        "alpha_beta": {"gemm": {"alpha": 1.0, "beta": 0.0}},
        "collectives": {"all_to_all": {"alpha": 2.0, "beta": 0.0}},
        **extra,
    }
    if jitter is not None:
        spec["jitter"] = jitter
    return CostModel.build(TOPO, spec)


def step(world: int) -> TaskGraph:
    """Per rank a GEMM, then an all-to-all of everyone."""
    g = TaskGraph(world)
    group = list(range(world))
    for r in range(world):
        g.add(Task(f"g{r}", r, "compute", "gemm"))
        g.add(Task(f"a{r}", r, "comm", "all_to_all", deps=[f"g{r}"], group=group, coll="x"))
    return g


def test_constant_factors_scale_durations_exactly():
    res = simulate(step(2), TOPO, costs({"quantiles": {"gemm": [1.5, 1.5], "comm": [2.0, 2.0]}}))
    assert res.makespan == pytest.approx(1.5 * 1.0 + 2.0 * 2.0)
    ones = {"quantiles": {"gemm": [1.0, 1.0], "all_to_all": [1.0, 1.0]}}
    assert (
        simulate(step(2), TOPO, costs(ones)).makespan == simulate(step(2), TOPO, costs()).makespan
    )


def test_one_draw_per_collective_and_kind_fallbacks():
    """Every member of a collective ends together (one draw for the operation); the class
    key 'comm' stands for communication kinds without quantiles of their own."""
    res = simulate(step(4), TOPO, costs({"quantiles": {"comm": [0.5, 3.0]}, "replicas": 1}))
    ends = {t.id: float(e) for t, e in zip(res.graph, res.end)}
    assert len({round(ends[f"a{r}"], 12) for r in range(4)}) == 1
    assert all(ends[f"g{r}"] == 1.0 for r in range(4))  # gemm: no quantiles, no class key


def test_sampler_follows_the_quantiles():
    s = Jitter({"gemm": (1.0, 3.0)}, seed=7).sampler()
    draws = np.array([s.factor("gemm", "compute") for _ in range(20000)])
    assert draws.min() >= 1.0 and draws.max() <= 3.0
    assert draws.mean() == pytest.approx(2.0, abs=0.02)  # uniform between the two quantiles
    assert np.median(draws) == pytest.approx(2.0, abs=0.03)


def test_replicas_give_the_median_run_reproducibly():
    spec = {"quantiles": {"gemm": [0.5, 1.0, 4.0]}, "seed": 3, "replicas": 9}
    a = simulate(step(2), TOPO, costs(spec))
    b = simulate(step(2), TOPO, costs(spec))
    spans = a.stats["replica_makespans"]
    assert len(spans) == 9 and a.makespan == pytest.approx(float(np.median(spans)))
    assert spans == b.stats["replica_makespans"] and len(set(spans)) > 1


def test_synchronisation_amplifies_noise_with_more_ranks():
    """The step ends with the slowest rank's GEMM: its median grows with the number of ranks
    (the expected maximum of more draws), while the ideal step does not change."""
    spec = {"quantiles": {"gemm": [0.9, 1.0, 1.1, 3.0]}, "replicas": 21}
    topo = Topology.load("flat-switch", nodes=16)  # one GPU per node
    c, ideal_c = costs(spec), costs()
    medians = [simulate(step(w), topo, c).makespan for w in (2, 4, 16)]
    assert medians[0] < medians[1] < medians[2]
    assert {simulate(step(w), topo, ideal_c).makespan for w in (2, 4, 16)} == {3.0}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"quantiles": {"gemm": [2.0, 1.0]}}, "non-decreasing"),
        ({"quantiles": {"gemm": [1.0]}}, "at least 2"),
        ({"quantiles": {"gemm": [0.0, 1.0]}}, "positive"),
        ({"quantiles": {}, "seed": -1}, "seed"),
        ({"quantiles": {}, "replicas": 0}, "replicas"),
        ({"quantiles": {}, "spread": 1}, "unknown"),
        ([1, 2], "expected"),
    ],
)
def test_bad_jitter_specs(bad, field):
    with pytest.raises(ConfigError, match=field):
        costs(bad)


def test_fit_from_repetitions():
    """Ratios to the median of each size's repetitions; sizes with fewer than 3 are left out."""
    t = np.array([1.0, 1.0, 2.0, 10.0, 10.0, 20.0, 5.0])
    groups = np.array(["a", "a", "a", "b", "b", "b", "c"])
    q = ratio_quantiles(t, groups, points=3)
    assert q == pytest.approx([1.0, 1.0, 2.0])
    assert ratio_quantiles(t[-1:], groups[-1:]) is None
    import pandas as pd

    rows = pd.DataFrame(
        [("gemm", 1, x, x * f, "compute", "") for x in (1e6, 2e6) for f in (1.0, 1.0, 1.5)],
        columns=["op", "ranks", "x", "t", "stream", "others"],
    )
    cal = Calibration.fit(rows)
    assert cal.jitter["gemm"][0] == pytest.approx(1.0) and cal.jitter["gemm"][-1] == 1.5
    assert cal.cost_spec()["jitter"] == {"quantiles": cal.jitter}
