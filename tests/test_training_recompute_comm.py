"""A recomputed layer replays its forward's collectives before its backward (Megatron-Core's
full recomputation checkpoints whole layers, the `moe` module the MoE layer's dispatch,
experts and combine): the backward's phases carry them, and nothing else changes."""

from __future__ import annotations

import pytest

from sim.hardware.topology import Topology
from sim.training.kernels import GpuKernels
from sim.training.layout import Layout
from sim.training.ops import LayerWork
from sim.training.precision import PRECISIONS
from sim.training.recipe import Recipe
from sim.training.step import StepModel
from sim.workload.architectures import architecture

EP_S, TP_S = 3.0e-3, 1.0e-3  # seconds the stub answers per EP / TP collective


class _Fixed:
    """A timer answering a fixed time per collective, whatever its bytes."""

    simulations = 0
    per_domain = 8

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return EP_S if dim == "ep" else TP_S if dim == "tp" else 0.0

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        return EP_S

    def place(self, rank: int) -> int:
        return rank


def _model(recipe: Recipe, tp: int = 1, timer: object = None) -> tuple[StepModel, LayerWork]:
    topo = Topology.load("dgx-h100", nodes=2)
    a = architecture("qwen3-30b-a3b")
    lay = Layout(gpus=16, tp=tp, ep=8, gbs=16 // tp, seq=4096)
    m = StepModel(
        a, lay, PRECISIONS["BF16"], recipe, GpuKernels.from_gpu(topo.gpu, "t"), timer or _Fixed()
    )  # type: ignore[arg-type]
    return m, m.layer_work(a.layers - 1)


def _comm(phases) -> list[float]:
    return [p.seconds for p in phases if p.stream == "comm"]


def _compute(phases) -> float:
    return sum(p.seconds for p in phases if p.stream != "comm")


@pytest.mark.parametrize(
    "recipe,replayed",
    [
        (Recipe(), 0),
        (Recipe(recompute_modules=("moe_act", "layernorm")), 0),  # kernels only
        (Recipe(recompute_modules=("moe",)), 2),  # the MoE layer: dispatch and combine
        (Recipe(recompute_full=True), 2),  # the whole layer
    ],
)
def test_the_backward_replays_the_recomputed_dispatch_and_combine(recipe, replayed):
    m, lw = _model(recipe)
    fwd, bwd = _comm(m.phases(lw, False)), _comm(m.phases(lw, True))
    assert fwd == [EP_S, EP_S]
    assert bwd == [EP_S] * (2 + replayed)
    # the replayed forward's collectives come first, then the backward's own
    assert [p.what for p in m.phases(lw, True) if p.stream == "comm"][:replayed] == [
        "dispatch",
        "combine",
    ][:replayed]


def test_full_recomputation_replays_the_forward_tp_collectives():
    """With sequence parallelism each TP collective a layer runs forward runs again in the
    recomputed forward: against the same step with free TP collectives, the backward's
    compute grows by exactly their forward seconds (the replayed kernels cancel out)."""

    def grown(timer: _Fixed) -> float:
        base, lw = _model(Recipe(), tp=2, timer=timer)
        full, lw2 = _model(Recipe(recompute_full=True), tp=2, timer=timer)
        return _compute(full.phases(lw2, True)) - _compute(base.phases(lw, True))

    _, lw = _model(Recipe(), tp=2)
    tp_fwd = sum(1 for c in lw.comm if c.dim == "tp") * TP_S
    assert tp_fwd > 0
    assert grown(_Fixed()) - grown(_FreeTp()) == pytest.approx(tp_fwd, rel=1e-9)


class _FreeTp(_Fixed):
    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return EP_S if dim == "ep" else 0.0
