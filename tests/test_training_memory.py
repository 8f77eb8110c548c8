"""Peak memory of a training step (`sim.training.memory`): closed forms of its parts."""

from __future__ import annotations

import pytest

from sim.hardware.topology import Topology
from sim.training.kernels import GpuKernels
from sim.training.layout import Layout
from sim.training.memory import held_activations, step_memory, unquantized_params
from sim.training.ops import ACT, layer_work
from sim.training.precision import PRECISIONS
from sim.training.recipe import Recipe
from sim.training.step import StepModel
from sim.workload.architectures import architecture
from tests.configs import NoComm


def _model(name: str, lay: Layout, precision: str, recipe: Recipe) -> StepModel:
    topo = Topology.load("dgx-h100", nodes=max(1, lay.gpus // 8))
    gpu = GpuKernels.from_gpu(topo.gpu, "test")
    return StepModel(architecture(name), lay, PRECISIONS[precision], recipe, gpu, NoComm())  # type: ignore[arg-type]


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


def _on(preset: str, name: str, lay: Layout, precision: str, recipe: Recipe) -> StepModel:
    topo = Topology.load(preset, nodes=max(1, lay.gpus // 8))
    gpu = GpuKernels.from_gpu(topo.gpu, "test")
    return StepModel(architecture(name), lay, PRECISIONS[precision], recipe, gpu, NoComm())  # type: ignore[arg-type]


def _sums(m: StepModel) -> tuple[float, float, float]:
    """(dense, expert, plain) parameters of the single stage's layer works."""
    works = m.chunk_work()[0][0]
    dense = sum(m.params(lw)[0] for lw in works)
    expert = sum(m.params(lw)[1] for lw in works)
    return dense, expert, sum(unquantized_params(lw, m) for lw in works)


@pytest.mark.parametrize(
    "preset,precision,copies",
    [("dgx-h100", "FP8-CS", 2), ("dgx-b200", "FP8-CS", 1), ("dgx-b200", "MXFP8", 2)],
)
def test_quantized_weight_copies_per_gpu_and_scaling(
    preset: str, precision: str, copies: int
) -> None:
    """A per-tensor scaled FP8 weight keeps a transpose only where FP8 GEMMs take TN layouts
    alone (Hopper); on Blackwell (compute capability 10.0) one copy; MXFP8 scales rows and
    columns apart: two everywhere. Bytes: copies x 1 B x linear weights."""
    lay = Layout(gpus=8, tp=1, pp=1, ep=8, gbs=8, seq=4096)
    m = _on(preset, "qwen3-30b-a3b", lay, precision, Recipe(grad_reduce_bytes=2))
    dense, expert, plain = _sums(m)
    rep = step_memory(m, m.chunk_work())
    assert rep.parts["quantized_weights"] == pytest.approx(copies * 1.0 * (dense + expert - plain))


@pytest.mark.parametrize(
    "preset,precision,write",
    [("dgx-h100", "FP8-CS", 2.0), ("dgx-b200", "FP8-CS", 1.0), ("dgx-b200", "MXFP8", 2.0625)],
)
def test_a_cast_writes_the_copies_the_gpu_keeps(preset: str, precision: str, write: float) -> None:
    """A linear layer's input cast reads the bf16 input (2 B), writes the quantized copies
    the GPU keeps (per-tensor FP8: both orientations on Hopper, one on Blackwell, as
    `quantized_copies`; MXFP8: both, with an E8M0 scale per 32) and reads the input once more
    for current scaling's amax: bytes = elements x (2 + write + extra read)."""
    lay = Layout(gpus=8, tp=1, pp=1, gbs=8, seq=4096)
    m = _on(preset, "llama3-8b", lay, precision, Recipe(grad_reduce_bytes=2))
    lw = m.layer_work(1)
    cast = next(w for w in lw.work if w.name == "qkv.cast")
    elems = lay.mbs * lay.seq * m.a.hidden
    assert cast.bytes == pytest.approx(
        elems * (2.0 + write + PRECISIONS[precision].cast_extra_read)
    )


@pytest.mark.parametrize(
    "precision,recipe,per_param",
    [
        ("BF16", Recipe(grad_reduce_bytes=2), 12.0),
        # FusedAdam keeps the master weights of a BF16 run: 16 remainder bits (2 B) + fp32 m, v
        ("BF16", Recipe(grad_reduce_bytes=2, precision_aware_optimizer=True), 10.0),
        (
            "BF16",
            Recipe(
                grad_reduce_bytes=2,
                precision_aware_optimizer=True,
                exp_avg_bytes=2,
                exp_avg_sq_bytes=2,
            ),
            6.0,
        ),
        # an FP8 (current scaling) run: Megatron-Core keeps the fp32 master (4 B) + bf16 m, v
        (
            "FP8-CS",
            Recipe(
                grad_reduce_bytes=2,
                precision_aware_optimizer=True,
                exp_avg_bytes=2,
                exp_avg_sq_bytes=2,
            ),
            8.0,
        ),
    ],
)
def test_optimizer_state_per_parameter(precision: str, recipe: Recipe, per_param: float) -> None:
    """model state = 2 B weight + gradient bytes, per parameter, + the optimizer's bytes per
    parameter over its data-parallel ranks (dense: DP x CP, experts: expert-DP)."""
    lay = Layout(gpus=16, tp=1, pp=1, ep=8, gbs=16, seq=4096)
    m = _on("dgx-b200", "qwen3-30b-a3b", lay, precision, recipe)
    dense, expert, plain = _sums(m)
    rep = step_memory(m, m.chunk_work())
    weights = dense + expert
    state = 2 * weights + 2 * weights + per_param * (dense / lay.dpcp + expert / lay.edp)
    assert rep.parts["model_state"] == pytest.approx(state)


def test_fsdp_holds_two_layers_gathered_weights_and_gradients() -> None:
    """Megatron-FSDP's two buffers of a layer's gathered weights and of its gradients:
    2 x (2 B + 2 B) x a layer's parameters in BF16 with bf16 gradients; the precision-aware
    optimizer is off with FSDP (12 B of optimizer state, sharded)."""
    lay = Layout(gpus=8, tp=1, pp=1, fsdp=8, gbs=8, seq=4096)
    recipe = Recipe(grad_reduce_bytes=2, precision_aware_optimizer=True)
    m = _on("dgx-h100", "llama3-8b", lay, "BF16", recipe)
    works = m.chunk_work()
    layer = max(sum(m.params(lw)) for lw in works[0][0] if lw.layer >= 0)
    params = sum(sum(m.params(lw)) for lw in works[0][0])
    rep = step_memory(m, works)
    assert rep.parts["fsdp_buffers"] == pytest.approx(2 * (2 + 2) * layer)
    assert rep.parts["model_state"] == pytest.approx((2 + 2 + 12) * params / 8)


def test_fsdp_gathers_fp8_primary_weights_in_their_quantized_bytes() -> None:
    """With fp8_param_gather a layer's linear weights are gathered as FP8 (one copy on
    Blackwell: 1 B), its norms in bf16; its gradients in bf16."""
    lay = Layout(gpus=8, tp=1, pp=1, fsdp=8, gbs=8, seq=4096)
    recipe = Recipe(grad_reduce_bytes=2, fp8_param_gather=True)
    m = _on("dgx-b200", "llama3-8b", lay, "FP8-CS", recipe)
    works = m.chunk_work()
    lw = next(lw for lw in works[0][0] if lw.layer >= 0)
    layer, plain = sum(m.params(lw)), unquantized_params(lw, m)
    rep = step_memory(m, works)
    assert rep.parts["fsdp_buffers"] == pytest.approx(
        2 * (1 * (layer - plain) + 2 * plain + 2 * layer)
    )


def test_offloading_keeps_the_other_layers_and_needs_no_pipeline() -> None:
    """Offloading n of L layers keeps (L - n) layers' activations (Transformer Engine's
    DefaultOffloadSynchronizer); with a pipeline Megatron-Core offloads nothing."""
    a = architecture("llama3-8b")
    lay = Layout(gpus=8, tp=1, pp=1, gbs=8, seq=4096)
    m0 = _on("dgx-h100", "llama3-8b", lay, "BF16", Recipe())
    m1 = _on("dgx-h100", "llama3-8b", lay, "BF16", Recipe(offload_layers=10))
    w0 = m0.chunk_work()
    per_layer = m0.saved_bytes(next(lw for lw in w0[0][0] if lw.layer >= 0))
    drop = step_memory(m0, w0).parts["activations"]
    drop -= step_memory(m1, m1.chunk_work()).parts["activations"]
    assert drop == pytest.approx(10 * per_layer)
    assert a.layers > 10
    piped = Layout(gpus=8, tp=1, pp=2, gbs=8, seq=4096)
    p0 = _on("dgx-h100", "llama3-8b", piped, "BF16", Recipe())
    p1 = _on("dgx-h100", "llama3-8b", piped, "BF16", Recipe(offload_layers=10))
    assert (
        step_memory(p1, p1.chunk_work()).peak_bytes == step_memory(p0, p0.chunk_work()).peak_bytes
    )


def test_capacity_is_what_cuda_reports() -> None:
    """The capacity is the topology's `cuda_memory_bytes` (CUDA's total: an H100 80GB HBM3's
    81089 MiB), not the datasheet's 80 GB."""
    gpu = GpuKernels.from_gpu(Topology.load("dgx-h100", nodes=1).gpu, "test")
    assert gpu.memory_bytes == pytest.approx(81089 * 2**20, rel=1e-4)
    assert gpu.compute_capability == (9, 0) and not gpu.fp8_any_layout
    b200 = GpuKernels.from_gpu(Topology.load("dgx-b200", nodes=1).gpu, "test")
    assert b200.compute_capability == (10, 0) and b200.fp8_any_layout


def test_recipes_record_the_precision_aware_optimizer() -> None:
    """recipes.yaml's `precision_aware_optimizer`: Megatron-Bridge sets the flag for BF16 runs
    (fp32 moments: Megatron-Core's defaults); DeepSeek-V3's recipe sets bf16 moments."""
    from sim.training.recipe import recipe_for

    oss = recipe_for("GPT_OSS_120B", "DGX-B200", "BF16", "25.11")
    assert oss.precision_aware_optimizer and (oss.exp_avg_bytes, oss.exp_avg_sq_bytes) == (4, 4)
    dsv3 = recipe_for("DeepSeekV3", "DGX-GB200", "MXFP8", "26.02")
    assert dsv3.precision_aware_optimizer and (dsv3.exp_avg_bytes, dsv3.exp_avg_sq_bytes) == (2, 2)
    assert not recipe_for("LLAMA3_70B", "DGX-GB200", "FP8", "26.02").precision_aware_optimizer
