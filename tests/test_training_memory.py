"""Peak memory of a training step (`sim.training.memory`): closed forms of its parts."""

from __future__ import annotations

import pytest

from sim.hardware.topology import Topology
from sim.training.kernels import GpuKernels
from sim.training.layout import Layout
from sim.training.memory import held_activations, step_memory, unquantized_params
from sim.training.ops import ACT, PRECISIONS, layer_work
from sim.training.recipe import Recipe
from sim.training.step import StepModel
from sim.workload.architectures import architecture


class _NoComm:
    simulations = 0

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return 0.0

    def place(self, rank: int) -> int:
        return rank


def _model(name: str, lay: Layout, precision: str, recipe: Recipe) -> StepModel:
    topo = Topology.load("dgx-h100", nodes=max(1, lay.gpus // 8))
    gpu = GpuKernels.from_gpu(topo.gpu, "test")
    return StepModel(architecture(name), lay, PRECISIONS[precision], recipe, gpu, _NoComm())  # type: ignore[arg-type]


@pytest.mark.parametrize("stage,held", [(0, 4), (1, 3), (3, 1)])
def test_plain_1f1b_holds_pp_minus_stage_micro_batches(stage: int, held: int) -> None:
    assert held_activations([5.0], pp=4, micro=8, stage=stage) == pytest.approx(5.0 * held)


def test_interleaved_holds_its_warm_up_plus_one_chunk_passes() -> None:
    """(pp - stage - 1) x 2 + (vp - 1) x pp warm-up forwards, then one more (Megatron-Core)."""
    pp, vp = 4, 2
    assert held_activations([1.0] * vp, pp, micro=8, stage=0) == pytest.approx(3 * 2 + 4 + 1)


@pytest.mark.parametrize("a,b,peak", [(1.0, 10.0, 23.0), (10.0, 1.0, 41.0)])
def test_interleaved_peak_follows_which_chunks_are_held(a: float, b: float, peak: float) -> None:
    """pp 2, vp 2, 4 micro-batches, stage 0: forwards (m0 c0)(m1 c0)(m0 c1)(m1 c1) warm up;
    then F(m2 c0) holds 3a + 2b, and after B(m0 c1), F(m3 c0) holds 4a + b."""
    assert held_activations([a, b], pp=2, micro=4, stage=0) == pytest.approx(peak)


def test_fp8_primary_weights_drop_the_bf16_copy_of_the_linear_weights() -> None:
    """With fp8_param_gather a linear weight is its quantized row- and column-wise data
    (2 x 1 B); without, a bf16 weight (2 B) and those cached copies: 2 B per linear weight
    more. The embedding, the LM head and the router stay bf16 either way."""
    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    base = Recipe(grad_reduce_bytes=2)
    gathered = Recipe(grad_reduce_bytes=2, fp8_param_gather=True)
    m0 = _model("qwen3-30b-a3b", lay, "FP8-CS", base)
    m1 = _model("qwen3-30b-a3b", lay, "FP8-CS", gathered)
    works = m0.chunk_work()
    r0, r1 = step_memory(m0, works), step_memory(m1, m1.chunk_work())
    params = sum(sum(m0.params(lw)) for lw in works[0][0])
    plain = sum(unquantized_params(lw, m0) for lw in works[0][0])
    assert 0 < plain < params
    assert r0.parts["quantized_weights"] == pytest.approx(2 * 1.0 * (params - plain))
    assert r0.parts["quantized_weights"] == r1.parts["quantized_weights"]
    drop = r0.parts["model_state"] - r1.parts["model_state"]
    assert drop == pytest.approx(2 * (params - plain))


def test_moe_keeps_the_activation_input_and_probabilities_not_the_expert_outputs() -> None:
    """Megatron-Core weighs routed rows by their probabilities in the experts' activation:
    the unpermute keeps nothing, the activation its input (2 x F per row) and the fp32
    probabilities."""
    a = architecture("qwen3-30b-a3b")
    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    lw = layer_work(a, lay, PRECISIONS["BF16"], 0)
    by = {w.name: w for w in lw.work}
    routed = lay.mbs * lay.seq * a.top_k
    assert by["unpermute"].kept == 0.0
    assert by["expert.act"].kept == pytest.approx(2 * ACT * routed * a.moe_ffn + 4.0 * routed)
