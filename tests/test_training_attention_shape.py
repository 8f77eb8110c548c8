"""The attention kernels' share against their shape (`sim.training.attention_shape`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.errors import TopologyError
from sim.hardware.topology import Topology
from sim.training.attention_shape import AttentionShape
from sim.training.layout import Layout
from sim.training.ops import Work
from sim.training.recipe import Recipe
from tests.test_training_memory import _model

LAW = AttentionShape.from_spec(
    {
        "len0": {"fwd": 500.0, "bwd": 1000.0},
        "head_dim": {64: {"fwd": 0.6, "bwd": 0.8}, 128: {"fwd": 1.0, "bwd": 1.0}},
        "ref_len": 4000.0,
    }
)


def test_the_law_is_one_at_its_reference_and_its_closed_form_elsewhere() -> None:
    """factor = head[d] (1 + len0 / ref_len) / (1 + len0 / L): 1 at (ref_len, 128), the
    long-sequence limit 1 + len0 / ref_len, half of that at L = len0."""
    assert LAW.factor(4000.0, 128, False) == pytest.approx(1.0)
    assert LAW.factor(4000.0, 128, True) == pytest.approx(1.0)
    assert LAW.factor(1e12, 128, False) == pytest.approx(1.125)
    assert LAW.factor(500.0, 128, False) == pytest.approx(1.125 / 2)
    assert LAW.factor(1000.0, 128, True) == pytest.approx(1.25 / 2)
    # head dims: the table's, linear between its entries, the nearest beyond them
    assert LAW.factor(4000.0, 64, False) == pytest.approx(0.6)
    assert LAW.factor(4000.0, 96, False) == pytest.approx(0.8)
    assert LAW.factor(4000.0, 96, True) == pytest.approx(0.9)
    assert LAW.factor(4000.0, 32, True) == pytest.approx(0.8)
    assert LAW.factor(4000.0, 256, False) == pytest.approx(1.0)
    # an unknown shape keeps the preset's share
    assert LAW.factor(0.0, 128, False) == LAW.factor(4000.0, 0, True) == 1.0


def test_a_kernel_pays_its_shape_and_one_share_without_a_law() -> None:
    """Attention time = FLOPs / (bf16 peak x share x sustained x factor) where compute-bound;
    a GPU with no `attention_shape` charges the one share whatever the shape."""
    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    gpu = _model("qwen3-30b-a3b", lay, "BF16", Recipe()).gpu
    w = Work("core_attn", "attention", 1e12, 1.0, bwd=2.5, span=1000.0, head_dim=64)
    with_law = replace(gpu, attention_shape=LAW)
    plain = replace(gpu, attention_shape=None)
    for bwd in (False, True):
        share = (gpu.attention_bwd if bwd else gpu.attention_fwd) * gpu.sustained
        flops = 1e12 * (2.5 if bwd else 1.0)
        one = flops / (gpu.peak["bf16"] * share)
        assert plain.seconds(w, bwd) == pytest.approx(one)
        assert with_law.seconds(w, bwd) == pytest.approx(one / LAW.factor(1000.0, 64, bwd))


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_kernel_loops_over_one_cp_ranks_chunk(cp: int) -> None:
    """A causal kernel over the whole sequence loops as far as seq / cp tokens on each CP rank
    (the ring's chunks); a banded layer as twice its window."""
    lay = Layout(gpus=8 * cp, tp=1, cp=cp, pp=1, ep=8, gbs=8, seq=8192)
    m = _model("qwen3-30b-a3b", lay, "BF16", Recipe())
    (attn,) = [w for w in m.layer_work(0).work if w.kind == "attention"]
    assert (attn.span, attn.head_dim) == (8192 / cp, 128)
    oss_lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=8192)
    oss = _model("gpt-oss-120b", oss_lay, "BF16", Recipe())
    spans = {w.span for i in range(2) for w in oss.layer_work(i).work if w.kind == "attention"}
    assert spans == {8192.0, 2.0 * oss.a.sliding_window}


def test_a_bad_attention_shape_is_one_line_naming_the_field() -> None:
    spec = Topology.load("hgx-h200").spec
    bad = {**spec, "gpu": {**spec["gpu"], "kernels": {**spec["gpu"]["kernels"]}}}
    bad["gpu"]["kernels"]["attention_shape"] = {"len0": {"fwd": -1, "bwd": 10}, "head_dim": {}}
    with pytest.raises(TopologyError) as e:
        Topology(bad)
    msg = str(e.value)
    assert "\n" not in msg
    assert "attention_shape.len0.fwd" in msg and "attention_shape.head_dim" in msg
