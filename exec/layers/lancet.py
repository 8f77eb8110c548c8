"""Lancet's schedule on the real transformer block (`exec.layers.block`), gloo or NCCL.

Operator partition (Sec. 5): the block is cut into k batch partitions (sequences
[B*j/k, B*(j+1)/k)). With the Switch gate (each token routed alone; top-1, whose capacity
slots go in token order) every partition runs attention, LN2 and the gate on its own
sequences, the capacity its predecessors used passed on (`route_after`): partition j's
tokens take exactly the slots the whole batch's routing gives them, nothing extra is dropped.
With the Batch-Prioritized gate the attention and the gate see the whole batch, and the
partitions start after it. Each partition sends only its kept tokens (all-to-allv: counts
first, then rows), the experts run on what arrived, the rows return and are decoded and added
to the residual partition by partition. Stage schedule: every partition's first stage, each
one's dispatch started as soon as it is ready (asynchronous, so the next partition computes
while it is in flight); then the experts as the rows land, each combine started at once; then
the decodes.

Weight-gradient scheduling (Sec. 4, `dw: on`): an expert's backward returns only its input
gradient; its weight gradients are queued and computed while the dispatch's gradient
exchange is in flight (they depend on nothing that exchange carries), then added to the
parameters' gradients.

The result (output, input gradient, every weight's gradient) equals the plain block's: the
tests check it against the single-process reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from exec.errors import ExecError
from exec.layers.moe import DistMoE, Routing, route, wait_work
from exec.layers.pipelined import pipelined
from exec.layers.registry import register
from sim.core.errors import ConfigError


@register("lancet")
def lancet_layer(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """The MoE layer alone: Tutel's capacity chunks (the passes need the block around it)."""
    return pipelined(moe, buf, {**params, "order": "tutel"})


class Deferred:
    """Weight-gradient work queued by the backward, run inside an exchange's window."""

    def __init__(self) -> None:
        self.work: list[Callable[[], None]] = []
        self.armed = False

    def add(self, fn: Callable[[], None]) -> None:
        """Queue `fn`; whatever no exchange window took runs when the backward ends (the
        hook DDP's gradient reduction uses)."""
        self.work.append(fn)
        if not self.armed:
            self.armed = True
            torch.autograd.Variable._execution_engine.queue_callback(self.run)

    def run(self) -> None:
        while self.work:
            self.work.pop(0)()
        self.armed = False


def route_after(z: torch.Tensor, gate: torch.Tensor, capacity: int, used: torch.Tensor) -> Routing:
    """Top-1 routing of one partition whose predecessors filled `used` slots of each expert
    (updated in place): the slots the whole batch's routing gives these tokens."""
    probs = torch.softmax(z @ gate, dim=-1)
    weight, expert = probs.topk(1, dim=-1)
    onehot = F.one_hot(expert[:, 0], probs.shape[1])
    position = (onehot.cumsum(0) - 1).mul(onehot).sum(-1, keepdim=True) + used[expert]
    slot = torch.where(position < capacity, position, torch.full_like(position, -1))
    used += onehot.sum(0)
    used.clamp_(max=capacity)
    return Routing(expert, slot, weight)


class _Pending:
    """An exchange started asynchronously: its output buffer, work handle and row counts."""

    def __init__(self, comms: Any, x: torch.Tensor, send: list[int], recv: list[int], what: str):
        self.comms, self.send, self.recv, self.what = comms, send, recv, what
        self.out = x.new_empty(sum(recv), x.shape[1])
        self.work = dist.all_to_all_single(
            self.out, x.detach().contiguous(), recv, send, group=comms.groups["comm"], async_op=True
        )

    def wait(self) -> None:
        c = self.comms
        wait_work(
            self.work, c.rank, f"all_to_allv for {self.what}", list(range(c.world)), c.timeout_s
        )


class _Landed(torch.autograd.Function):
    """The rows of a started exchange (waited for here); the gradient goes back the reverse
    way, the queued weight gradients computed while it travels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: _Pending, deferred: Deferred | None) -> torch.Tensor:
        p.wait()
        ctx.p, ctx.deferred = p, deferred
        return p.out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        p = ctx.p
        back = _Pending(p.comms, grad, p.recv, p.send, f"{p.what} (gradient)")
        if ctx.deferred is not None:
            ctx.deferred.run()  # the weight gradients, while the exchange is in flight
        back.wait()
        return back.out, None, None


class _Expert(torch.autograd.Function):
    """Local expert i on its rows; its weight gradients queued (or computed at once)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, moe: DistMoE, i: int, deferred: Deferred | None):
        ctx.save_for_backward(x)
        ctx.moe, ctx.i, ctx.deferred = moe, i, deferred
        with torch.no_grad():
            return moe.act(x @ moe.w1[i] + moe.b1[i]) @ moe.w2[i] + moe.b2[i]

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (x,) = ctx.saved_tensors
        moe, i = ctx.moe, ctx.i
        w1, b1, w2 = moe.w1.detach()[i], moe.b1.detach()[i], moe.w2.detach()[i]
        with torch.enable_grad():
            pre = (x @ w1 + b1).requires_grad_(True)
            h = moe.act(pre)
            (dpre,) = torch.autograd.grad(h, pre, dy @ w2.T)
        h = h.detach()

        def weight_grads() -> None:
            for p, g in (
                (moe.w1, x.T @ dpre),
                (moe.b1, dpre.sum(0, keepdim=True)),
                (moe.w2, h.T @ dy),
                (moe.b2, dy.sum(0, keepdim=True)),
            ):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad[i] += g

        if ctx.deferred is None:
            weight_grads()
        else:
            ctx.deferred.add(weight_grads)
        return dpre @ w1.T, None, None, None


def _plan_rows(r: Routing, E: int, C: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(token, choice) of the kept choices ordered by expert then slot, and rows per expert."""
    token, choice = r.kept.nonzero(as_tuple=True)
    order = torch.argsort(r.expert[token, choice] * C + r.slot[token, choice])
    token, choice = token[order], choice[order]
    counts = torch.bincount(r.expert[token, choice], minlength=E)
    return token, choice, counts.tolist()


def lancet_block(
    blk: Any,
    x: torch.Tensor,
    params: dict[str, Any],
    attend: Callable[[torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """The block `blk` (`exec.layers.block.DistBlock`) in Lancet's schedule (module doc);
    `attend(x, b)` is its attention sublayer on b sequences."""
    spec, moe, w = blk.spec, blk.moe, blk.attn
    s = spec.moe
    k, gate = params["partition"], params["gate"]
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= spec.batch:
        raise ExecError(
            f"strategy.partition: the real block needs 1..{spec.batch} (its batch) partitions, "
            f"got {k!r} (`moesim simulate` reports the k Lancet's DP picks)"
        )
    if gate == "switch" and s.top_k != 1:
        raise ConfigError(
            "strategy.gate: switch partitions before the gate, exact for top-1 routing only; "
            f"this layer routes top-{s.top_k} (use gate: batch_prioritized)"
        )
    deferred = Deferred() if params["dw"] in ("on", True) else None
    P, El, E, C, M = s.world, s.local_experts, s.experts, s.capacity, s.model_dim
    L = spec.seq_len
    cuts = [spec.batch * j // k for j in range(k + 1)]
    rows = [slice(L * a, L * b) for a, b in zip(cuts, cuts[1:])]
    h, z, rt = [], [], []
    if gate == "switch":
        used = torch.zeros(E, dtype=torch.long)
        for j, rs in enumerate(rows):
            h.append(x[rs] + attend(x[rs], cuts[j + 1] - cuts[j]))
            z.append(F.layer_norm(h[-1], (M,), w["ln2_w"], w["ln2_b"]))
            rt.append(route_after(z[-1], moe.gate, C, used))
    else:  # the gate ranks the whole batch: partitions start after it
        hh = x + attend(x, spec.batch)
        zz = F.layer_norm(hh, (M,), w["ln2_w"], w["ln2_b"])
        r = route(zz, moe.gate, s.top_k, C)
        for rs in rows:
            h.append(hh[rs])
            z.append(zz[rs])
            rt.append(Routing(r.expert[rs], r.slot[rs], r.weight[rs]))
    # stage 1: send each partition's kept rows as soon as they are known
    plans, sent, pend = [], [], []
    for j in range(k):
        token, choice, counts = _plan_rows(rt[j], E, C)
        recv_counts = torch.empty(E, dtype=torch.long)
        dist.all_to_all_single(recv_counts, torch.tensor(counts), group=moe.comms.groups["comm.1"])
        send = [sum(counts[q * El : (q + 1) * El]) for q in range(P)]
        recv_pe = recv_counts.view(P, El).tolist()
        rows_x = z[j][token]
        plans.append((token, choice, send, recv_pe))
        sent.append(rows_x)
        pend.append(_Pending(moe.comms, rows_x, send, [sum(c) for c in recv_pe], f"dispatch {j}"))
    # stage 2: experts on the rows as they land; each combine started at once
    back = []
    for j in range(k):
        got = _Landed.apply(sent[j], pend[j], deferred)
        _token, _choice, send, recv_pe = plans[j]
        idx: list[list[int]] = [[] for _ in range(El)]
        at = 0
        for p in range(P):
            for i in range(El):
                idx[i] += range(at, at + recv_pe[p][i])
                at += recv_pe[p][i]
        outs = [_Expert.apply(got[ix], moe, i, deferred) for i, ix in enumerate(idx) if ix]
        order = torch.tensor([r for ix in idx for r in ix], dtype=torch.long)
        y_rows = torch.cat(outs)[torch.argsort(order)] if outs else got * 0
        back.append(
            (y_rows, _Pending(moe.comms, y_rows, [sum(c) for c in recv_pe], send, f"combine {j}"))
        )
    # stage 3: decode and residual, partition by partition
    ys = []
    for j in range(k):
        token, choice, _send, _recv = plans[j]
        y_rows, pending = back[j]
        ret = _Landed.apply(y_rows, pending, None)
        wts = rt[j].weight[token, choice].unsqueeze(1)
        dec = ret.new_zeros(h[j].shape[0], M).index_add(0, token, ret * wts)
        ys.append(h[j] + dec)
    return torch.cat(ys)
