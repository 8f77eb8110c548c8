"""Megatron's EP overlap for real (`exec.layers.ep_overlap`, gloo, 2 ranks): micro-batches
through real blocks in the merged forward/backward schedule, communication on its own
thread, weight gradients delayed, give the plain autograd computation's outputs and
gradients for every dispatcher; the nodes launch in the simulator's graph order."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.block import BlockSpec  # noqa: E402
from exec.layers.ep_overlap import run_ep_overlap  # noqa: E402
from exec.layers.moe import MoESpec  # noqa: E402
from sim.strategies import build  # noqa: E402
from sim.workload.blocks import MLA  # noqa: E402
from sim.workload.moe import MoELayer  # noqa: E402

# 2 sequences of 8 tokens per rank and micro-batch, 4 experts top-2, f = 0.75: drops
SPEC = BlockSpec(
    MoESpec(
        tokens=16, model_dim=16, hidden_dim=24, experts=4, world=2, top_k=2, capacity_factor=0.75
    ),
    batch=2,
    heads=2,
)
LAYERS, MICRO = 2, 2
FAST = [{"dispatcher": "alltoall"}, {"dispatcher": "allgather"}]
ALL = [
    {"dispatcher": d, "overlap": o, "gpus_per_node": 1}  # flex: 2 "nodes" of 1 GPU
    for d in ("alltoall", "allgather", "flex")
    for o in (True, False)
]


def _label(params: dict) -> str:
    return repr(sorted(params.items()))


def _equal_to_plain(ranks: list[dict], variants: list[dict]) -> None:
    for r in ranks:
        plain = r["variants"]["plain"]
        assert not np.allclose(plain["y"][0], plain["y"][1])  # the micro-batches differ
        for v in variants:
            got = r["variants"][_label(v)]
            for key in ("y", "x"):
                for mb, (a, b) in enumerate(zip(got[key], plain[key])):
                    np.testing.assert_allclose(
                        a, b, rtol=1e-5, atol=1e-6, err_msg=f"{v} {key} micro-batch {mb}"
                    )
            assert set(got["grads"]) == set(plain["grads"])
            for name, g in plain["grads"].items():
                assert np.abs(g).max() > 0, name  # the gradient reaches every weight
                np.testing.assert_allclose(
                    got["grads"][name], g, rtol=1e-4, atol=1e-6, err_msg=f"{v} {name}"
                )


def _sim_order(params: dict, stream: str, shared: int = 0) -> list[tuple]:
    """(node, phase, micro-batch, layer) of rank 0's `stream` in the simulator's graph."""
    layer = MoELayer(
        batch=2,
        seq_len=8,
        model_dim=16,
        hidden_dim=24,
        experts=4,
        world=2,
        top_k=2,
        capacity_factor=0.75,
    )
    p = {**params, "layers": LAYERS, "micro": MICRO, "heads": 2, "shared": shared}
    g = build("megatron_ep", layer, p, ("fwd", "bwd"))
    out: list[tuple] = []
    for t in g:
        if t.rank == 0 and t.stream == stream:
            key = (t.tags["node"], t.tags["phase"], t.tags["micro"], t.tags["layer"])
            if not out or out[-1] != key:
                out.append(key)
    return out


@pytest.fixture(scope="module")
def fast() -> list[dict]:
    return run_ep_overlap(SPEC, LAYERS, MICRO, FAST, timeout_s=60)


def test_merged_schedule_equals_plain_autograd(fast):
    _equal_to_plain(fast, FAST)


def test_nodes_launch_in_the_simulators_order(fast):
    for v in FAST:
        log = fast[0]["variants"][_label(v)]["log"]
        for stream in ("comm", "compute"):
            mine = [(n, ph, mb, lid) for s, n, ph, mb, lid in log if s == stream]
            assert mine == _sim_order(v, stream), (v, stream)


SHARED = [{"dispatcher": "alltoall", "shared_overlap": o, "shared": 1} for o in (True, False)]


@pytest.fixture(scope="module")
def shared() -> list[dict]:
    return run_ep_overlap(replace(SPEC, shared=1), LAYERS, MICRO, SHARED, timeout_s=60)


def test_shared_experts_overlapped_or_not_equal_plain(shared):
    _equal_to_plain(shared, SHARED)
    assert any(k.startswith("0.attn.sh_") for k in shared[0]["variants"]["plain"]["grads"])


def test_shared_experts_launch_in_the_simulators_order(shared):
    for v in SHARED:
        log = shared[0]["variants"][_label(v)]["log"]
        for stream in ("comm", "compute", "compute.1"):
            mine = [(n, ph, mb, lid) for s, n, ph, mb, lid in log if s == stream]
            assert mine == _sim_order(v, stream, shared=1), (v, stream)
        assert any(s == "compute.1" for s, *_ in log) == v["shared_overlap"]


MLA_SPEC = replace(
    SPEC,
    heads=2,
    mla=MLA(q_lora_rank=8, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3),
)


GQA_SPEC = replace(SPEC, heads=4, kv_heads=2, head_dim=6)  # 4 query heads share 2 of K, V


@pytest.mark.parametrize("spec", [MLA_SPEC, GQA_SPEC], ids=["mla", "gqa"])
def test_attention_variants_in_the_merged_schedule_equal_plain(spec):
    """DeepSeek's latent attention and grouped-query attention in the real block
    (exec.layers.block): the merged schedule still gives plain autograd's outputs and
    gradients, every attention weight reached."""
    variants = [{"dispatcher": "alltoall"}]
    ranks = run_ep_overlap(spec, LAYERS, MICRO, variants, timeout_s=60)
    _equal_to_plain(ranks, variants)
    grads = ranks[0]["variants"]["plain"]["grads"]
    names = (
        ("wq_a", "q_norm_w", "wq_b", "wkv_a", "kv_norm_w", "wkv_b", "wo")
        if spec.mla
        else ("wqkv", "bqkv", "wo", "bo")
    )
    for name in names:
        assert f"0.attn.{name}" in grads, name
    if spec.mla:
        assert not any(k.endswith((".wqkv", ".bo")) for k in grads)


@pytest.mark.parametrize(
    "spec",
    [MLA_SPEC, replace(MLA_SPEC, mla=replace(MLA_SPEC.mla, q_lora_rank=None)), GQA_SPEC, SPEC],
    ids=["mla", "mla-no-q-lora", "gqa", "mha"],
)
def test_the_real_attention_has_the_simulators_weights(spec):
    """The twin's weights per projection are the simulator's op params (attention_ops)."""
    from exec.layers.block import make_attention
    from sim.workload.blocks import attention_ops

    w = make_attention(spec)
    M = spec.moe.model_dim
    ops = attention_ops(
        spec.batch,
        spec.seq_len,
        M,
        spec.heads,
        4,
        False,
        spec.mla,
        kv_heads=spec.kv_heads,
        head_dim=spec.head_dim,
    )
    sim = sum(op.params for op in ops if op.name != "ln1")
    real = sum(t.numel() for k, t in w.items() if not k.startswith(("ln1", "ln2")))
    assert real == sim


@pytest.mark.slow
def test_every_dispatcher_with_and_without_overlap_equals_plain():
    ranks = run_ep_overlap(SPEC, 3, 3, ALL, timeout_s=60)
    _equal_to_plain(ranks, ALL)


def test_schedules_are_registered_apart_from_layer_strategies():
    import exec.layers  # noqa: F401  # registers everything
    from exec.layers.registry import SCHEDULES, STRATEGIES

    assert {"megatron_ep", "dualpipe"} <= set(SCHEDULES)
    assert not set(SCHEDULES) & set(STRATEGIES)  # not a DistMoE layer call
