"""Alpha-beta fits derived from a cluster's own models (sim.hardware.costs.derived), used where
a topology has no measured fit: collective-level costs and PipeMoE's selector."""

from __future__ import annotations

import pytest

from sim.analysis import collbench
from sim.commands import compare_strategies as compare
from sim.hardware.costs import CostModel
from sim.hardware.costs.compute import RooflineCompute
from sim.hardware.costs.derived import collective_fit, gemm_fit
from sim.hardware.topology import Topology
from sim.strategies.pipemoe import Costs, chunk_gemms

SMALL = {
    "topology": "dgx-a100",
    "nodes": 2,
    "model": {
        "batch": 1,
        "seq_len": 256,
        "model_dim": 512,
        "hidden_dim": 1024,
        "experts_per_gpu": 1,
        "top_k": 1,
        "dtype": "bf16",
    },
    "passes": ["fwd", "bwd"],
}


@pytest.mark.parametrize("kind", ["all_to_all", "all_gather", "all_reduce"])
def test_collective_fit_predicts_the_flow_simulation(kind):
    """The line through two timed payloads predicts the engine's flow-level time of the same
    collective at a third payload (phases with one rate per flow: affine in the payload)."""
    topo = Topology.load("dgx-a100", nodes=2)
    costs = CostModel.build(topo, {"network": "flow"})
    a, b = collective_fit(topo, costs.alpha, costs.compute, kind, 16)
    size = 16 * 2**20
    rows, _ = collbench.run(topo, costs, kind, None, [size])
    per_rank = size / 16 if kind == "all_gather" else size  # as collbench sizes its tasks
    assert a + b * per_rank == pytest.approx(rows[0].time_us * 1e-6, rel=1e-6)
    assert a > 0 and b > 0


def test_collective_mode_without_fits_equals_flow_mode():
    """On the demo's cluster (no measured fits) `--network collective` runs, and where every
    all-to-all runs alone (sequential, pipelined in Tutel's one-stream order) it reproduces
    the flow model exactly."""
    names = ["sequential", "pipelined:degree=2"]
    flow = compare({**SMALL, "costs": {"network": "flow"}}, names).table
    coll = compare({**SMALL, "costs": {"network": "collective"}}, names).table
    assert coll["makespan_s"].to_numpy() == pytest.approx(flow["makespan_s"].to_numpy(), rel=1e-9)


def test_gemm_fit_closed_form_on_a_plain_roofline():
    """Compute-bound GEMMs on a roofline: t = launch + 2 work / (peak eff), exactly linear."""
    roof = RooflineCompute({"bf16": 100e12}, 2e12, launch_s=5e-6, flops_efficiency=0.5)
    shapes = [{"batch": 2, "m": 1024 * r, "n": 4096, "k": 4096} for r in (1, 2, 4, 8)]
    alpha, beta = gemm_fit(roof, shapes, "bf16")
    assert alpha == pytest.approx(5e-6, rel=1e-9)
    assert beta == pytest.approx(2 / 50e12, rel=1e-9)


def test_pipemoe_selector_on_a_cluster_without_fits():
    """PipeMoE's Theorem 1 on dgx-a100 (roofline compute, flow network): alpha_e, beta_e from
    the compute model at the layer's chunk GEMMs, alpha_a, beta_a from the flow model."""
    from sim.config import RunConfig
    from sim.strategies import Cluster

    cfg = RunConfig.from_dict({**SMALL, "strategy": {"name": "pipemoe"}})
    topo = cfg.load_topology()
    costs = CostModel.build(topo, cfg.costs)
    layer = cfg.workload(topo).layer
    c = Costs.from_cluster(Cluster(topo, costs), layer.world, layer)
    a_e, b_e = gemm_fit(costs.compute, chunk_gemms(layer), layer.dtype)
    assert (c.alpha_e, c.beta_e) == (2 * a_e, 2 * b_e)
    assert (c.alpha_a, c.beta_a) == collective_fit(
        topo, costs.alpha, costs.compute, "all_to_all", layer.world
    )
    table = compare(cfg, ["pipemoe"]).table
    assert table.loc[0, "params"].startswith("degree=")
