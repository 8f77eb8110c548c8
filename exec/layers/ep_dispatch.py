"""Megatron-Core's three token dispatchers as the node functions of the real EP-overlap
schedule (`exec.layers.ep_overlap`), on the layer of `exec.layers.moe.DistMoE`.

A dispatcher splits one MoE layer into: `send` (the end of the attention node: what leaves
for the experts), `dispatch` (communication), `experts` (the local experts), `combine`
(communication) and `out` (the layer's output from what came back, added to the residual at
the start of the next node, as `res2` opens the simulator's attention node). Each maps
tensors to a tuple of tensors through autograd (the schedule cuts the graph between nodes);
what is not differentiable (routing, split sizes, forwarding tables) stays in `ctx`, one dict
per (micro-batch, layer).

- `alltoall`: the capacity buffer [E, C, M] exchanged (all-to-all; under a routing model the
  filled slots only, all-to-allv, `exec.layers.sparse`), decoded with the gate weights;
- `allgather`: every rank all-gathers all tokens, gate weights and choices, runs its experts
  on the kept (token, expert) pairs that are its own and weights them; a reduce-scatter of the
  [P*T, M] result sums each token's outputs on its rank (the gradients: reduce-scatter, then
  all-gather);
- `flex`: DeepEP's normal kernels as `exec.layers.deepep`'s two-stage all-to-allv stand-in
  (`gpus_per_node`), cut into the same nodes.

All three send the same kept choices through the same experts with the same weights as
`sequential`: only the order of the sums differs.
"""

from __future__ import annotations

from typing import Any

import torch

from exec.layers import deepep
from exec.layers.deepep import _experts
from exec.layers.moe import DistMoE, Routing, decode, encode
from exec.layers.sparse import Fill, exchange_counts, exchange_slots
from exec.layers.waits import wait_work
from exec.runtime.compat import all_gather_single, reduce_scatter_single
from sim.core.errors import ConfigError

Tensors = tuple[torch.Tensor, ...]


def _collective(moe: DistMoE, fn: Any, what: str) -> None:
    c = moe.comms
    wait_work(fn(c.groups["comm"]), c.rank, what, list(range(c.world)), c.timeout_s)


def gather(moe: DistMoE, x: torch.Tensor, what: str) -> torch.Tensor:
    """Every rank's x stacked along dim 0 (not differentiable)."""
    x = x.contiguous()
    out = x.new_empty(moe.comms.world * x.shape[0], *x.shape[1:])
    _collective(moe, lambda g: all_gather_single(out, x, group=g, async_op=True), what)
    return out


def scatter_sum(moe: DistMoE, x: torch.Tensor, what: str) -> torch.Tensor:
    """x summed over ranks; this rank keeps its 1/P slice of dim 0 (not differentiable)."""
    x = x.contiguous()
    out = x.new_empty(x.shape[0] // moe.comms.world, *x.shape[1:])
    _collective(moe, lambda g: reduce_scatter_single(out, x, group=g, async_op=True), what)
    return out


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, moe: DistMoE, what: str) -> torch.Tensor:
        ctx.moe, ctx.what = moe, what
        return gather(moe, x, what)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return scatter_sum(ctx.moe, grad, f"{ctx.what} (gradient)"), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, moe: DistMoE, what: str) -> torch.Tensor:
        ctx.moe, ctx.what = moe, what
        return scatter_sum(moe, x, what)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return gather(ctx.moe, grad, f"{ctx.what} (gradient)"), None, None


def _kept_ids(r: Routing) -> torch.Tensor:
    """Expert per (token, choice), -1 where capacity dropped the choice."""
    return torch.where(r.kept, r.expert, torch.full_like(r.expert, -1))


class AllToAll:
    def send(self, moe: DistMoE, z: torch.Tensor, r: Routing, ctx: dict) -> Tensors:
        s = moe.spec
        ctx["routing"] = (r.expert, r.slot)
        return (encode(z, r, s.experts, s.capacity),)

    def _fill(self, moe: DistMoE, ctx: dict) -> Fill | None:
        if moe.choices is None:  # uniform routing: the padded buffer, an equal all-to-all
            return None
        if "fill" not in ctx:
            expert, slot = ctx["routing"]
            send = torch.bincount(expert[slot >= 0], minlength=moe.spec.experts).numpy()
            ctx["fill"] = Fill(send, exchange_counts(moe.comms, send, moe.spec.local_experts))
        return ctx["fill"]

    def _exchange(self, moe: DistMoE, x: torch.Tensor, back: bool, ctx: dict) -> torch.Tensor:
        what = "combine" if back else "dispatch"
        fill = self._fill(moe, ctx)
        if fill is None:
            return moe.comms.all_to_all(x, "comm", what)
        return exchange_slots(moe.comms, x, fill, 0, back, "comm", what)

    def dispatch(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        return (self._exchange(moe, t[0], False, ctx),)

    def experts(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        return (moe.experts(t[0]),)

    def combine(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        return (self._exchange(moe, t[0], True, ctx),)

    def out(self, w: torch.Tensor, t: Tensors, ctx: dict) -> torch.Tensor:
        expert, slot = ctx["routing"]
        return decode(t[0], Routing(expert, slot, w))


class AllGather:
    def send(self, moe: DistMoE, z: torch.Tensor, r: Routing, ctx: dict) -> Tensors:
        ctx["ids"] = _kept_ids(r)
        return (z, r.weight)

    def dispatch(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        ctx["all_ids"] = gather(moe, ctx.pop("ids"), "all_gather of expert choices")
        return (
            _AllGather.apply(t[0], moe, "all_gather of tokens"),
            _AllGather.apply(t[1], moe, "all_gather of gate weights"),
        )

    def experts(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        """My experts on every rank's kept rows for them, weighted, into a [P*T, M] buffer."""
        x, w = t
        ids, El = ctx["all_ids"], moe.spec.local_experts
        out = x.new_zeros(x.shape)
        for i in range(El):
            token, choice = (ids == moe.rank * El + i).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            h = moe.act(torch.addmm(moe.b1[i], x[token], moe.w1[i]))
            y = torch.addmm(moe.b2[i], h, moe.w2[i]) * w[token, choice].unsqueeze(1)
            out = out.index_add(0, token, y)
        return (out,)

    def combine(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        return (_ReduceScatter.apply(t[0], moe, "reduce_scatter of expert outputs"),)

    def out(self, w: torch.Tensor, t: Tensors, ctx: dict) -> torch.Tensor:
        return t[0]


class Flex:
    """`exec.layers.deepep`'s path: dispatch = notify + inter-node stage + forwarding table +
    intra-node stage; combine = both stages back with the forwarder's reduction."""

    def __init__(self, params: dict[str, Any]):
        self.params = params

    def send(self, moe: DistMoE, z: torch.Tensor, r: Routing, ctx: dict) -> Tensors:
        ctx["ids"] = _kept_ids(r)
        return (z, r.weight)

    def dispatch(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        x, w = t
        d2, ctx["ids2"], ctx["route"] = deepep.dispatch(moe, x, w, ctx["ids"], self.params)
        return (d2,)

    def experts(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        M = moe.spec.model_dim
        return (_experts(moe, t[0][:, :M], t[0][:, M:], ctx["ids2"]),)

    def combine(self, moe: DistMoE, t: Tensors, ctx: dict) -> Tensors:
        return (deepep.combine(moe, t[0], ctx["route"]),)

    def out(self, w: torch.Tensor, t: Tensors, ctx: dict) -> torch.Tensor:
        return t[0]


def dispatcher(params: dict[str, Any]) -> AllToAll | AllGather | Flex:
    name = params["dispatcher"]
    if name == "flex":
        return Flex(params)
    if name not in ("alltoall", "allgather"):
        raise ConfigError(
            f"strategy.dispatcher: expected one of ('alltoall', 'allgather', 'flex'), got {name!r}"
        )
    return AllToAll() if name == "alltoall" else AllGather()


def moe_layer(moe: DistMoE, x: torch.Tensor, r: Routing, params: dict[str, Any]) -> torch.Tensor:
    """One MoE layer through the dispatcher's nodes in a row (the plain schedule's layer)."""
    d = dispatcher(params)
    ctx: dict[str, Any] = {}
    t = d.send(moe, x, r, ctx)
    for step in (d.dispatch, d.experts, d.combine):
        t = step(moe, t, ctx)
    return d.out(r.weight, t, ctx)
