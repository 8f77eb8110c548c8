"""FasterMoE in the real layer: the group-wise exchange in steps, and shadowed experts.

The layer works on the padded [E, C, M] dispatch buffer (exec.layers.moe). With n = P/g steps, at
step s this rank sends the slices of the experts of group (G + s) mod n and receives from
group (G - s) mod n (one all_to_all_single with per-peer splits, zero outside those groups,
on the stream's process group; under a routing model only the filled slots, as
`exec.layers.sparse` moves them), runs its experts on them as soon as they are in, and sends
the outputs of step s back once they are computed; the steps are queued on the
communication threads in the order `sim.strategies.chunking.comm_order` gives the simulator.

A shadowed expert e (owned by rank o = e // (E/P), local index i) leaves the exchange: its
parameters are broadcast from o to every rank (on the 'comm.1' group, from its own thread,
before that thread's exchanges) and every rank runs e on its own C slots. For autograd to
hand the owner the sum of every copy's gradient, the broadcast is a Function whose input on
every rank is that rank's own expert at local index i (on o, expert e itself; elsewhere a
same-shaped anchor whose value is overwritten): its backward all-reduces the copies'
gradients and returns the sum on o, zeros elsewhere, so every parameter's gradient equals
`sequential`'s. Every rank builds the same autograd structure (empty tensors where it has
nothing to send or compute), so the backward collectives run in the same order everywhere.

`shadow: auto` (FasterMoE's greedy rule) needs the cluster's costs, which only the
simulator has: the real layer takes an explicit list (any choice gives the same numbers).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from exec.layers.moe import Comms, DistMoE
from exec.layers.overlap import Overlap
from exec.layers.registry import register
from exec.layers.sparse import ExchangeV, pack, unpack
from exec.layers.waits import wait_work
from sim.core.errors import ConfigError
from sim.strategies.chunking import comm_order
from sim.strategies.fastermoe.selector import group_layout, parse_shadow

SHADOW_STREAM = "comm.1"  # as the simulator's graph: shadow broadcasts and reductions


def _complete(work: Any, comms: Comms, what: str) -> None:
    """Wait for an async collective of the whole world within the layer's timeout."""
    wait_work(work, comms.rank, what, list(range(comms.world)), comms.timeout_s)


class _Shadow(torch.autograd.Function):
    """Forward: the owner's flat parameters to every rank. Backward: the copies' gradients
    all-reduced; the owner takes the sum, the other ranks' anchors nothing."""

    @staticmethod
    def forward(ctx, anchor, comms: Comms, owner: int, what: str):
        ctx.args = (comms, owner, what)
        out = anchor.detach().clone()  # elsewhere than on the owner, overwritten below
        work = dist.broadcast(out, src=owner, group=comms.groups[SHADOW_STREAM], async_op=True)
        _complete(work, comms, f"broadcast of {what}")
        return out

    @staticmethod
    def backward(ctx, grad):
        comms, owner, what = ctx.args
        total = grad.contiguous().clone()
        work = dist.all_reduce(total, group=comms.groups[SHADOW_STREAM], async_op=True)
        _complete(work, comms, f"all_reduce of {what} gradients")
        return (total if comms.rank == owner else torch.zeros_like(total)), None, None, None


def _experts_on(
    moe: DistMoE, x: torch.Tensor, active: list[int], sources: int, c: int
) -> torch.Tensor:
    """This rank's `active` local experts on rows from `sources` ranks laid out
    [source, expert, c slots] (as exchanged); the output comes back in the same layout."""
    A, M = len(active), x.shape[-1]
    idx = torch.tensor(active, dtype=torch.long, device=x.device)
    h = x.view(sources, A, c, M).transpose(0, 1).reshape(A, sources * c, M)
    h = moe.act(torch.baddbmm(moe.b1[idx], h, moe.w1[idx]))
    y = torch.baddbmm(moe.b2[idx], h, moe.w2[idx])
    return y.view(A, sources, c, M).transpose(0, 1).reshape(sources * A * c, M)


def _shadow_params(moe: DistMoE, e: int) -> tuple[torch.Tensor, ...]:
    """Expert e's parameters on every rank: w1 [M, H], b1 [1, H], w2 [H, M], b2 [1, M]."""
    El = moe.spec.local_experts
    owner, i = divmod(e, El)
    parts = (moe.w1[i], moe.b1[i], moe.w2[i], moe.b2[i])
    flat = _Shadow.apply(
        torch.cat([p.reshape(-1) for p in parts]), moe.comms, owner, f"shadow expert {e}"
    )
    out, off = [], 0
    for p in parts:
        out.append(flat[off : off + p.numel()].view(p.shape))
        off += p.numel()
    return tuple(out)


@register("fastermoe")
def fastermoe(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    spec, comms, me = moe.spec, moe.comms, moe.rank
    P, El, E = spec.world, spec.local_experts, spec.experts
    _, C, M = buf.shape
    g, n = group_layout(P, params["group_size"])
    plan = comm_order(n, params["order"])
    shadow = parse_shadow(params["shadow"], E)
    if shadow == "auto":
        raise ConfigError(
            "strategy fastermoe in the real layer needs strategy.shadow as a list of expert ids "
            "or 'none' (the greedy rule runs in the simulator: `moesim simulate` reports the "
            "experts it shadows)"
        )
    shadowed = set(shadow)
    active = [[i for i in range(El) if q * El + i not in shadowed] for q in range(P)]
    G = me // g
    view = buf.view(P, El, C, M)

    def peers(group: int) -> range:
        return range(group * g, (group + 1) * g)

    # Slots filled per (rank, expert): all C of them with the padded buffer, else the kept
    # tokens (exec.layers.sparse), so a step moves what the simulator's step moves.
    fill = moe.fill
    sent = np.full(E, C) if fill is None else fill.send  # mine, per expert
    got = np.full((P, El), C) if fill is None else fill.recv  # to my experts, per source

    def out_blocks(s: int) -> np.ndarray:  # filled rows per block I send at step s
        return np.array([sent[q * El + i] for q in peers((G + s) % n) for i in active[q]])

    def in_blocks(s: int) -> np.ndarray:  # ... and per block I receive
        return np.array([got[p, i] for p in peers((G - s) % n) for i in active[me]])

    def out_sizes(s: int) -> list[int]:  # rows I send at step s (to group G + s)
        to, b = (G + s) % n, iter(out_blocks(s).tolist())
        return [sum(next(b) for _ in active[q]) if q // g == to else 0 for q in range(P)]

    def in_sizes(s: int) -> list[int]:  # rows I receive at step s (from group G - s)
        frm, b = (G - s) % n, iter(in_blocks(s).tolist())
        return [sum(next(b) for _ in active[me]) if p // g == frm else 0 for p in range(P)]

    def exchange(x: torch.Tensor, s: int, back: bool, stream: str, what: str) -> torch.Tensor:
        """Step s's blocks of C slots [blocks, C, M] (`back`: the outputs going home) as an
        all-to-allv of their filled rows, unpacked into blocks again."""
        ob, ib = (in_blocks(s), out_blocks(s)) if back else (out_blocks(s), in_blocks(s))
        send, recv = (in_sizes(s), out_sizes(s)) if back else (out_sizes(s), in_sizes(s))
        key = ("fwd", "combine" if back else "dispatch", s)
        rows = ExchangeV.apply(pack(x, ob), comms, stream, send, recv, what, moe.splits, key)
        return unpack(rows, ib, C)

    received: dict[int, torch.Tensor] = {}
    expert_out: dict[int, torch.Tensor] = {}
    combined: dict[int, torch.Tensor] = {}
    copies: dict[int, tuple[torch.Tensor, ...]] = {}
    arrived = [threading.Event() for _ in range(n)]
    computed = [threading.Event() for _ in range(n)]
    fetched = {e: threading.Event() for e in shadow}
    ov = Overlap("fastermoe")

    def comm_stream(stream: str) -> None:
        if stream == SHADOW_STREAM:
            for e in shadow:
                copies[e] = _shadow_params(moe, e)
                fetched[e].set()
        for what, s, st in plan:
            if st != stream:
                continue
            if what == "first":
                to = (G + s) % n
                x = torch.cat([view[q, active[q]] for q in peers(to)])
                received[s] = exchange(x, s, False, stream, f"dispatch step {s}")
                arrived[s].set()
            else:
                ov.wait(computed[s])
                out = expert_out[s].view(-1, C, M)
                combined[s] = exchange(out, s, True, stream, f"combine step {s}")

    shadow_out: dict[int, torch.Tensor] = {}

    def compute_stream() -> None:
        for s in range(n):  # each step as its tokens arrive
            ov.wait(arrived[s])
            expert_out[s] = _experts_on(moe, received[s], active[me], g, C)
            computed[s].set()
        for e in shadow:  # shadowed experts on my own slots, once their parameters are in
            ov.wait(fetched[e])
            w1, b1, w2, b2 = copies[e]
            shadow_out[e] = torch.addmm(b2, moe.act(torch.addmm(b1, buf[e], w1)), w2)

    streams = list(dict.fromkeys([st for _, _, st in plan] + ([SHADOW_STREAM] if shadow else [])))
    ov.run(streams, comm_stream, compute_stream)
    # One cat over every step's output (empty ones included) and the shadow outputs: each
    # exchange's output is used on every rank, so autograd runs its backward everywhere.
    blocks = [q * El + i for s in range(n) for q in peers((G + s) % n) for i in active[q]]
    blocks += list(shadow)
    position = {e: b for b, e in enumerate(blocks)}
    flat = torch.cat(
        [combined[s].reshape(-1, M) for s in range(n)] + [shadow_out[e] for e in shadow]
    )
    perm = torch.tensor([position[e] for e in range(E)], dtype=torch.long, device=buf.device)
    return flat.view(E, C, M)[perm]
