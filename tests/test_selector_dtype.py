"""Selectors read the cost of the graph's own dtype from a calibration with fits per dtype
(a GPU's: bf16 GEMMs ~20x faster than fp32 ones), never a dtype-less or fp32 fit."""

from __future__ import annotations

import pytest
import yaml

from sim.core.errors import ConfigError
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.fastermoe.rule import rule_costs
from sim.strategies.mpipemoe.perf import factors_from_cluster, micro_batch_tasks
from sim.strategies.pipemoe import Costs, select, sizes
from sim.workload.moe import MoELayer

# Synthetic GEMM fits (assumed, not measured): 700 vs 40 TFLOP/s-ish betas, equal alphas.
FITS = {"bf16": (1.0e-5, 1.0 / 700e12), "fp32": (1.0e-5, 1.0 / 40e12)}
A2A = (2.0e-5, 1.0 / 100e9)


def _calibration(tmp_path, dtypes=("bf16", "fp32")) -> str:
    raw = {
        "format": 2,
        "meta": {"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "nprocs": 8},
        "compute": {"gemm": {dt: {"alpha": FITS[dt][0], "beta": FITS[dt][1]} for dt in dtypes}},
        "collectives": {
            op: [{"ranks": 8, "alpha": A2A[0], "beta": A2A[1]}]
            for op in ("all_to_all", "all_to_allv", "broadcast", "all_reduce")
        },
    }
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _cluster(tmp_path, **kw) -> Cluster:
    topo = Topology.load("dgx-h100", nodes=1)
    return Cluster(topo, CostModel.build(topo, {"calibration": _calibration(tmp_path, **kw)}))


def _layer(dtype: str) -> MoELayer:
    return MoELayer(
        batch=4, seq_len=1024, model_dim=2048, hidden_dim=8192, experts=8, world=8, dtype=dtype
    )


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_pipemoe_theorem1_uses_the_fit_of_the_layers_dtype(tmp_path, dtype):
    cl = _cluster(tmp_path)
    layer = _layer(dtype)
    c = Costs.from_cluster(cl, 8, dtype=dtype)
    assert (c.alpha_e, c.beta_e) == pytest.approx((2 * FITS[dtype][0], 2 * FITS[dtype][1]))
    assert (c.alpha_a, c.beta_a) == pytest.approx(A2A)
    g = build("pipemoe", layer, {}, ("fwd",), cl)
    n_d, n_e = sizes(layer)
    want = select(c, n_d, n_e, list(range(1, 65)))
    assert (g.meta["degree"], g.meta["selector"]["predicted_s"]) == pytest.approx(want[:2])
    # the other dtype's fit would have chosen another degree: the choice follows the dtype
    other = "fp32" if dtype == "bf16" else "bf16"
    wrong = Costs(2 * FITS[other][0], 2 * FITS[other][1], *A2A)
    assert select(wrong, n_d, n_e, list(range(1, 65)))[0] != g.meta["degree"]


def test_pipemoe_without_a_fit_for_the_dtype_names_it(tmp_path):
    cl = _cluster(tmp_path, dtypes=("fp32",))
    with pytest.raises(ConfigError, match=r"dtype 'bf16'.*\['fp32'\]"):
        build("pipemoe", _layer("bf16"), {}, ("fwd",), cl)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_mpipemoe_and_fastermoe_cost_gemms_in_the_layers_dtype(tmp_path, dtype):
    cl = _cluster(tmp_path)
    layer = _layer(dtype)
    a, b = FITS[dtype]
    gemm, _, _ = micro_batch_tasks(layer, 2)
    f = factors_from_cluster(cl, layer, 2)
    assert f.t_comp == pytest.approx(a + b * gemm.work())
    rows = 100
    fc = 2 * a + b * rows * layer.model_dim * layer.hidden_dim * 2
    assert rule_costs(layer, cl).expert_fwd(rows) == pytest.approx(fc)


def test_a_configs_auto_degree_is_resolved_with_its_calibration(tmp_path):
    """What `moesim exec` runs: the config's cluster with its calibration, the layer's dtype."""
    from sim.config import RunConfig
    from sim.config.cluster import resolve_for

    cfg = RunConfig.from_dict(
        {
            "topology": "dgx-h100",
            "nodes": 1,
            "model": {
                "batch": 4,
                "seq_len": 1024,
                "model_dim": 2048,
                "hidden_dim": 8192,
                "experts_per_gpu": 1,
                "dtype": "bf16",
            },
            "strategy": {"name": "pipemoe"},
            "costs": {"calibration": _calibration(tmp_path)},
        }
    )
    res = resolve_for(cfg, 8)
    layer = _layer("bf16")
    c = Costs(2 * FITS["bf16"][0], 2 * FITS["bf16"][1], *A2A)
    r, t, case = select(c, *sizes(layer), list(range(1, 65)))
    assert res.resolved.chosen == {"degree": r} and res.resolved.info["predicted_s"] == t
    assert res.describe() == [
        f"degree: auto -> {r} (selector: theorem1, case {case}, predicted {t * 1e3:.4g} ms)"
    ]
    # 2 ranks of the 8-GPU cluster: no growth; 16 ranks: two nodes, said so
    assert resolve_for(cfg, 2).notes == []
    grown = resolve_for(cfg, 16)
    assert grown.cluster.topology.nodes == 2 and "2 nodes" in grown.notes[0]
