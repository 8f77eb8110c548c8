"""Parm's claims over its whole layer grid (slow: Table III's grid, 1,296 layers a testbed
with N_MP and N_ESP in {1, 2, 4}, about 20 minutes on 2 cores; the recorded run is
benchmarks/results/parm.md): on both testbeds S1 and S2 are never slower than the baseline,
and the selector picks the faster of the two in at least 90% of the layers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster

_SPEC = importlib.util.spec_from_file_location(
    "parm_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "parm.py"
)
bench = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
_SPEC.loader.exec_module(bench)  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("testbed", list(bench.TESTBEDS))
def test_pausemp_never_loses_and_the_selector_picks_the_faster(testbed):
    preset, nodes = bench.TESTBEDS[testbed]
    topo = Topology.load(preset, nodes=nodes)
    cl = Cluster(topo, CostModel.build(topo, {}))
    rows = [bench.run_point(cl, tp, esp, layer) for tp, esp, layer in bench.grid(topo.world_size)]
    rows = [r for r in rows if r["memory_bytes"] <= bench.MEMORY[preset]]
    s = bench.summarise(rows)
    assert s["s1_never_slower_pct"] == 100.0 and s["s2_never_slower_pct"] == 100.0
    assert s["selector_picks_faster_pct"] >= 90.0
