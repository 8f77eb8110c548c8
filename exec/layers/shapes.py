"""Shapes the layouts share: the simulator's view of a real layer, capacity padded to a
multiple of the slices, and an expert's slice of hidden units and output dims.
"""

from __future__ import annotations

import torch

from exec.layers.moe import MoESpec
from sim.workload.moe import MoELayer


def pad_capacity(buf: torch.Tensor, capacity: int) -> torch.Tensor:
    """[E, C, M] padded with empty slots to `capacity` (DeepSpeed and P1 need C divisible)."""
    E, C, M = buf.shape
    if capacity == C:
        return buf
    return torch.cat([buf, buf.new_zeros(E, capacity - C, M)], dim=1)


def expert_slices(spec: MoESpec, n: int, i: int) -> tuple[slice, slice]:
    """Slice i of the hidden units and of the model dim (for b2)."""
    h, m = spec.hidden_dim // n, spec.model_dim // n
    return slice(i * h, (i + 1) * h), slice(i * m, (i + 1) * m)


def sim_layer(spec: MoESpec) -> MoELayer:
    """The simulator's view of the real layer (what the router and layout checks read)."""
    return MoELayer(
        batch=1,
        seq_len=spec.tokens,
        model_dim=spec.model_dim,
        hidden_dim=spec.hidden_dim,
        experts=spec.experts,
        world=spec.world,
        top_k=spec.top_k,
        capacity_factor=spec.capacity_factor,
        dtype="fp32",
        dropless=spec.dropless,
    )
