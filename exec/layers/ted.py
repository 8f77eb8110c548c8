"""DeepSpeed TED in the real layer: the layer under tensor parallelism of degree tp.

Ranks j*tp .. j*tp+tp-1 form TP group j and hold token set j (replicated inputs); ranks
sharing a tp index form an EP group over which the E experts are spread (the same experts on
every rank of a TP group). `TEDMoE` is a `DistMoE` on its EP group, so `sequential` on it is
the unsliced layer of those token sets; `ted` keeps this rank's 1/tp slice of the capacity
dimension (`_DropTokens`, whose gradient is an all-gather), runs the EP exchange and experts,
and all-gathers the capacity slices inside the TP group (`_GatherTokens`, whose gradient is
the local slice). The simulator's side is `sim.strategies.ted`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from exec.layers.moe import DistMoE, MoESpec
from exec.layers.registry import LAYERS, register
from exec.layers.shapes import pad_capacity, sim_layer
from sim.core.errors import ConfigError
from sim.strategies.ted import check_layout
from sim.workload.slicing import aligned

if TYPE_CHECKING:
    from exec.layers.group_comms import GroupComms, LayoutComms


class _DropTokens(torch.autograd.Function):
    """Keep this TP rank's slice of the capacity dimension (dim 1); gradient: all-gather."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: GroupComms) -> torch.Tensor:
        ctx.tp = tp
        c = x.shape[1] // tp.world
        return x.narrow(1, tp.index * c, c).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _gather_dim1(ctx.tp, grad, "drop_tokens (gradient)"), None


class _GatherTokens(torch.autograd.Function):
    """All-gather the TP group's capacity slices (dim 1); gradient: this rank's slice (the
    output is replicated over the TP group, and so is its gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: GroupComms) -> torch.Tensor:
        ctx.tp, ctx.c = tp, x.shape[1]
        return _gather_dim1(tp, x, "gather_tokens")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.narrow(1, ctx.tp.index * ctx.c, ctx.c).contiguous(), None


def _gather_dim1(tp: GroupComms, x: torch.Tensor, what: str) -> torch.Tensor:
    parts = tp.all_gather(x, what)  # [tp, E, c, M]
    return torch.cat(list(parts), dim=1)


class TEDMoE(DistMoE):
    """The layer on this rank's EP group, plus its TP group (see the module docstring)."""

    def __init__(self, spec: MoESpec, rank: int, tp: int, comms: LayoutComms, device):
        ep = check_layout(sim_layer(spec), tp)
        super().__init__(replace(spec, world=ep, demand=None), rank // tp, comms.ep[tp], device)
        self.tp_size, self.tp = tp, comms.tp[tp]


@register("ted")
def ted(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    tp = params["tp"]
    if not isinstance(moe, DistMoE) or getattr(moe, "tp_size", 1) != tp:
        raise ConfigError(
            f"strategy.tp: tp={tp} needs a layer of whole experts built for it, with its TP "
            f"and EP groups (exec.layers.layouts.run_layouts)"
        )
    if tp == 1:  # DeepSpeed's plain expert-parallel layer
        return LAYERS["sequential"](moe, buf, params)
    C = buf.shape[1]
    padded = pad_capacity(
        buf, aligned(C, tp)
    )  # DeepSpeed needs C divisible by tp; extra slots empty
    mine = _DropTokens.apply(padded, moe.tp)
    received = moe.comms.all_to_all(mine, "comm", "dispatch")
    out = moe.comms.all_to_all(moe.experts(received), "comm", "combine")
    return _GatherTokens.apply(out, moe.tp)[:, :C]
