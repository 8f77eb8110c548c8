"""A real transformer block on torch.distributed: pre-norm attention, then the MoE layer
(and shared experts, `BlockSpec.shared`, on every token: DeepSeek-MoE's).

    h = x + proj(attention(qkv(LN1(x))));   z = LN2(h);   y = h + MoE(z) [+ shared(z)]

The attention is multi-head (grouped-query with `BlockSpec.kv_heads` key / value heads, each
shared by heads / kv_heads query heads), or DeepSeek's latent attention (`BlockSpec.mla`, the
simulator's `sim.workload.blocks.MLA`): queries through a low-rank bottleneck and RMSNorm,
keys and values up-projected from one normalised latent, one RoPE key part shared by the
heads (the rotation itself left out, as in the simulator), no biases.

The attention and norm weights are replicated (seeded alike on every rank); the MoE layer is
`exec.layers.moe.DistMoE` run with any registered strategy. Each rank holds B sequences of L
tokens (T = B*L rows). The routing of a rank depends only on its own tokens (capacity is per
rank and expert), so a single process that holds every expert computes every rank's block
exactly (`reference`): the check that the distributed block, forward and backward, is the
plain computation on the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from exec.layers.grads import grad_of
from exec.layers.moe import (
    ACTIVATIONS,
    Comms,
    DistMoE,
    MoESpec,
    decode,
    encode,
    make_expert,
    make_gate,
    make_output_grad,
    make_tokens,
    route,
)
from sim.core.errors import ConfigError
from sim.workload.blocks import MLA

EXPERT_PARAMS = ("w1", "b1", "w2", "b2")
SHARED_PARAMS = ("sh_w1", "sh_b1", "sh_w2", "sh_b2")


class Weights(Protocol):
    """A block's weights by name: the layer's ParameterDict, or a reference's plain dict."""

    def __getitem__(self, key: str, /) -> torch.Tensor: ...


@dataclass(frozen=True)
class BlockSpec:
    moe: MoESpec  # moe.tokens = batch * seq_len rows per rank
    batch: int
    heads: int
    shared: int = 0  # shared experts of the experts' size: one FFN of shared * hidden_dim units
    mla: MLA | None = None  # DeepSeek's latent attention instead of standard multi-head
    kv_heads: int | None = None  # key / value heads (grouped-query attention); None: heads
    head_dim: int | None = None  # dims per head; None: model_dim / heads

    @property
    def head_dims(self) -> tuple[int, int]:
        """(dims per head, key / value heads) of the standard attention."""
        return self.head_dim or self.moe.model_dim // self.heads, self.kv_heads or self.heads

    @property
    def seq_len(self) -> int:
        return self.moe.tokens // self.batch


def make_attention(spec: BlockSpec) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(spec.moe.seed * 1_000_003 + 300_000)
    M = spec.moe.model_dim
    if spec.mla is not None:
        return _make_mla(spec, g)
    d, kv = spec.head_dims
    width, out = (spec.heads + 2 * kv) * d, spec.heads * d
    return {
        "ln1_w": 1 + 0.1 * torch.randn(M, generator=g),
        "ln1_b": 0.1 * torch.randn(M, generator=g),
        "wqkv": torch.randn(M, width, generator=g) / math.sqrt(M),
        "bqkv": 0.1 * torch.randn(width, generator=g),
        "wo": torch.randn(out, M, generator=g) / math.sqrt(out),
        "bo": 0.1 * torch.randn(M, generator=g),
        "ln2_w": 1 + 0.1 * torch.randn(M, generator=g),
        "ln2_b": 0.1 * torch.randn(M, generator=g),
    }


def _make_mla(spec: BlockSpec, g: torch.Generator) -> dict[str, torch.Tensor]:
    a, M, H = spec.mla, spec.moe.model_dim, spec.heads
    assert a is not None

    def lin(k: int, n: int) -> torch.Tensor:
        return torch.randn(k, n, generator=g) / math.sqrt(k)

    dq, c, r = a.qk_head_dim, a.kv_lora_rank, a.qk_rope_head_dim
    w = {"ln1_w": 1 + 0.1 * torch.randn(M, generator=g), "ln1_b": 0.1 * torch.randn(M, generator=g)}
    if a.q_lora_rank is None:
        w["wq"] = lin(M, H * dq)
    else:
        ql = a.q_lora_rank
        w |= {
            "wq_a": lin(M, ql),
            "q_norm_w": 1 + 0.1 * torch.randn(ql, generator=g),
            "wq_b": lin(ql, H * dq),
        }
    w |= {
        "wkv_a": lin(M, c + r),
        "kv_norm_w": 1 + 0.1 * torch.randn(c, generator=g),
        "wkv_b": lin(c, H * (a.qk_nope_head_dim + a.v_head_dim)),
        "wo": lin(H * a.v_head_dim, M),
        "ln2_w": 1 + 0.1 * torch.randn(M, generator=g),
        "ln2_b": 0.1 * torch.randn(M, generator=g),
    }
    return w


def make_shared(spec: BlockSpec) -> dict[str, torch.Tensor]:
    """The shared experts' weights (replicated, as the attention's); none without them."""
    if not spec.shared:
        return {}
    g = torch.Generator().manual_seed(spec.moe.seed * 1_000_003 + 400_000)
    M, S = spec.moe.model_dim, spec.shared * spec.moe.hidden_dim
    return {
        "sh_w1": torch.randn(M, S, generator=g) / math.sqrt(M),
        "sh_b1": 0.1 * torch.randn(S, generator=g),
        "sh_w2": torch.randn(S, M, generator=g) / math.sqrt(S),
        "sh_b2": 0.1 * torch.randn(M, generator=g),
    }


def shared_ffn(z: torch.Tensor, w: Weights, spec: BlockSpec) -> torch.Tensor:
    """The shared experts on every token of z (the experts' activation function)."""
    act = ACTIVATIONS[spec.moe.activation]
    return act(z @ w["sh_w1"] + w["sh_b1"]) @ w["sh_w2"] + w["sh_b2"]


def attention(x: torch.Tensor, w: Weights, spec: BlockSpec) -> torch.Tensor:
    """Causal multi-head self-attention of LN1(x), the op sequence the simulator models:
    QKV projection (MLA's down / norm / up projections), scores, softmax, context, output
    projection."""
    B, L, H, M = spec.batch, spec.seq_len, spec.heads, spec.moe.model_dim
    z = F.layer_norm(x, (M,), w["ln1_w"], w["ln1_b"])
    if spec.mla is not None:
        return _mla(z, w, spec, spec.mla)
    d, kv = spec.head_dims
    q, k, v = (z @ w["wqkv"] + w["bqkv"]).view(B, L, H + 2 * kv, d).split([H, kv, kv], dim=2)
    # grouped-query attention: each key / value head serves H / kv query heads
    k, v = (t.repeat_interleave(H // kv, dim=2) for t in (k, v))
    return _attend(*(t.transpose(1, 2) for t in (q, k, v))) @ w["wo"] + w["bo"]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of [B, H, L, d] queries and keys over [B, H, L, dv] values, the
    heads' contexts side by side: [B * L, H * dv]."""
    B, H, L, d = q.shape
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return (p @ v).permute(0, 2, 1, 3).reshape(B * L, H * v.shape[-1])


def _mla(z: torch.Tensor, w: Weights, spec: BlockSpec, a: MLA) -> torch.Tensor:
    B, L, H = spec.batch, spec.seq_len, spec.heads
    nope, r, c, dv = a.qk_nope_head_dim, a.qk_rope_head_dim, a.kv_lora_rank, a.v_head_dim
    if a.q_lora_rank is None:
        q = z @ w["wq"]
    else:
        q = F.rms_norm(z @ w["wq_a"], (a.q_lora_rank,), w["q_norm_w"]) @ w["wq_b"]
    q = q.view(B, L, H, nope + r).transpose(1, 2)
    latent, k_rope = (z @ w["wkv_a"]).split([c, r], dim=-1)
    kv = (F.rms_norm(latent, (c,), w["kv_norm_w"]) @ w["wkv_b"]).view(B, L, H, nope + dv)
    k_nope, v = kv.split([nope, dv], dim=-1)
    k = torch.cat([k_nope, k_rope.view(B, L, 1, r).expand(B, L, H, r)], dim=-1)
    return _attend(q, k.transpose(1, 2), v.transpose(1, 2)) @ w["wo"]


def block(x: torch.Tensor, w: Weights, spec: BlockSpec, moe: Any) -> torch.Tensor:
    """The block with `moe(z) -> y` as its FFN (beside the shared experts, if any)."""
    h = x + attention(x, w, spec)
    z = F.layer_norm(h, (spec.moe.model_dim,), w["ln2_w"], w["ln2_b"])
    y = h + moe(z)
    return y + shared_ffn(z, w, spec) if spec.shared else y


class DistBlock(torch.nn.Module):
    def __init__(self, spec: BlockSpec, rank: int, comms: Comms, device: torch.device):
        super().__init__()
        self.spec = spec
        replicated = make_attention(spec) | make_shared(spec)
        self.attn = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(v.to(device)) for k, v in replicated.items()}
        )
        self.moe = DistMoE(spec.moe, rank, comms, device)

    def forward(self, x: torch.Tensor, strategy: str, params: dict | None = None) -> torch.Tensor:
        if strategy == "lancet":  # its passes reach around the MoE layer: a block of its own
            if self.spec.shared:
                raise ConfigError(
                    "strategy lancet: its real block has no shared experts "
                    "(give the block shared: 0)"
                )
            from exec.layers.lancet import lancet_block
            from exec.layers.registry import resolve_strategy

            def attend(xs: torch.Tensor, b: int) -> torch.Tensor:  # b of the B sequences
                sub = replace(
                    self.spec, moe=replace(self.spec.moe, tokens=b * self.spec.seq_len), batch=b
                )
                return attention(xs, self.attn, sub)

            return lancet_block(self, x, resolve_strategy(strategy, params or {}), attend)
        return block(x, self.attn, self.spec, lambda z: self.moe(z, strategy, params)[0])


def block_job(
    rank: int,
    world: int,
    spec: BlockSpec,
    variants: list[tuple[str, dict]],
    timeout_s: float,
    backend: str,
) -> dict[str, Any]:
    """One rank: every variant forward and backward on the same tokens; numpy results."""
    device = torch.device("cpu")
    comms = Comms(rank, world, timeout_s, device)
    blk = DistBlock(spec, rank, comms, device)
    x0, dy = make_tokens(spec.moe, rank), make_output_grad(spec.moe, rank)
    out: dict[str, Any] = {}
    for name, params in variants:
        blk.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        y = blk(x, name, params)
        (y * dy).sum().backward()
        grads = {n: grad_of(p).numpy().copy() for n, p in blk.named_parameters()}
        key = name + repr(sorted(params.items()))
        out[key] = {"y": y.detach().numpy(), "x": grad_of(x).numpy()}
        out[key]["grads"] = grads
    return {"rank": rank, "variants": out}


def run_block(
    spec: BlockSpec, variants: list[tuple[str, dict]], timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    from exec.runtime.launch import call_ranks

    return call_ranks(block_job, (spec, variants, timeout_s, "gloo"), spec.moe.world, "gloo")


def reference(spec: BlockSpec) -> list[dict[str, Any]]:
    """Every rank's block in one process (float64): y, dL/dx, the attention and gate
    gradients of each rank's copy, and each rank's share of the expert gradients (summed
    over the tokens of every rank, as the all-to-all's backward delivers them)."""
    s = spec.moe
    replicated = make_attention(spec) | make_shared(spec)
    w = {k: v.double().requires_grad_(True) for k, v in replicated.items()}
    gate = make_gate(s).double().requires_grad_(True)
    ex = [make_expert(s, e) for e in range(s.experts)]
    stacked = {
        k: torch.stack([e[k] for e in ex]).double().requires_grad_(True) for k in EXPERT_PARAMS
    }
    act = ACTIVATIONS[s.activation]

    def moe(z: torch.Tensor) -> torch.Tensor:
        r = route(z, gate, s.top_k, s.capacity)
        buf = encode(z, r, s.experts, s.capacity)  # [E, C, M]: every expert here
        h = act(buf @ stacked["w1"] + stacked["b1"].unsqueeze(1))
        return decode(h @ stacked["w2"] + stacked["b2"].unsqueeze(1), r)

    outs: list[dict[str, Any]] = []
    for rank in range(s.world):
        for t in [*w.values(), gate]:
            t.grad = None
        x = make_tokens(s, rank).double().requires_grad_(True)
        y = block(x, w, spec, moe)
        (y * make_output_grad(s, rank).double()).sum().backward()
        grads = {f"attn.{k}": grad_of(v).numpy().copy() for k, v in w.items()}
        grads["moe.gate"] = grad_of(gate).numpy().copy()
        outs.append({"y": y.detach().numpy(), "x": grad_of(x).numpy(), "grads": grads})
    El = s.experts // s.world
    for rank, o in enumerate(outs):
        for k, v in stacked.items():
            g = grad_of(v)[rank * El : (rank + 1) * El].numpy()
            o["grads"][f"moe.{k}"] = g[:, None, :] if k.startswith("b") else g  # DistMoE's
    return outs
