"""Kernel time of a training step's stretches (`sim.training.kernels`, `StepModel._seconds`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.training.layout import Layout
from sim.training.recipe import Recipe
from tests.test_training_memory import _model


def test_a_stretch_pays_each_kernels_gpu_floor_graphed_or_not() -> None:
    """Between host syncs a stretch takes its kernels' roofline times plus `kernel_s` per
    kernel (the GPU's own floor), the same with every module in a CUDA graph."""
    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    plain = _model("qwen3-30b-a3b", lay, "BF16", Recipe(notes={"moe_token_drop": True}))
    graphed = _model(
        "qwen3-30b-a3b", lay, "BF16", Recipe(cuda_graph_scope=("full",), notes=plain.r.notes)
    )
    lw = plain.layer_work(0)
    names = [w.name for w in lw.work]
    floor = 2e-6
    for m in (plain, graphed):
        m.gpu = replace(m.gpu, kernel_s=floor)
        roof = sum(m.gpu.seconds(w) for w in lw.work)
        kernels = sum(m.gpu.launches(w) for w in lw.work)
        assert m._seconds(lw, names, False) == pytest.approx(roof + kernels * floor)


@pytest.mark.parametrize("dispatcher,sorted_", [("alltoall", True), ("deepep", False)])
def test_the_all_to_all_dispatcher_sorts_received_rows_by_local_expert(
    dispatcher: str, sorted_: bool
) -> None:
    """Megatron-Core's all-to-all dispatcher copies the routed rows into local-expert order
    after the dispatch and back before the combine (two passes of 2 x ACT x rows x hidden
    bytes); DeepEP's layout needs neither."""
    from sim.training.ops import ACT

    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    m = _model("qwen3-30b-a3b", lay, "BF16", Recipe(dispatcher=dispatcher))
    lw = m.layer_work(0)
    by = {w.name: w for w in lw.work}
    combine = next(c for c in lw.comm if c.name == "combine")
    if not sorted_:
        assert "sort_chunks" not in by and combine.after == "expert.fc2"
        return
    routed = lay.mbs * lay.seq * m.a.top_k
    for name in ("sort_chunks", "unsort_chunks"):
        assert by[name].kind == "memory"
        assert by[name].bytes == pytest.approx(2 * ACT * routed * m.a.hidden)
    names = [w.name for w in lw.work]
    dispatch = next(c for c in lw.comm if c.name == "dispatch")
    assert names.index("sort_chunks") == names.index(dispatch.after) + 1
    assert combine.after == "unsort_chunks"


def test_a_gemms_share_follows_its_reduction_length() -> None:
    """k_share = (1 + k0 / 8192) / (1 + k0 / K): 1 at K = 8192 and without k0; a forward
    reduces over k, the backward's data gradient over n and its weight gradient over the rows
    (each the forward's FLOPs)."""
    from sim.training.ops import Work

    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    gpu = replace(
        _model("qwen3-30b-a3b", lay, "BF16", Recipe()).gpu,
        gemm_k0={"bf16": 1000.0},
        kernel_s=0.0,
    )
    assert gpu.k_share("bf16", 8192) == pytest.approx(1.0)
    assert gpu.k_share("bf16", 1000) == pytest.approx((1 + 1000 / 8192) / 2)
    assert gpu.k_share("fp8", 1000) == 1.0  # no k0 for the dtype: one share
    m, n, k = 8192, 4096, 2048
    flops = 2.0 * m * n * k
    w = Work("fc", "gemm", flops, 1.0, "bf16", shape=(m, n, k))
    rate = gpu.rate("bf16") * gpu.wave_share(w)
    assert gpu.seconds(w) == pytest.approx(flops / (rate * gpu.k_share("bf16", k)))
    bwd = flops / (rate * gpu.k_share("bf16", n)) + flops / (rate * gpu.k_share("bf16", m))
    assert gpu.seconds(w, backward=True) == pytest.approx(bwd)
    plain = replace(gpu, gemm_k0={})
    assert plain.seconds(w, backward=True) == pytest.approx(2 * flops / rate)
