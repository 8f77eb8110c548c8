"""Megatron-Core's EP overlap (`--overlap-moe-expert-parallel-comm --delay-wgrad-compute`) on
real transformer blocks (`exec.layers.block`), gloo or NCCL: the schedule the simulator's
`megatron_ep` builds (`sim.strategies.megatron_ep.schedule`), run for real.

A stage of `layers` blocks, each cut into Megatron's nodes: `attn` (the previous layer's
output added to its residual, LN1, attention, residual, LN2, router, and the dispatcher's
`send`), `dispatch`, `mlp` (the local experts), `combine` (`exec.layers.ep_dispatch`). Every
node of every (micro-batch, layer) is its own autograd graph, cut from its neighbours' at
its inputs (`exec.layers.nodes.Node`): its backward runs when the schedule says, input
gradients (dX) first and weight gradients (dW) later (`--delay-wgrad-compute`; the dW pass
walks the node's graph again to its weights, so the split is in time, not a saving). The
dispatch and combine nodes, forward and backward, run on a communication thread (one FIFO,
Megatron's comm stream; every rank queues them in the same order, so collectives match),
the rest on the calling thread (the compute stream). Micro-batches go in the 1F1B order:
forward 0, then forward i+1 with backward i, then the last backward. With `overlap` the
forward and backward are merged layer by layer (forward layer k with backward layer L-1-k):

    comm:    combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
    compute: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd -> attn_bwd_dw

(each comm node queued as soon as its input is computed, and waited for only when its output
is needed); without, every node runs and is waited for in turn. Both give the plain
autograd computation's outputs and gradients (the tests check it): the same operations on
the same values, only their order differs.

Shared experts (`BlockSpec.shared`): a node of their own on the LN2 output. With
`shared_overlap` it runs on a second compute thread (the simulator's `compute.1` stream),
forward beside the dispatch, backward beside the combine's gradient, its weight gradients
after the attention's; without, inside the `mlp` node (after the experts, forward and
backward, its weight gradients with the experts'), as the simulator places its tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from exec.errors import ExecError
from exec.layers.block import SHARED_PARAMS, BlockSpec, DistBlock, attention, shared_ffn
from exec.layers.ep_dispatch import Tensors, dispatcher
from exec.layers.grads import grad_of
from exec.layers.moe import Comms, make_output_grad, make_tokens, route
from exec.layers.nodes import CommStream, Node
from exec.layers.registry import register_schedule
from sim.core.errors import ConfigError
from sim.strategies import resolve_params


@dataclass
class _Layer:
    """One micro-batch in one layer: its nodes, context, and the gradients it awaits."""

    nodes: dict[str, Node] = field(default_factory=dict)
    ctx: dict[str, Any] = field(default_factory=dict)
    out: Tensors = ()  # (h, w, *combined[, shared]): the layer's output, the next node's input
    grad_out: tuple[torch.Tensor | None, ...] = ()  # the gradients of `out`
    fut: Future | None = None  # the comm node in flight
    z: torch.Tensor | None = None  # LN2's output: the shared experts' input
    shared: Any = None  # the shared node's result, or its Future on the side stream

    def pending(self) -> Future:
        """The comm node in flight (the schedule waits on one only after launching it)."""
        assert self.fut is not None
        return self.fut


class Stage:
    """Real blocks of one rank, driven node by node (module docstring)."""

    def __init__(
        self,
        blocks: list[DistBlock],
        params: dict[str, Any],
        comm: CommStream,
        side: CommStream | None = None,
    ):
        """`side`: the shared experts' stream when they overlap (None: inside `mlp`)."""
        self.blocks, self.comm, self.params, self.side = blocks, comm, params, side
        self.shared = blocks[0].spec.shared > 0
        self.k = 3 if self.shared else 2  # the attention node's outputs before the sends
        self.shared_dw: dict[tuple[int, int], Node] = {}
        self.disp = dispatcher(params)
        self.state: dict[tuple[int, int], _Layer] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self.tails: dict[int, Node] = {}
        self.grad_x: dict[int, torch.Tensor | None] = {}
        # (stream, node, phase, micro-batch, layer) in launch order: the simulator's tags
        self.log: list[tuple[str, str, str, int, int]] = []

    def _launch(self, stream: str, node: str, phase: str, mb: int, lid: int) -> None:
        self.log.append((stream, node, phase, mb, lid))

    def _st(self, mb: int, lid: int) -> _Layer:
        return self.state.setdefault((mb, lid), _Layer())

    def _side_stream(self) -> CommStream:
        if self.side is None:
            raise ExecError("the shared experts' stream was used without overlap")
        return self.side

    def _side(self, result: Any, what: str) -> Any:
        """A shared node's result: waited for when it is still in flight on the side stream."""
        return self._side_stream().wait(result, what) if isinstance(result, Future) else result

    def _output(self, t: Tensors, ctx: dict[str, Any]) -> torch.Tensor:
        """A layer's output from its `out` (h, w, *combined[, shared])."""
        if self.shared:
            return t[0] + self.disp.out(t[1], t[2:-1], ctx) + t[-1]
        return t[0] + self.disp.out(t[1], t[2:], ctx)

    # -- forward nodes --------------------------------------------------------------------
    def attn_fwd(self, mb: int, lid: int) -> None:
        blk, st = self.blocks[lid], self._st(mb, lid)
        prev = None if lid == 0 else self.state[(mb, lid - 1)]
        spec, moe = blk.spec, blk.moe

        def fn(*t: torch.Tensor) -> Tensors:
            x = t[0] if prev is None else self._output(t, prev.ctx)
            h = x + attention(x, blk.attn, spec)
            z = F.layer_norm(h, (spec.moe.model_dim,), blk.attn["ln2_w"], blk.attn["ln2_b"])
            r = route(z, moe.gate, spec.moe.top_k, spec.moe.capacity, moe.choices)
            return (h, r.weight, *((z,) if self.shared else ()), *self.disp.send(moe, z, r, st.ctx))

        self._launch("compute", "attn", "fwd", mb, lid)
        params = [v for k, v in blk.attn.items() if k not in SHARED_PARAMS]
        node = st.nodes["attn"] = Node([*params, moe.gate])
        st.out = node.forward(fn, (self.inputs[mb],) if prev is None else prev.out)

    def _comm(self, mb: int, lid: int, name: str, step: Callable, inputs: Tensors) -> Future:
        st, moe = self._st(mb, lid), self.blocks[lid].moe
        self._launch("comm", name, "fwd", mb, lid)
        node = st.nodes[name] = Node([])
        return self.comm.submit(lambda: node.forward(lambda *t: step(moe, t, st.ctx), inputs))

    def dispatch_fwd(self, mb: int, lid: int) -> None:
        st = self.state[(mb, lid)]
        st.fut = self._comm(mb, lid, "dispatch", self.disp.dispatch, st.out[self.k :])
        st.z = st.out[2] if self.shared else None
        st.out = st.out[:2]

    def _shared_forward(self, mb: int, lid: int) -> Callable[[], Tensors]:
        """The forward of the shared experts' node (made now) on the layer's LN2 output."""
        st, blk = self.state[(mb, lid)], self.blocks[lid]
        node = st.nodes["shared"] = Node([blk.attn[k] for k in SHARED_PARAMS])
        z = st.z
        assert z is not None  # attn_fwd set it
        return lambda: node.forward(lambda t: (shared_ffn(t, blk.attn, blk.spec),), (z,))

    def shared_fwd(self, mb: int, lid: int) -> None:
        """On the side stream beside the dispatch (overlap); else mlp_fwd runs it."""
        if self.shared and self.side is not None:
            self._launch("compute.1", "shared", "fwd", mb, lid)
            self.state[(mb, lid)].shared = self._side_stream().submit(self._shared_forward(mb, lid))

    def mlp_fwd(self, mb: int, lid: int) -> None:
        st, moe = self.state[(mb, lid)], self.blocks[lid].moe
        got = self.comm.wait(st.pending(), f"dispatch of micro-batch {mb}, layer {lid}")
        self._launch("compute", "mlp", "fwd", mb, lid)
        node = st.nodes["mlp"] = Node([moe.w1, moe.b1, moe.w2, moe.b2])
        y = node.forward(lambda *t: self.disp.experts(moe, t, st.ctx), got)
        if self.shared and self.side is None:  # the shared experts after the local ones
            st.shared = self._shared_forward(mb, lid)()
        st.fut = self._comm(mb, lid, "combine", self.disp.combine, y)

    def combine_wait(self, mb: int, lid: int) -> None:
        st = self.state[(mb, lid)]
        got = self.comm.wait(st.pending(), f"combine of micro-batch {mb}, layer {lid}")
        st.out = (*st.out, *got)
        if self.shared:
            s = self._side(st.shared, f"shared experts of micro-batch {mb}, layer {lid}")
            st.out, st.shared = (*st.out, *s), None

    def tail_fwd(self, mb: int) -> torch.Tensor:
        """The last layer's output added to its residual: the stage's output."""
        last = self.state[(mb, len(self.blocks) - 1)]
        node = self.tails[mb] = Node([])
        return node.forward(lambda *t: (self._output(t, last.ctx),), last.out)[0]

    # -- backward nodes -------------------------------------------------------------------
    def tail_bwd(self, mb: int, dy: torch.Tensor) -> None:
        self.state[(mb, len(self.blocks) - 1)].grad_out = self.tails.pop(mb).backward((dy,))

    def combine_bwd(self, mb: int, lid: int) -> None:
        st = self.state[(mb, lid)]
        node, g = st.nodes["combine"], st.grad_out[2:-1] if self.shared else st.grad_out[2:]
        self._launch("comm", "combine", "bwd", mb, lid)
        st.fut = self.comm.submit(lambda: node.backward(g))

    def shared_bwd(self, mb: int, lid: int) -> None:
        """The shared experts' input gradient on the side stream (overlap); else in mlp_bwd."""
        if self.shared and self.side is not None:
            st = self.state[(mb, lid)]
            node, g = st.nodes["shared"], st.grad_out[-1]
            self._launch("compute.1", "shared", "bwd", mb, lid)
            st.shared = self._side_stream().submit(lambda: node.backward((g,)))

    def mlp_bwd(self, mb: int, lid: int) -> None:
        st = self.state[(mb, lid)]
        g = self.comm.wait(st.pending(), f"combine gradient of micro-batch {mb}, layer {lid}")
        self._launch("compute", "mlp", "bwd", mb, lid)
        gin = st.nodes["mlp"].backward(g)
        if self.shared and self.side is None:
            st.shared = st.nodes["shared"].backward((st.grad_out[-1],))
        node = st.nodes["dispatch"]
        self._launch("comm", "dispatch", "bwd", mb, lid)
        st.fut = self.comm.submit(lambda: node.backward(gin))

    def mlp_bwd_dw(self, mb: int, lid: int) -> None:
        self._launch("compute", "mlp_dw", "bwd", mb, lid)
        st = self.state[(mb, lid)]
        st.nodes["mlp"].weights()
        if self.shared and self.side is None:
            st.nodes["shared"].weights()

    def attn_bwd(self, mb: int, lid: int) -> None:
        st = self.state[(mb, lid)]
        g_send = self.comm.wait(st.pending(), f"dispatch gradient of micro-batch {mb}, layer {lid}")
        self._launch("compute", "attn", "bwd", mb, lid)
        g_z: tuple = ()
        if self.shared:
            what = f"shared experts' gradient of micro-batch {mb}, layer {lid}"
            g_z = (self._side(st.shared, what)[0],)
        gin = st.nodes["attn"].backward((*st.grad_out[:2], *g_z, *g_send))
        if lid == 0:
            self.grad_x[mb] = gin[0]
        else:
            self.state[(mb, lid - 1)].grad_out = gin

    def attn_bwd_dw(self, mb: int, lid: int) -> None:
        self._launch("compute", "attn_dw", "bwd", mb, lid)
        st = self.state.pop((mb, lid))
        st.nodes["attn"].weights()
        if self.shared and self.side is not None:
            self.shared_dw[(mb, lid)] = st.nodes["shared"]

    def shared_bwd_dw(self, mb: int, lid: int) -> None:
        """The shared experts' weight gradients on the side stream (overlap)."""
        if (mb, lid) in self.shared_dw:
            self._launch("compute.1", "shared_dw", "bwd", mb, lid)
            self._side_stream().submit(self.shared_dw.pop((mb, lid)).weights)

    # -- schedules ------------------------------------------------------------------------
    def forward(self, mb: int) -> torch.Tensor:
        for lid in range(len(self.blocks)):
            self.attn_fwd(mb, lid)
            self.dispatch_fwd(mb, lid)
            self.shared_fwd(mb, lid)
            self.mlp_fwd(mb, lid)
            self.combine_wait(mb, lid)
        return self.tail_fwd(mb)

    def backward(self, mb: int, dy: torch.Tensor) -> None:
        self.tail_bwd(mb, dy)
        for lid in reversed(range(len(self.blocks))):
            self.combine_bwd(mb, lid)
            self.shared_bwd(mb, lid)
            self.mlp_bwd(mb, lid)
            self.mlp_bwd_dw(mb, lid)
            self.attn_bwd(mb, lid)
            self.attn_bwd_dw(mb, lid)
            self.shared_bwd_dw(mb, lid)

    def merged(self, f: int, b: int, dy: torch.Tensor) -> torch.Tensor:
        """Forward of micro-batch f with backward of b, layer by layer (module docstring)."""
        self.tail_bwd(b, dy)
        L = len(self.blocks)
        for k in range(L):
            lf, lb = k, L - 1 - k
            self.combine_bwd(b, lb)  # comm: combine_bwd     | compute: attn_fwd
            self.attn_fwd(f, lf)
            self.dispatch_fwd(f, lf)  # comm: dispatch_fwd  | compute: mlp_bwd
            self.shared_fwd(f, lf)  # compute.1: shared_fwd, shared_bwd
            self.shared_bwd(b, lb)
            self.mlp_bwd(b, lb)  # queues dispatch_bwd behind dispatch_fwd
            self.mlp_bwd_dw(b, lb)
            self.mlp_fwd(f, lf)  # queues combine_fwd behind dispatch_bwd
            self.attn_bwd(b, lb)  # comm: combine_fwd | compute: attn_bwd
            self.attn_bwd_dw(b, lb)
            self.shared_bwd_dw(b, lb)
            self.combine_wait(f, lf)
        return self.tail_fwd(f)


def micro_spec(spec: BlockSpec, mb: int) -> BlockSpec:
    """Micro-batch mb's tokens and output gradient come from a seed of their own."""
    return replace(spec, moe=replace(spec.moe, seed=spec.moe.seed + 7919 * (mb + 1)))


def layer_spec(spec: BlockSpec, lid: int) -> BlockSpec:
    """Layer lid's weights come from a seed of their own."""
    return replace(spec, moe=replace(spec.moe, seed=spec.moe.seed + 104_729 * lid))


@register_schedule("ep_overlap")  # strategy megatron_ep's real form
def run_stage(
    blocks: list[DistBlock], comms: Comms, spec: BlockSpec, params: dict[str, Any], micro: int
) -> dict[str, Any]:
    """Every micro-batch through the stage in the schedule `params` says; outputs, input
    gradients, and the weights' gradients left in `blocks` (accumulated over micro-batches)."""
    overlap = params["overlap"] in (True, "on")
    comm = CommStream(comms.rank, comms.timeout_s)
    side = None
    if spec.shared and params.get("shared_overlap", True) in (True, "on"):
        side = CommStream(comms.rank, comms.timeout_s, "shared")
    st = Stage(blocks, params, comm, side)
    xs = [make_tokens(micro_spec(spec, i).moe, comms.rank) for i in range(micro)]
    dys = [make_output_grad(micro_spec(spec, i).moe, comms.rank) for i in range(micro)]
    st.inputs = dict(enumerate(xs))
    ys: dict[int, torch.Tensor] = {}
    try:
        ys[0] = st.forward(0)
        for i in range(1, micro):
            if overlap:
                ys[i] = st.merged(i, i - 1, dys[i - 1])
            else:
                ys[i] = st.forward(i)
                st.backward(i - 1, dys[i - 1])
        st.backward(micro - 1, dys[micro - 1])
        if side is not None:  # the last weight gradients queued there
            side.wait(side.submit(lambda: None), "the shared experts' weight gradients")
    finally:
        comm.close()
        if side is not None:
            side.close()
    return {
        "y": [ys[i] for i in range(micro)],
        "x": [st.grad_x[i] for i in range(micro)],
        "log": st.log,
    }


def plain_stage(
    blocks: list[DistBlock], comms: Comms, spec: BlockSpec, micro: int
) -> dict[str, Any]:
    """The reference: each micro-batch forward and backward through plain autograd of the
    blocks with the `sequential` layer (no nodes, no threads)."""
    ys, gx = [], []
    for i in range(micro):
        x = make_tokens(micro_spec(spec, i).moe, comms.rank).requires_grad_(True)
        y = x
        for blk in blocks:
            y = blk(y, "sequential")
        (y * make_output_grad(micro_spec(spec, i).moe, comms.rank)).sum().backward()
        ys.append(y.detach())
        gx.append(x.grad)
    return {"y": ys, "x": gx}


def ep_overlap_job(
    rank: int,
    world: int,
    spec: BlockSpec,
    layers: int,
    micro: int,
    variants: list[dict[str, Any]],
    timeout_s: float,
    backend: str,
) -> dict[str, Any]:
    """One rank: the plain reference, then every variant (megatron_ep parameters), each on
    fresh blocks with the same weights; numpy outputs and gradients."""
    comms = Comms(rank, world, timeout_s, torch.device("cpu"))
    out: dict[str, Any] = {}
    for label, params in [("plain", None), *((repr(sorted(v.items())), v) for v in variants)]:
        blocks = [
            DistBlock(layer_spec(spec, i), rank, comms, torch.device("cpu")) for i in range(layers)
        ]
        if params is None:
            res = plain_stage(blocks, comms, spec, micro)
        else:
            res = run_stage(blocks, comms, spec, resolve_params("megatron_ep", params), micro)
        grads = {
            f"{i}.{n}": grad_of(p).numpy().copy()
            for i, b in enumerate(blocks)
            for n, p in b.named_parameters()
        }
        out[label] = {
            "y": [y.numpy() for y in res["y"]],
            "x": [g.numpy() for g in res["x"]],
            "grads": grads,
            "log": res.get("log", []),
        }
    return {"rank": rank, "variants": out}


def run_ep_overlap(
    spec: BlockSpec,
    layers: int,
    micro: int,
    variants: list[dict[str, Any]],
    timeout_s: float = 60.0,
) -> list[dict[str, Any]]:
    """Every rank's results on `spec.moe.world` local gloo processes."""
    from exec.runtime.launch import call_ranks

    if layers < 1 or micro < 1:
        raise ConfigError(f"strategy.layers / strategy.micro: expected >= 1, got {layers}, {micro}")
    args = (spec, layers, micro, variants, timeout_s, "gloo")
    return call_ranks(ep_overlap_job, args, spec.moe.world, "gloo")
