"""The GPU GEMM model (sim.hardware.costs.gemm): its mechanisms on made-up GPUs, and the
`dgx-h100` preset's accuracy on the shipped H100 measurements (a property of the model and
its data, deterministic: no timing of this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.hardware.costs import CostModel
from sim.hardware.costs.gemm import GemmModel, gemm_layout, leading_dims
from sim.hardware.topology import Topology

DATA = Path(__file__).resolve().parents[2] / "shared/reference/measurements/h100-sxm-2026-11-23"


def _gpu(mem_bw: float = 1e15, **gemm) -> dict:
    return {
        "peak_flops": {"bf16": 100e12, "fp32": 10e12},
        "mem_bw": mem_bw,
        "gemm": {
            "sms": 10,
            "tiles": [[128, 128]],
            "efficiency": {"bf16": 1.0, "fp32": 1.0},
            "read_efficiency": 1.0,
            "write_efficiency": 1.0,
            **gemm,
        },
    }


def _model(mem_bw: float = 1e15, **gemm) -> GemmModel:
    m = GemmModel.from_gpu(_gpu(mem_bw, **gemm))
    assert m is not None
    return m


def test_waves_quantise_over_the_sms():
    """10 SMs: 10 tiles take one wave, 11 take two (one tile's time each)."""
    g = _model()
    k = 4096
    tile_s = 2 * 128 * 128 * k / (100e12 / 10)
    assert g.seconds("bf16", 10, 128, 128, k) == pytest.approx(tile_s)
    assert g.seconds("bf16", 11, 128, 128, k) == pytest.approx(2 * tile_s)
    assert g.best("bf16", 11, 128, 128, k).waves == 2
    # a partial tile costs a whole one
    assert g.seconds("bf16", 10, 129, 128, k) == pytest.approx(2 * tile_s)


def test_tile_overhead_launch_and_dtype_peaks():
    g = _model(tile_overhead_k=64, launch_s=1e-5)
    k = 1024
    want = 1e-5 + 2 * 128 * 128 * (k + 64) / (100e12 / 10)
    assert g.seconds("bf16", 1, 128, 128, k) == pytest.approx(want)
    fp32 = g.seconds("fp32", 1, 128, 128, k) - 1e-5
    assert fp32 == pytest.approx(10 * (want - 1e-5))  # a tenth of the peak
    with pytest.raises(ConfigError, match="fp16"):
        g.seconds("fp16", 1, 128, 128, k)


def test_small_gemms_are_bound_by_memory():
    """A GEMM that reads far more than it computes takes its bytes' time, reads and writes
    at their own efficiencies."""
    g = _model(1e12, read_efficiency=0.5, write_efficiency=0.25)
    b, m, n, k = 1, 8, 65536, 8192  # [8 x 8192] x [8192 x 65536]: the weight read dominates
    c = g.best("bf16", b, m, n, k)
    assert c.memory_s > c.compute_s
    want = 2 * (m * k + k * n) / 0.5e12 + 2 * m * n / 0.25e12
    assert c.seconds == pytest.approx(want)


def test_split_k_fills_idle_sms():
    g = _model(split_k=[1, 2, 4, 8], split_k_min_depth=512)
    c = g.best("bf16", 1, 128, 128, 65536)  # one tile on 10 SMs, a deep reduction
    assert c.split == 8 and c.waves == 1
    assert c.compute_s == pytest.approx(2 * 128 * 128 * (65536 // 8) / (100e12 / 10))
    assert g.best("bf16", 10, 128, 128, 65536).split == 1  # the SMs are full already


def test_layouts_and_alignment():
    g = _model(unaligned_efficiency=0.2)
    assert gemm_layout({"m": 1}) == "nn" and gemm_layout({"layout": "tn"}) == "tn"
    with pytest.raises(ValueError, match="layout"):
        gemm_layout({"layout": "xx"})
    # wgrad x^T dy with x [C, M]: as a view its leading dimension is M (aligned); materialised
    # as [M, C] it is C = 1229, not a multiple of 8 bf16 elements
    m, n, k = 2048, 8192, 1229
    assert leading_dims(m, n, k, "tn") == (m, n, n) and leading_dims(m, n, k, "nn")[0] == k
    view, mat = g.seconds("bf16", 2, m, n, k, "tn"), g.seconds("bf16", 2, m, n, k, "nn")
    assert mat == pytest.approx(view / 0.2, rel=1e-9)


def test_bad_gemm_sections():
    for bad, field in (
        ({"efficiency": {"bf16": 1.5}}, "efficiency.bf16"),
        ({"tiles": []}, "tiles"),
        ({"sms": 0}, "sms"),
        ({"split_k": [2]}, "split_k"),
        ({"nonsense": 1}, "unknown"),
    ):
        with pytest.raises(ConfigError, match=field):
            GemmModel.from_gpu(_gpu(**bad))


def test_the_roofline_uses_the_gemm_model_where_the_gpu_has_one():
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, {})
    shape = {"batch": 2, "m": 4096, "n": 14336, "k": 4096}
    t = Task(
        "g",
        0,
        "compute",
        "gemm",
        flops=2.0 * 2 * 4096 * 14336 * 4096,
        shape=shape,
        tags={"dtype": "bf16"},
    )
    model = GemmModel.from_gpu(topo.gpu)
    assert model is not None
    assert costs.compute.duration(t) == model.seconds("bf16", 2, 4096, 14336, 4096)
    empty = Task(
        "e", 0, "compute", "gemm", bytes=1e6, shape={**shape, "m": 0}, tags={"dtype": "bf16"}
    )
    assert costs.compute.duration(empty) == 0.0  # no tokens, no kernel
    plain = CostModel.build(topo, {"roofline": {"gemm_model": False}})
    assert plain.compute.duration(t) == pytest.approx(5e-6 + t.flops / (989e12 * 0.8))
    with pytest.raises(ConfigError, match="gemm_model"):
        CostModel.build(topo, {"roofline": {"gemm_model": "yes"}})


# -- the shipped H100 measurements ------------------------------------------------------------
needs_data = pytest.mark.skipif(
    not (DATA / "h100_micro.csv").is_file(), reason=f"no H100 measurements at {DATA}"
)


@needs_data
def test_dgx_h100_predicts_the_measured_h100_gemms():
    """Issue 10's target: MAPE <= 10% and no shape worse than 25%, on the rows the model was
    fitted to and on the rows held out of the fit alike (benchmarks/gpu_model_h100.py)."""
    from sim.hardware.costs.gemm_reference import load, predict, score

    df = load(DATA)
    assert len(df) >= 100 and df["held_out"].sum() >= 40
    model = GemmModel.from_gpu(Topology.load("dgx-h100", nodes=1).gpu)
    assert model is not None
    as_trained = df[df["aligned"]]
    for held_out in (False, True):
        s = score(predict(model, as_trained[as_trained["held_out"] == held_out]))
        assert s.mape_pct <= 10.0 and s.worst_pct <= 25.0, (held_out, s)
    # an operand materialised with an unaligned leading dimension is far slower, as measured
    for r in predict(model, df[~df["aligned"]]).itertuples():
        view = predict(model, df[df["bench"] == r.bench.replace("materialised", "view")])
        assert r.seconds > 2 * view["seconds"].iloc[0]  # measured
        assert r.predicted > 2 * view["predicted"].iloc[0]  # modelled


@needs_data
def test_dgx_h100_copy_engine_and_interference_match_the_measurements():
    import pandas as pd

    from sim.core.graph import TaskGraph
    from sim.engine.engine import simulate

    micro = pd.read_csv(DATA / "h100_micro.csv")
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, {})
    for kind in ("d2h", "h2d"):
        measured = micro[(micro["bench"] == f"{kind}_pinned") & (micro["bytes"] == 2**30)]
        g = TaskGraph(8)
        g.add(Task("c", 0, "copy", kind, bytes=float(2**30)))
        sim = simulate(g, topo, costs).makespan
        assert sim == pytest.approx(float(measured["t_med_s"].iloc[0]), rel=0.03), kind
    # a GEMM beside a pinned d2h, and the d2h beside it, run at full speed (finding 4)
    alone = micro.set_index("bench")["t_med_s"]
    assert alone["alone_gemm"] / alone["overlap_gemm_with_d2h"] > 0.97
    inter = topo.gpu["interference"]
    assert inter["compute"]["copy"] == 1.0 and inter["copy"]["compute"] == 1.0
