"""Megatron-Core's EP overlap (sim.strategies.megatron_ep): the merged schedule's stream and
launch order, the plain baseline, the qualitative gain on dgx-h100, bad parameters."""

from __future__ import annotations

import pytest

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.workload.moe import MoELayer

LAYER = MoELayer(batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=4, top_k=2)
PASSES = ("fwd", "bwd")


MERGED = {(1, "fwd"), (0, "bwd")}  # micro-batch 1's forward merged with 0's backward


def _nodes(g, rank: int, stream: str) -> list[str]:
    """Node sequence (node_phase) of the merged step on a rank's stream."""
    out: list[str] = []
    for t in g:
        if t.rank != rank or t.stream != stream or (t.tags["micro"], t.tags["phase"]) not in MERGED:
            continue
        name = f"{t.tags['node']}_{t.tags['phase']}"
        if not out or out[-1] != name:
            out.append(name)
    return out


def test_merged_layer_follows_megatron_stream_order():
    g = build("megatron_ep", LAYER, {"micro": 2, "layers": 1, "shared": 0}, PASSES)
    assert g.meta["micro"] == 2
    # micro-batch 1's forward merged with micro-batch 0's backward
    comp = _nodes(g, 0, "compute")
    assert comp == ["attn_fwd", "mlp_bwd", "mlp_dw_bwd", "mlp_fwd", "attn_bwd", "attn_dw_bwd"]
    assert _nodes(g, 0, "comm") == ["combine_bwd", "dispatch_fwd", "dispatch_bwd", "combine_fwd"]


def test_tasks_enter_the_graph_in_host_launch_order():
    """With one hardware queue kernels start in graph order: the merged step launches
    combine_bwd, attn_fwd, dispatch_fwd, mlp_bwd, dispatch_bwd, mlp_bwd_dw, mlp_fwd,
    combine_fwd, attn_bwd."""
    g = build("megatron_ep", LAYER, {"micro": 2, "layers": 1, "shared": 0}, PASSES)
    seq: list[str] = []
    for t in g:
        if t.rank == 0 and (t.tags["micro"], t.tags["phase"]) in MERGED:
            name = f"{t.tags['node']}_{t.tags['phase']}"
            if not seq or seq[-1] != name:
                seq.append(name)
    assert seq == [
        "combine_bwd",
        "attn_fwd",
        "dispatch_fwd",
        "mlp_bwd",
        "dispatch_bwd",
        "mlp_dw_bwd",
        "mlp_fwd",
        "combine_fwd",
        "attn_bwd",
        "attn_dw_bwd",
    ]


def test_plain_schedule_serialises_every_kernel():
    g = build("megatron_ep", LAYER, {"overlap": False, "micro": 3, "layers": 2}, PASSES)
    prev = None
    for t in g:
        if t.rank != 1:
            continue
        if prev is not None:
            assert prev in t.deps, t.id
        prev = t.id


def test_shared_experts_overlap_on_their_own_stream():
    on = build("megatron_ep", LAYER, {"shared": 1, "micro": 2}, PASSES)
    off = build("megatron_ep", LAYER, {"shared": 1, "micro": 2, "shared_overlap": False}, PASSES)
    assert any(t.stream == "compute.1" for t in on)
    assert not any(t.stream == "compute.1" for t in off)
    assert sum(t.flops for t in on) == pytest.approx(sum(t.flops for t in off))


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather", "flex"])
def test_dispatchers_build_and_keep_compute(dispatcher):
    g = build("megatron_ep", LAYER, {"dispatcher": dispatcher, "micro": 2}, PASSES)
    data = [t for t in g if t.stream == "comm" and t.tags["step"] != "counts"]
    kinds = {t.kind for t in data}
    assert kinds == (
        {"all_gather", "reduce_scatter"} if dispatcher == "allgather" else {"all_to_allv"}
    )
    if dispatcher == "flex":
        assert all(t.algo == "deepep" and t.sms == 24 for t in data)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather", "flex"])
def test_all_to_allv_dispatchers_sync_the_host_once_per_forward_dispatch(dispatcher):
    """Megatron's counts exchange + host sync and DeepEP's notify wait: one host sync per
    (micro-batch, layer) forward dispatch, before it; none for allgather (sizes are fixed)."""
    g = build("megatron_ep", LAYER, {"dispatcher": dispatcher, "micro": 2}, PASSES)
    syncs = [t for t in g if t.host_sync]
    fwd = [t for t in g if t.tags.get("step") == "dispatch" and t.tags["phase"] == "fwd"]
    if dispatcher == "allgather":
        assert not syncs
        return
    assert len(syncs) == len(fwd) > 0
    count_kind = "all_to_all" if dispatcher == "flex" else "all_gather"
    assert all(t.kind == count_kind and t.tags["step"] == "counts" for t in syncs)
    assert all(any(d.endswith("counts") for d in t.deps) for t in fwd)


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_overlap_beats_plain_on_dgx_h100_and_one_queue_shrinks_it(dispatcher):
    """The published claim's direction on its hardware: a DeepSeek-like block (hidden 7168,
    256 experts top-8, one shared expert) on 8 H100; the gain stays in a sane band (the
    benchmark records the number against the published 1.1-1.35x) and is smaller when every
    stream's kernels share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1)."""
    topo = Topology.load("dgx-h100", nodes=1)
    layer = MoELayer(
        batch=1, seq_len=1024, model_dim=7168, hidden_dim=2048, experts=256, world=8, top_k=8
    )
    gains = {}
    for queues in (32, 1):
        costs = CostModel.build(topo, {"resources": {"max_connections": queues}})
        spans = {}
        for overlap in (False, True):
            params = {
                "dispatcher": dispatcher,
                "overlap": overlap,
                "micro": 3,
                "layers": 1,
                "heads": 56,
                "shared": 1,
            }
            g = build("megatron_ep", layer, params, PASSES, Cluster(topo, costs))
            spans[overlap] = simulate(g, topo, costs).makespan
        gains[queues] = spans[False] / spans[True]
    assert 1.0 < gains[1] < gains[32] < 2.0


@pytest.mark.parametrize(
    "params,field",
    [
        ({"dispatcher": "nccl"}, "strategy.dispatcher"),
        ({"overlap": "maybe"}, "strategy.overlap"),
        ({"micro": 0}, "strategy.micro"),
        ({"layers": 0}, "strategy.layers"),
        ({"heads": 3}, "strategy.heads"),
        ({"dispatch_dtype": "int4"}, "strategy.dispatch_dtype"),
    ],
)
def test_bad_parameters_are_one_line_errors(params, field):
    with pytest.raises(ConfigError, match=field):
        build("megatron_ep", LAYER, params, PASSES)


@pytest.mark.parametrize("name", ["megatron_ep", "dualpipe"])
def test_a_huge_stage_is_refused_before_it_is_built(name):
    """Found by the input fuzzer: `layers: 1e30` built tasks for minutes before the graph's own
    limit stopped it; the size is now checked first, in one line."""
    params = {"layers": 10**30, "micro": 4}
    if name == "dualpipe":
        params["pp"] = 2
    with pytest.raises(ConfigError, match=r"limits\.max_tasks") as e:
        build(name, LAYER, params, PASSES)
    assert "\n" not in str(e.value) and f"{name}'s graph" in str(e.value)


def test_flex_dispatches_megatrons_bf16_rows_unless_fp8_is_asked():
    """Megatron-Core hands DeepEP the hidden states as they are (BF16): a forward dispatch row
    is 2 M bytes; "fp8" is DeepSeek's FP8 dispatch, M bytes and an fp32 scale per 128. The
    combine and the backward stay BF16 either way."""

    def rows(dtype: str | None) -> dict[str, float]:
        params = {"dispatcher": "flex", "micro": 1, "layers": 1, "shared": 0, "gpus_per_node": 2}
        if dtype is not None:
            params["dispatch_dtype"] = dtype
        g = build("megatron_ep", LAYER, params, PASSES)
        out: dict[str, float] = {}
        for t in g:
            if t.kind == "all_to_allv":
                key = f"{t.tags['phase']}/{t.tags['step']}"
                out[key] = out.get(key, 0.0) + t.bytes
        return out

    bf16, default, fp8 = rows("bf16"), rows(None), rows("fp8")
    assert default == bf16
    assert fp8["fwd/dispatch"] == pytest.approx(bf16["fwd/dispatch"] * (1 + 4 / 128) / 2)
    for step in ("fwd/combine", "bwd/combine_grad", "bwd/dispatch_grad"):
        assert fp8[step] == bf16[step] > 0
    assert bf16["fwd/dispatch"] == pytest.approx(bf16["fwd/combine"])  # same rows, same bytes


@pytest.mark.parametrize("name", ["megatron_ep", "dualpipe"])
def test_with_blocks_the_strategy_graph_is_the_model(name):
    """`build_model`: with a model the strategy's own graph is returned as it is (its layers
    the model's MoE blocks, their heads and shared experts), not spliced per layer, and the
    caller's parameters are left alone."""
    from sim.strategies import STRATEGIES
    from sim.workload.blocks import BlockModel

    mod = STRATEGIES[name]
    assert mod.builds_model
    blocks = BlockModel(n=3, heads=2, moe_every=1, first_dense=1, shared=1)
    two = MoELayer(batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=4, world=2)
    layer = LAYER if name == "megatron_ep" else two
    params = {"micro": 4} if name == "megatron_ep" else {"pp": 2}
    given = dict(params)
    g = build(name, layer, params, PASSES, blocks=blocks)
    assert params == given
    assert g.meta["strategy"] == name
    assert (g.meta["layers"], g.meta["heads"], g.meta["shared"]) == (2, 2, 1)
    assert {t.tags["layer"] for t in g} - {-1} == set(blocks.moe_blocks)
    full = {**mod.defaults, **params}
    same = mod.build_model(layer, full, blocks, PASSES)
    assert [t.to_dict() for t in g] == [t.to_dict() for t in same]


def _buffers(g, rank: int) -> tuple[list[str], list[str]]:
    allocs = [n for t in g if t.rank == rank for n in t.allocs]
    frees = [n for t in g if t.rank == rank for n in t.frees]
    return allocs, frees


@pytest.mark.parametrize("shared_overlap", [True, False])
def test_every_activation_is_freed_by_its_backward(shared_overlap):
    params = {"micro": 3, "layers": 2, "shared": 1, "shared_overlap": shared_overlap}
    g = build("megatron_ep", LAYER, params, PASSES)
    allocs, frees = _buffers(g, 2)
    assert len(allocs) == len(set(allocs)) and sorted(allocs) == sorted(frees)
    # attn, shared (in the mlp node or beside it), the MoE layer's ten tensors
    assert len(allocs) == 3 * 2 * (1 + 1 + 10)
    simulate(g, *_cluster())  # the engine checks every free is of a live buffer


def _cluster():
    topo = Topology.load("dgx-h100", nodes=1)
    return topo, CostModel.build(topo, {})


def test_one_micro_batch_peak_is_a_layers_activations_in_closed_form():
    # micro 1, one layer, plain order: attention's kept tensors and the MoE layer's forward
    # stash (T_I, T_DI, T_M, T_DO, T_O: sim.strategies.activations) are live through the
    # backward, which peaks when the dispatch gradient starts: the experts' weight gradients
    # come after it, so dT_DO, dT_M and dT_DI are still live beside the arriving dT_I
    g = build(
        "megatron_ep", LAYER, {"micro": 1, "layers": 1, "shared": 0, "overlap": False}, PASSES
    )
    res = simulate(g, *_cluster())
    T, M, H, e, k = 64, 128, 256, 2, 2
    rows = T * k  # uniform routing on 4 GPUs: every GPU computes T*k rows of the 4*T*k
    attn = e * T * M * (1 + 1 + 4 + 1 + 1) + (e * (T * M + M * 8) + 4 * T * 8) / 2
    stash = e * rows * (4 * M + H)  # Eq. 2 with B = rows: permuted, every row T_I's own
    grads = e * rows * (3 * M + H)
    assert res.mem_peak.max() == pytest.approx(attn + stash + grads)


def test_merged_schedule_holds_more_micro_batches_than_one():
    one = build("megatron_ep", LAYER, {"micro": 1, "layers": 2, "shared": 0}, PASSES)
    four = build("megatron_ep", LAYER, {"micro": 4, "layers": 2, "shared": 0}, PASSES)
    p1, p4 = (simulate(g, *_cluster()).mem_peak.max() for g in (one, four))
    assert p4 > p1 > 0


def test_communication_sms_have_an_interior_optimum_under_overlap():
    """DeepEP's kernels on few SMs send slowly (comm_sm_bw), on many take them from the
    GEMMs beside them: the merged step is slower at both ends than in between; the plain
    schedule, with nothing beside the exchange, only gains from more."""
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, {})
    layer = MoELayer(
        batch=1, seq_len=1024, model_dim=7168, hidden_dim=2048, experts=256, world=8, top_k=8
    )

    def step(sms: int, overlap: bool) -> float:
        params = {
            "dispatcher": "flex",
            "overlap": overlap,
            "micro": 3,
            "layers": 1,
            "heads": 56,
            "shared": 1,
            "sms": sms,
        }
        g = build("megatron_ep", layer, params, PASSES, Cluster(topo, costs))
        return simulate(g, topo, costs).makespan

    few, mid, many = (step(k, True) for k in (4, 24, 96))
    assert mid < few and mid < many
    assert step(4, False) > step(24, False) >= step(96, False)
