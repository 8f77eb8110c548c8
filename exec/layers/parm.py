"""Parm's schedules in the real layer (gloo or NCCL), to check them against the plain layer.

Placement as `sim.strategies.parm`: P = N_EP * N_ESP ranks; rank r has EP index r // N_ESP
and ESP index r % N_ESP; MP group r // N_MP holds token set r // N_MP (the same T tokens on
its N_MP ranks, as under tensor parallelism). Expert x lives on EP index x // (E/N_EP),
sliced over its ESP group: slice s has hidden units s*H/N_ESP .. and adds b2 on slice 0 only.

- baseline: ESP-AllGather (gradient: reduce-scatter), EP-AlltoAll, experts, ESP-AllReduce
  (gradient: identity), EP-AlltoAll, ESP-Split (gradient: all-gather).
- s1: MP-Split of the tokens (gradient: MP-AllGather), gate on T/N_MP, dump, EP&ESP-AlltoAll
  over all P ranks, experts, EP&ESP-AlltoAll, local combine, decode, MP-AllGather (gradient:
  the local slice).
- s2: gate on T, MP-Split of the capacity slots (gradient: MP-AllGather), dump, exchange,
  experts, exchange, local combine, MP-AllGather of the slots (gradient: local slice), decode.
  With SAA the returning exchange runs in N_EP rounds (round j from EP index e + j) and each
  round's MP-AllGather is issued asynchronously on its own communicator while the next round
  runs; its backward is the plain adjoint (exact, not overlapped).

The baseline computes every token N_MP times (Sec. III-A), so its expert weight gradients are
N_MP times the plain layer's; S1 and S2 compute each once. S1 gates each MP slice on its own
(capacity ceil(k f T / (N_MP E))), so it equals the plain layer where no token is dropped.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from exec.layers.grads import grad_of
from exec.layers.group_comms import GroupComms
from exec.layers.moe import (
    ACTIVATIONS,
    Comms,
    MoESpec,
    decode,
    encode,
    make_expert,
    make_gate,
    make_output_grad,
    make_tokens,
    route,
    wait_work,
)
from exec.layers.shapes import expert_slices, pad_capacity, sim_layer
from exec.runtime.compat import all_gather_single
from sim.strategies.parm.volumes import check
from sim.workload.moe import expert_capacity
from sim.workload.slicing import aligned


class ParmComms:
    """The world, EP, ESP and MP groups (MP with a second communicator for SAA)."""

    def __init__(self, rank: int, world: int, tp: int, esp: int, timeout_s: float, device):
        ep = world // esp
        self.world = Comms(rank, world, timeout_s, device)
        self.esp = GroupComms(
            rank, [list(range(e * esp, (e + 1) * esp)) for e in range(ep)], timeout_s, device
        )
        self.ep = GroupComms(
            rank, [list(range(s, world, esp)) for s in range(esp)], timeout_s, device
        )
        self.mp = GroupComms(
            rank,
            [list(range(g * tp, (g + 1) * tp)) for g in range(world // tp)],
            timeout_s,
            device,
            streams=("comm", "comm.1"),
        )


class _GatherRS(torch.autograd.Function):
    """All-gather over a group (new dim 0); gradient: reduce-scatter."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gc: GroupComms, what: str) -> torch.Tensor:
        ctx.gc, ctx.what = gc, what
        return gc.all_gather(x, what)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.gc.reduce_scatter(grad.contiguous(), f"{ctx.what} (gradient)"), None, None


class _AllReduce(torch.autograd.Function):
    """Sum over a group; gradient: identity (the result is replicated over the group)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gc: GroupComms, what: str) -> torch.Tensor:
        x = x.contiguous().clone()
        work = dist.all_reduce(x, group=gc.groups["comm"], async_op=True)
        wait_work(work, gc.rank, f"all_reduce for {what}", gc.members, gc.timeout_s)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


def _cat(gc: GroupComms, x: torch.Tensor, dim: int, what: str) -> torch.Tensor:
    return torch.cat(list(gc.all_gather(x, what)), dim=dim)


class _Split(torch.autograd.Function):
    """This member's 1/n slice along `dim`; gradient: all-gather along `dim`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gc: GroupComms, dim: int) -> torch.Tensor:
        ctx.gc, ctx.dim = gc, dim
        c = x.shape[dim] // gc.world
        return x.narrow(dim, gc.index * c, c).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _cat(ctx.gc, grad, ctx.dim, "split (gradient)"), None, None


class _Gather(torch.autograd.Function):
    """All-gather along `dim`; gradient: this member's slice (the output is replicated)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gc: GroupComms, dim: int) -> torch.Tensor:
        ctx.gc, ctx.dim, ctx.c = gc, dim, x.shape[dim]
        return _cat(gc, x, dim, "gather")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.narrow(ctx.dim, ctx.gc.index * ctx.c, ctx.c).contiguous(), None, None


class _SAA(torch.autograd.Function):
    """S2's returning EP&ESP-AlltoAll + local combine + MP-AllGather as SAA rounds.
    In: expert outputs [P(dest), El, c, M]; out: [E, N_MP * c, M]."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, moe: ParmMoE) -> torch.Tensor:
        ctx.moe = moe
        P, El, c, M = out.shape
        n, ep, mp, e = moe.esp_n, moe.ep_n, moe.mp_n, moe.e
        comms, gc = moe.comms, moe.comms.mp
        full = out.new_zeros(moe.spec.experts, mp * c, M)
        pending = []
        for j in range(ep):
            dst = [q for q in range(P) if (q // n - e + j) % ep == 0]
            src = [q for q in range(P) if (q // n - e - j) % ep == 0]
            recv = out.new_empty(n, El, c, M)
            work = dist.all_to_all_single(
                recv,
                out[dst].contiguous(),
                [int(q in src) for q in range(P)],
                [int(q in dst) for q in range(P)],
                group=comms.world.groups["comm"],
                async_op=True,
            )
            wait_work(work, moe.rank, f"SAA round {j}", list(range(P)), comms.world.timeout_s)
            mine = recv.sum(0).contiguous()  # local combine: the N_ESP slices' partial sums
            got = mine.new_empty(mp * El, c, M)
            w = all_gather_single(got, mine, group=gc.groups["comm.1"], async_op=True)
            pending.append((j, w, got))  # runs while the next round's exchange does
        for j, w, got in pending:
            wait_work(w, moe.rank, f"SAA gather {j}", gc.members, gc.timeout_s)
            for t, member in enumerate(gc.members):  # member t combined EP block e_t + j
                b = (member // n + j) % ep
                full[b * El : (b + 1) * El, t * c : (t + 1) * c] = got[t * El : (t + 1) * El]
        return full

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        moe = ctx.moe
        mp, n, ep = moe.mp_n, moe.esp_n, moe.ep_n
        c = grad.shape[1] // mp
        mine = grad.narrow(1, moe.comms.mp.index * c, c)  # the gather's gradient
        E, _, M = mine.shape
        rep = mine.reshape(ep, 1, E // ep, c, M).expand(ep, n, E // ep, c, M)
        back = rep.reshape(ep * n, E // ep, c, M)  # the local combine's gradient
        return moe.comms.world.exchange(back, "comm", "SAA (gradient)"), None


class ParmMoE(torch.nn.Module):
    """This rank's gate (replicated) and slices of its EP index's experts."""

    def __init__(self, spec: MoESpec, rank: int, tp: int, esp: int, comms: ParmComms, device):
        super().__init__()
        deg = check(sim_layer(spec), tp, esp)
        self.spec, self.rank, self.comms = spec, rank, comms
        self.mp_n, self.esp_n, self.ep_n = deg.mp, deg.esp, deg.ep
        self.e, self.s = divmod(rank, esp)
        self.El = spec.experts // deg.ep
        hs, _ = expert_slices(spec, esp, self.s)
        ws = [make_expert(spec, self.e * self.El + x) for x in range(self.El)]

        def param(f) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.stack([f(w) for w in ws]).to(device))

        self.gate = torch.nn.Parameter(make_gate(spec).to(device))
        self.w1 = param(lambda w: w["w1"][:, hs])
        self.b1 = param(lambda w: w["b1"][hs])
        self.w2 = param(lambda w: w["w2"][hs, :])
        self.b2 = param(lambda w: w["b2"])

    def experts(self, rows: torch.Tensor) -> torch.Tensor:
        """[El, R, M] -> this slice's partial outputs (b2 added by slice 0)."""
        act = ACTIVATIONS[self.spec.activation]
        h = act(torch.bmm(rows, self.w1) + self.b1[:, None])
        y = torch.bmm(h, self.w2)
        return y + self.b2[:, None] if self.s == 0 else y

    def forward(self, x: torch.Tensor, schedule: str, saa: bool = False):
        sp, n, ep, El = self.spec, self.esp_n, self.ep_n, self.El
        E, k, f = sp.experts, sp.top_k, sp.capacity_factor
        if schedule == "baseline":
            r = route(x, self.gate, k, sp.capacity)
            buf = encode(x, r, E, sp.capacity)
            C, M = buf.shape[1], buf.shape[2]
            g = _GatherRS.apply(buf, self.comms.esp, "esp_gather")  # [n, E, C, M]
            send = g.reshape(n, ep, El, C, M).permute(1, 2, 0, 3, 4).reshape(ep, El, n * C, M)
            recv = self.comms.ep.all_to_all(send, "comm", "dispatch")
            out = self.experts(recv.permute(1, 0, 2, 3).reshape(El, ep * n * C, M))
            out = _AllReduce.apply(out, self.comms.esp, "esp_reduce")
            back = self.comms.ep.all_to_all(
                out.reshape(El, ep, n * C, M).permute(1, 0, 2, 3), "comm", "combine"
            )
            full = back.reshape(ep, El, n, C, M).permute(2, 0, 1, 3, 4).reshape(n, E, C, M)
            return decode(_Split.apply(full, self.comms.esp, 0)[0], r), r
        mp = self.comms.mp
        if schedule == "s1":
            xl = _Split.apply(x, mp, 0)  # MP-Split of the tokens
            C = expert_capacity(xl.shape[0], E, k, f)
            r = route(xl, self.gate, k, C)
            comb = self._exchange(encode(xl, r, E, C), saa=False)
            return _Gather.apply(decode(comb, r), mp, 0), r
        r = route(x, self.gate, k, sp.capacity)
        buf = pad_capacity(encode(x, r, E, sp.capacity), aligned(sp.capacity, self.mp_n))
        mine = _Split.apply(buf, mp, 1)  # MP-Split of the capacity slots
        full = self._exchange(mine, saa=saa)
        if not saa:
            full = _Gather.apply(full, mp, 1)
        return decode(full[:, : sp.capacity], r), r

    def _exchange(self, buf: torch.Tensor, saa: bool) -> torch.Tensor:
        """Dump, EP&ESP-AlltoAll, experts, EP&ESP-AlltoAll, local combine: [E, c, M] in and
        out (with SAA: [E, N_MP c, M] out, the MP-AllGather included)."""
        E, c, M = buf.shape
        n, ep, El, P = self.esp_n, self.ep_n, self.El, self.comms.world.world
        send = buf.reshape(ep, El, c, M).repeat_interleave(n, dim=0)  # dump: [P, El, c, M]
        recv = self.comms.world.all_to_all(send, "comm", "dispatch")  # [P(src), El, c, M]
        out = self.experts(recv.permute(1, 0, 2, 3).reshape(El, P * c, M))
        out = out.reshape(El, P, c, M).permute(1, 0, 2, 3)  # [P(dest), El, c, M]
        if saa:
            return _SAA.apply(out, self)
        back = self.comms.world.all_to_all(out, "comm", "combine")  # [P(src), El, c, M]
        return back.reshape(ep, n, El, c, M).sum(1).reshape(E, c, M)  # local combine


def parm_job(rank: int, world: int, cases: list[dict], timeout_s: float) -> dict[str, Any]:
    """One rank: each case {spec, tp, esp, runs: [(label, schedule, saa)]} forward and
    backward on token set rank // tp; numpy results per label."""
    device = torch.device("cpu")
    comms: dict[tuple[int, int], ParmComms] = {}
    for c in cases:  # every rank creates the same groups in the same order
        key = (c["tp"], c["esp"])
        if key not in comms:
            comms[key] = ParmComms(rank, world, *key, timeout_s, device)
    out: dict[str, Any] = {}
    for c in cases:
        spec, tp, esp = c["spec"], c["tp"], c["esp"]
        s = rank // tp
        for label, schedule, saa in c["runs"]:
            moe = ParmMoE(spec, rank, tp, esp, comms[(tp, esp)], device)
            x = make_tokens(spec, s).requires_grad_(True)
            t0 = time.perf_counter()
            y, _ = moe(x, schedule, saa)
            (y * make_output_grad(spec, s)).sum().backward()
            grads = {"x": grad_of(x).numpy()}
            grads |= {k: p.grad.numpy() for k, p in moe.named_parameters() if p.grad is not None}
            out[label] = {
                "set": s,
                "y": y.detach().numpy(),
                "grads": grads,
                "seconds": time.perf_counter() - t0,
            }
    return {"rank": rank, "cases": out}


def run_parm(cases: list[dict], nprocs: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Every rank's results (rank order), gloo on CPU."""
    from exec.runtime.launch import call_ranks

    return call_ranks(parm_job, (cases, timeout_s), nprocs, "gloo", timeout_s)
