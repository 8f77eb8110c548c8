"""Sequence-parallel TP collectives of a layer, forward and backward, as Transformer Engine
runs them (`sim.training.layer_phases.tp_parts` / `tp_seconds`): the bytes each moves in the
convention `sim.training.comm` takes (all-gather: the rank's shard; reduce-scatter: the
whole buffer), what a column-parallel backward hides beside its GEMMs, and the quantized
all-gathers of an FP8 run."""

from __future__ import annotations

import pytest

from sim.hardware.costs.resources import Resources
from sim.hardware.topology import Topology
from sim.training.contention import Contention, TpSms, gemm_after
from sim.training.kernels import GpuKernels
from sim.training.layer_phases import tp_parts
from sim.training.layout import Layout
from sim.training.ops import ACT, Comm
from sim.training.precision import PRECISIONS, Precision
from sim.training.recipe import Recipe
from sim.training.step import StepModel
from sim.workload.architectures import architecture


class _Recorder:
    """A timer answering `per_byte` seconds per byte of every TP collective, and recording
    (kind, bytes) of each it is asked."""

    simulations = 0
    per_domain = 8

    def __init__(self, per_byte: float = 0.0) -> None:
        self.per_byte = per_byte
        self.asked: list[tuple[str, float]] = []

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        if dim == "tp":
            self.asked.append((kind, nbytes))
        return nbytes * self.per_byte

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        return 0.0

    def place(self, rank: int) -> int:
        return rank


def _model(prec: Precision, timer: _Recorder, tp: int = 4, overlap: bool = False) -> StepModel:
    topo = Topology.load("dgx-h100", nodes=1)
    a = architecture("llama3-8b")
    lay = Layout(gpus=8, tp=tp, gbs=8 // tp, seq=4096)
    recipe = Recipe(tp_comm_overlap=overlap)
    gpu = GpuKernels.from_gpu(topo.gpu, "t")
    return StepModel(a, lay, prec, recipe, gpu, timer)  # type: ignore[arg-type]


def test_parts_move_what_te_moves() -> None:
    """Shard S (all-gather in) and buffer F = tp S (reduce-scatter out): forward each once;
    backward, a column-parallel layer gathers its input again and reduce-scatters its input
    gradient (S moved by the gather, F by the reduce-scatter), a row-parallel one gathers
    its output gradient (its shard, F / tp)."""
    tp, S = 4, 1.0e6
    ag = Comm("ag", "all_gather", "tp", S, "norm1")
    rs = Comm("rs", "reduce_scatter", "tp", tp * S, "proj")
    assert tp_parts(ag, tp, False) == [("all_gather", S)]
    assert tp_parts(rs, tp, False) == [("reduce_scatter", tp * S)]
    assert tp_parts(ag, tp, True) == [("all_gather", S), ("reduce_scatter", tp * S)]
    assert tp_parts(rs, tp, True) == [("all_gather", S)]
    # quantized gathers move the quantized bytes; reduce-scatters stay bf16
    assert tp_parts(ag, tp, True, 0.5) == [("all_gather", S / 2), ("reduce_scatter", tp * S)]
    assert tp_parts(rs, tp, True, 0.5) == [("all_gather", S / 2)]
    assert tp_parts(rs, tp, False, 0.5) == [("reduce_scatter", tp * S)]


def test_a_bf16_layer_asks_each_backward_collective_at_its_size() -> None:
    """Every backward gather of a bf16 layer moves one shard of the forward's tensor, every
    reduce-scatter one whole buffer: no collective is asked at twice or tp times its size."""
    timer = _Recorder()
    m = _model(PRECISIONS["BF16"], timer)
    lw = m.layer_work(0)
    tp = m.lay.tp
    shard = m.lay.mbs * m.lay.seq / tp * m.a.hidden * ACT
    m.phases(lw, True)
    kinds = sorted(timer.asked)
    gathers = [b for k, b in kinds if k == "all_gather"]
    scatters = [b for k, b in kinds if k == "reduce_scatter"]
    assert gathers == pytest.approx([shard] * len(gathers))
    assert scatters == pytest.approx([shard * tp] * len(scatters))
    # two column-parallel layers (QKV, FC1): gather + reduce-scatter each; two row-parallel
    # ones (proj, FC2): a gather each
    assert [k for k, _ in kinds].count("all_gather") == 4
    assert [k for k, _ in kinds].count("reduce_scatter") == 2


def test_without_userbuffers_the_column_backward_hides_beside_its_gemms() -> None:
    """Exposed backward TP time without userbuffers or contention: each row-parallel gather
    whole; a column-parallel layer's gather beside its dgrad and reduce-scatter beside its
    wgrad (half its GEMM's backward each), only what outlasts them."""
    per_byte = 1.0e-10
    timer = _Recorder(per_byte)
    m = _model(PRECISIONS["BF16"], timer)
    lw = m.layer_work(0)
    m.totals["tp_comm_s"] = 0.0
    m.phases(lw, True)
    want = 0.0
    for c in lw.comm:
        if c.dim != "tp":
            continue
        parts = tp_parts(c, m.lay.tp, True)
        if c.kind == "reduce_scatter":
            want += sum(b * per_byte for _, b in parts)
        else:
            half = m.gpu.seconds(gemm_after(lw, c), True) / 2
            want += sum(max(0.0, b * per_byte - half) for _, b in parts)
    assert want > 0
    assert m.totals["tp_comm_s"] == pytest.approx(want)


def test_fp8_gathers_move_one_byte_an_element() -> None:
    """An FP8 run's gathers into its quantized GEMMs move half the bf16 bytes (per-tensor
    scaling: no block scales); MXFP8 adds one scale byte per 32 elements."""
    for name, per_elem in (("FP8-CS", 1.0), ("MXFP8", 1.0 + 1 / 32)):
        bf16, q = _Recorder(), _Recorder()
        _model(PRECISIONS["BF16"], bf16).phases(
            _model(PRECISIONS["BF16"], bf16).layer_work(0), False
        )
        m = _model(PRECISIONS[name], q)
        m.phases(m.layer_work(0), False)
        gathers = [b for k, b in q.asked if k == "all_gather"]
        bf16_gathers = [b for k, b in bf16.asked if k == "all_gather"]
        assert gathers == pytest.approx([b * per_elem / ACT for b in bf16_gathers])
        assert [b for k, b in q.asked if k == "reduce_scatter"] == pytest.approx(
            [b for k, b in bf16.asked if k == "reduce_scatter"]
        )


def test_an_overlapped_collective_longer_than_its_gemm_is_exposed_beyond_it() -> None:
    """Userbuffers' hidden part outlasting the GEMM it hides behind: the GEMM's phase takes
    the collective's time, so what it adds is the excess over the GEMM, not over the longer
    of the two (a ring exchange on the copy engine: no SMs, full speed)."""
    con = Contention(Resources(sms=132, mem_bw=3.35e12, coll_sms=24), tp=TpSms(4, 24, 2, 4, 0))
    assert con.tp_loss("all_gather", True, False, 0.2, 0.5, 0.0) == pytest.approx(0.3)
    assert con.tp_loss("all_gather", True, False, 0.5, 0.2, 0.0) == 0.0
