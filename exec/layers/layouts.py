"""Real-layer layouts beyond pure expert parallelism: DeepSpeed TED and Tutel's P1 / P2.

The simulator's side is `sim.strategies.ted` and `sim.strategies.tutel` (read their
docstrings for the layouts). Both need process sub-groups, which every rank creates in the
same order (`LayoutComms`), and modules other than `exec.layers.moe.DistMoE`:

- `TEDMoE`: the layer under tensor parallelism of degree tp. Ranks j*tp .. j*tp+tp-1 form TP
  group j and hold token set j (replicated inputs); ranks sharing a tp index form an EP group
  over which the E experts are spread (the same experts on every rank of a TP group). It is
  a `DistMoE` on its EP group, so `sequential` on it is the unsliced layer of those token
  sets; `ted` keeps this rank's 1/tp slice of the capacity dimension (`_DropTokens`, whose
  gradient is an all-gather), runs the EP exchange and experts, and all-gathers the capacity
  slices inside the TP group (`_GatherTokens`, whose gradient is the local slice).
- `SlicedMoE`: fewer experts E than ranks W; expert e is sliced over ranks e*n .. e*n+n-1
  (n = W/E). Rank e*n+i stores the i-th slice of e's hidden units (w1[:, s_i], b1[s_i],
  w2[s_i, :]) and the i-th slice of its output bias (b2[m_i]): one placement for both
  parallel modes, so switching costs nothing (Tutel Sec. 3.2). P1 all-gathers the expert
  from the slices (`_GatherExpert`; the gradient is reduce-scattered back) and runs it on
  C/n of every rank's slots; P2 repeats the buffer n times, runs each slice on all slots
  and sums the n partial outputs (each slice adds its part of b2).

`tutel`'s executor entry is wrapped here: sliced layers take the P1 / P2 path, everything
else (E >= W, where P1 and P2 are plain expert parallelism) the original one.
`run_layouts` runs cases on local processes; `reference` is the layer on one process
(autograd, no communication), the ground truth for outputs and every gradient.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from exec.errors import ExecError
from exec.layers.moe import (
    ACTIVATIONS,
    Comms,
    DistMoE,
    MoESpec,
    Routing,
    decode,
    encode,
    make_expert,
    make_gate,
    make_output_grad,
    make_tokens,
    route,
    wait_work,
)
from exec.layers.pipelined import pipelined  # also registers "tutel", wrapped below
from exec.layers.registry import STRATEGIES, register, resolve_strategy
from exec.runtime.compat import all_gather_single, reduce_scatter_single
from sim.core.errors import ConfigError
from sim.strategies.ted import check_layout
from sim.strategies.tutel import route_parallel
from sim.workload.moe import MoELayer
from sim.workload.slicing import aligned

# -- communication over sub-groups --------------------------------------------------------------


class GroupComms(Comms):
    """`Comms` over this rank's member of a partition of the ranks into groups (one process
    group per stream). Every rank creates every group, as torch.distributed requires."""

    def __init__(
        self,
        rank: int,
        groups: list[list[int]],
        timeout_s: float,
        device: torch.device,
        streams: tuple[str, ...] = ("comm",),
    ):
        from exec.runtime.timeouts import SETUP_TIMEOUT_S

        self.rank, self.timeout_s, self.device = rank, timeout_s, device
        timeout = timedelta(seconds=max(timeout_s, SETUP_TIMEOUT_S))
        self.groups = {}
        for s in streams:
            for members in groups:
                pg = dist.new_group(members, timeout=timeout)
                if rank in members:
                    self.groups[s], self.members = pg, list(members)
        self.world = len(self.members)
        self.index = self.members.index(rank)

    def exchange(self, x: torch.Tensor, stream: str, what: str) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        work = dist.all_to_all_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(work, self.rank, f"all_to_all for {what} (stream {stream})", self.members,
              self.timeout_s)  # fmt: skip
        return out

    def all_gather(self, x: torch.Tensor, what: str, stream: str = "comm") -> torch.Tensor:
        """Members' x stacked along a new first dimension, in member order."""
        x = x.contiguous()
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))  # members along dim 0
        work = all_gather_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(work, self.rank, f"all_gather for {what}", self.members, self.timeout_s)
        return out.view(self.world, *x.shape)

    def reduce_scatter(self, x: torch.Tensor, what: str, stream: str = "comm") -> torch.Tensor:
        """Sum over members of x [world, ...]; this member keeps row `index`."""
        out = x.new_empty(x.shape[1:])
        x = x.reshape(self.world * x.shape[1], *x.shape[2:]).contiguous()  # members along dim 0
        work = reduce_scatter_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(work, self.rank, f"reduce_scatter for {what}", self.members, self.timeout_s)
        return out


# -- DeepSpeed TED ------------------------------------------------------------------------------


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
        ep = check_layout(_layer(spec), tp)
        super().__init__(replace(spec, world=ep), rank // tp, comms.ep[tp], device)
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
        return STRATEGIES["sequential"](moe, buf, params)
    C = buf.shape[1]
    padded = _pad(buf, aligned(C, tp))  # DeepSpeed needs C divisible by tp; extra slots empty
    mine = _DropTokens.apply(padded, moe.tp)
    received = moe.comms.all_to_all(mine, "comm", "dispatch")
    out = moe.comms.all_to_all(moe.experts(received), "comm", "combine")
    return _GatherTokens.apply(out, moe.tp)[:, :C]


def _pad(buf: torch.Tensor, capacity: int) -> torch.Tensor:
    E, C, M = buf.shape
    if capacity == C:
        return buf
    return torch.cat([buf, buf.new_zeros(E, capacity - C, M)], dim=1)


# -- Tutel P1 / P2 ------------------------------------------------------------------------------


def _slices(spec: MoESpec, n: int, i: int) -> tuple[slice, slice]:
    """Slice i of the hidden units and of the model dim (for b2)."""
    h, m = spec.hidden_dim // n, spec.model_dim // n
    return slice(i * h, (i + 1) * h), slice(i * m, (i + 1) * m)


class SlicedMoE(torch.nn.Module):
    """Fewer experts than ranks: this rank's slice of expert rank // n (module docstring)."""

    def __init__(self, spec: MoESpec, rank: int, comms: LayoutComms, device: torch.device):
        super().__init__()
        n = spec.world // spec.experts
        if spec.experts >= spec.world or spec.world % spec.experts:
            raise ConfigError(
                f"moe.experts: a sliced layer needs fewer experts than ranks, dividing them "
                f"(got {spec.experts} experts on {spec.world} ranks)"
            )
        for name in ("hidden_dim", "model_dim"):
            if getattr(spec, name) % n:
                raise ConfigError(
                    f"moe.{name}: {getattr(spec, name)} does not split into the {n} slices of "
                    f"an expert"
                )
        self.spec, self.rank, self.n = spec, rank, n
        self.act = ACTIVATIONS[spec.activation]
        self.comms, self.shard = comms.world, comms.shard[n]
        hs, ms = _slices(spec, n, rank % n)
        full = make_expert(spec, rank // n)

        def param(t: torch.Tensor) -> torch.nn.Parameter:
            return torch.nn.Parameter(t.contiguous().to(device))

        self.gate = param(make_gate(spec))
        self.w1, self.b1 = param(full["w1"][:, hs]), param(full["b1"][hs])
        self.w2, self.b2 = param(full["w2"][hs, :]), param(full["b2"][ms])

    def forward(
        self, x: torch.Tensor, strategy: str = "tutel", params: dict | None = None
    ) -> tuple[torch.Tensor, Routing]:
        s = self.spec
        full = resolve_strategy(strategy, params or {})
        routing = route(x, self.gate, s.top_k, s.capacity)
        buf = encode(x, routing, s.experts, s.capacity)
        return decode(STRATEGIES[strategy](self, buf, full), routing), routing

    def p1(self, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        """EP + DP: the whole expert, gathered from its slices, on C/n of every rank's slots
        for it (rank e*n+i takes slots [i*C1/n, (i+1)*C1/n), C1 = C aligned to n)."""
        E, C, M = buf.shape
        n, W = self.n, self.spec.world
        c = aligned(C, n) // n
        w1, b1, w2, b2 = _GatherExpert.apply(self.w1, self.b1, self.w2, self.b2, self.shard)

        def experts(received: torch.Tensor) -> torch.Tensor:  # [W, c_j, M] of my expert
            h = self.act(received @ w1 + b1)
            return h @ w2 + b2

        virtual = _pad(buf, n * c).reshape(W, c, M)  # virtual expert e*n+i: slot range i of e
        out = pipelined(_Proxy(self.comms, experts), virtual, {**params, "order": "tutel"})
        return out.reshape(E, n * c, M)[:, :C]

    def p2(self, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        """EP + MP: the buffer repeated n times (copy i to slice i of each expert); every
        slice runs all slots; the n partial outputs are summed."""
        E, C, M = buf.shape
        n, W = self.n, self.spec.world
        _, ms = _slices(self.spec, n, self.rank % n)
        bias = torch.zeros(M, dtype=self.b2.dtype, device=self.b2.device)
        bias = bias.index_put((torch.arange(ms.start, ms.stop, device=bias.device),), self.b2)

        def experts(received: torch.Tensor) -> torch.Tensor:
            return self.act(received @ self.w1 + self.b1) @ self.w2 + bias

        repeated = buf.unsqueeze(1).expand(E, n, C, M).reshape(W, C, M)
        out = pipelined(_Proxy(self.comms, experts), repeated, {**params, "order": "tutel"})
        return out.reshape(E, n, C, M).sum(dim=1)


@dataclass
class _Proxy:
    """What `exec.layers.moe.pipelined` uses of a layer: its comms and its expert function."""

    comms: Comms
    experts: Any


class _GatherExpert(torch.autograd.Function):
    """All-gather an expert from its n slices (one flat message); gradient: reduce-scatter
    (each slice receives the sum over the n replicas of its part, ZeRO style)."""

    @staticmethod
    def forward(ctx, w1, b1, w2, b2, shard: GroupComms):
        ctx.shard, ctx.shapes = shard, [t.shape for t in (w1, b1, w2, b2)]
        flat = torch.cat([t.reshape(-1) for t in (w1, b1, w2, b2)])
        parts = shard.all_gather(flat, "expert slices")  # [n, L]
        w1p, b1p, w2p, b2p = _unflatten(parts, ctx.shapes)
        return torch.cat(w1p, 1), torch.cat(b1p), torch.cat(w2p), torch.cat(b2p)

    @staticmethod
    def backward(ctx, gw1, gb1, gw2, gb2):
        n = ctx.shard.world
        per = [gw1.chunk(n, 1), gb1.chunk(n), gw2.chunk(n), gb2.chunk(n)]
        rows = torch.stack(
            [torch.cat([p[i].reshape(-1) for p in per]) for i in range(n)]
        )  # [n, L]: row i holds slice i's part of every gradient
        mine = ctx.shard.reduce_scatter(rows, "expert gradient")
        out = _unflatten(mine.unsqueeze(0), ctx.shapes)
        return out[0][0], out[1][0], out[2][0], out[3][0], None


def _unflatten(parts: torch.Tensor, shapes: list[torch.Size]) -> list[list[torch.Tensor]]:
    """[n, L] rows -> per tensor, the n rows' pieces shaped like `shapes`."""
    out, at = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append([row[at : at + size].reshape(shape) for row in parts])
        at += size
    return out


_tutel_ep = STRATEGIES["tutel"]


@register("tutel")
def tutel(moe: Any, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Tutel with switchable parallelism: P1 / P2 (or the inline router's pick) on a sliced
    layer; on E >= W ranks every choice is plain expert parallelism (the original entry)."""
    if not isinstance(moe, SlicedMoE):
        return _tutel_ep(moe, buf, params)
    choice = params["parallel"]
    if choice == "auto":
        choice = route_parallel(_layer(moe.spec))
    if choice == "p1":
        return moe.p1(buf, params)
    if choice == "p2":
        return moe.p2(buf, params)
    raise ConfigError(
        f"strategy.parallel: {choice!r} on {moe.spec.experts} experts over {moe.spec.world} "
        f"ranks: sliced experts run 'p1', 'p2' or 'auto'"
    )


def _layer(spec: MoESpec) -> MoELayer:
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
    )


# -- running cases on every rank ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One layer and a strategy on it. `ted` cases (tp > 1) run with replicated token sets
    (rank r holds set r // tp) and also run `sequential` on the same EP-group layer."""

    spec: MoESpec
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"E{self.spec.experts}:{self.name}({inner})"

    @property
    def tp(self) -> int:
        return int(self.params.get("tp", 1)) if self.name == "ted" else 1

    def token_set(self, rank: int) -> int:
        return rank // self.tp


class LayoutComms:
    """Every process group the cases need, created in the same order on every rank."""

    def __init__(self, rank: int, world: int, cases: list[Case], timeout_s: float, device):
        self.world = Comms(rank, world, timeout_s, device)
        self.ep: dict[int, GroupComms] = {}
        self.tp: dict[int, GroupComms] = {}
        self.shard: dict[int, GroupComms] = {}
        for tp in sorted({c.tp for c in cases if c.tp > 1}):
            ep = world // tp
            self.ep[tp] = GroupComms(
                rank, [[j * tp + i for j in range(ep)] for i in range(tp)], timeout_s, device
            )
            self.tp[tp] = GroupComms(
                rank, [list(range(k * tp, (k + 1) * tp)) for k in range(ep)], timeout_s, device
            )
        for n in sorted({world // c.spec.experts for c in cases if c.spec.experts < world}):
            groups = [list(range(e * n, (e + 1) * n)) for e in range(world // n)]
            self.shard[n] = GroupComms(rank, groups, timeout_s, device)


def layout_job(
    rank: int, world: int, cases: list[Case], timeout_s: float, backend: str
) -> dict[str, Any]:
    """One rank: every case forward and backward; numpy results per case label."""
    device = (
        torch.device("cuda", rank % torch.cuda.device_count())
        if backend == "nccl"
        else torch.device("cpu")
    )
    for c in cases:
        if c.spec.world != world:
            raise ExecError(f"case {c.label} is for {c.spec.world} ranks, {world} started")
    comms = LayoutComms(rank, world, cases, timeout_s, device)
    out: dict[str, Any] = {}
    for c in cases:
        s = c.token_set(rank)
        moe: torch.nn.Module
        if c.tp > 1:
            moe = TEDMoE(c.spec, rank, c.tp, comms, device)
        elif c.spec.experts < world:
            moe = SlicedMoE(c.spec, rank, comms, device)
        else:
            moe = DistMoE(c.spec, rank, comms.world, device)
        runs = [(c.label, c.name, c.params)]
        if c.tp > 1:
            runs.append((f"{c.label}/sequential", "sequential", {}))
        for label, name, params in runs:
            moe.zero_grad(set_to_none=True)
            x = make_tokens(c.spec, s).to(device).requires_grad_(True)
            t0 = time.perf_counter()
            y, routing = moe(x, name, params)
            (y * make_output_grad(c.spec, s).to(device)).sum().backward()
            out[label] = {
                "set": s,
                "seconds": time.perf_counter() - t0,
                "y": y.detach().cpu().numpy(),
                "slot": routing.slot.cpu().numpy(),
                "grads": {
                    k: p.grad.detach().cpu().numpy() for k, p in [("x", x), *moe.named_parameters()]
                },
            }
    return {"rank": rank, "cases": out}


def run_layouts(
    cases: list[Case], nprocs: int, backend: str = "gloo", timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """Every rank's results (rank order)."""
    from exec.runtime.launch import call_ranks

    return call_ranks(layout_job, (cases, timeout_s, backend), nprocs, backend, timeout_s)


# -- the single-process reference ----------------------------------------------------------------


def reference(spec: MoESpec, sets: int) -> dict[str, Any]:
    """The layer on one process for token sets 0..sets-1 (autograd, no communication):
    outputs, x and gate gradients per set, and every expert's gradient summed over sets."""
    gate = make_gate(spec)
    experts = [
        {k: v.clone().requires_grad_(True) for k, v in make_expert(spec, e).items()}
        for e in range(spec.experts)
    ]
    act = ACTIVATIONS[spec.activation]
    ys, gx, ggate = [], [], []
    for s in range(sets):
        x = make_tokens(spec, s).requires_grad_(True)
        g = gate.clone().requires_grad_(True)
        routing = route(x, g, spec.top_k, spec.capacity)
        buf = encode(x, routing, spec.experts, spec.capacity)
        out = torch.stack(
            [act(buf[e] @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"] for e, w in enumerate(experts)]
        )
        y = decode(out, routing)
        (y * make_output_grad(spec, s)).sum().backward()
        ys.append(y.detach().numpy())
        gx.append(x.grad.numpy())
        ggate.append(g.grad.numpy())
    return {
        "y": ys,
        "x": gx,
        "gate": ggate,
        "experts": [{k: v.grad.numpy() for k, v in w.items()} for w in experts],
    }


def expected_expert_grads(spec: MoESpec, ref: dict[str, Any], rank: int) -> dict[str, np.ndarray]:
    """What a sliced layer's rank holds of its expert's gradient (its slices)."""
    n = spec.world // spec.experts
    hs, ms = _slices(spec, n, rank % n)
    g = ref["experts"][rank // n]
    return {"w1": g["w1"][:, hs], "b1": g["b1"][hs], "w2": g["w2"][hs, :], "b2": g["b2"][ms]}


def needs_layouts(name: str, params: dict[str, Any], spec: MoESpec) -> bool:
    """Whether the real layer for (strategy, params) is one of this module's: TED with a TP
    group, or Tutel on sliced experts."""
    return (name == "ted" and int(params.get("tp", 2)) > 1) or (
        name == "tutel" and spec.experts < spec.world
    )


def diff_from_reference(case: Case, ranks: list[dict[str, Any]]) -> dict[str, float]:
    """max |got - reference| / max |reference| over all ranks, per quantity: the output y,
    the x and gate gradients, and the expert gradients (a sliced rank: its slices; TED: the
    sum over each TP group, whose ranks hold the same experts with a capacity slice each)."""
    tp = case.tp
    ref = reference(case.spec, sets=case.spec.world // tp)
    worst: dict[str, tuple[float, float]] = {}

    def add(what: str, got: np.ndarray, want: np.ndarray) -> None:
        d, scale = worst.get(what, (0.0, 0.0))
        worst[what] = (
            max(d, float(np.abs(got - want).max())),
            max(scale, float(np.abs(want).max())),
        )

    for r in ranks:
        got = r["cases"][case.label]
        s = got["set"]
        add("y", got["y"], ref["y"][s])
        add("grad_x", got["grads"]["x"], ref["x"][s])
        add("grad_gate", got["grads"]["gate"], ref["gate"][s])
        if case.name == "tutel":
            for name, g in expected_expert_grads(case.spec, ref, r["rank"]).items():
                add(f"grad_{name}", got["grads"][name], g)
    if case.name == "ted":
        ep = case.spec.world // tp
        El = case.spec.experts // ep
        for j in range(ep):
            group = [ranks[j * tp + i]["cases"][case.label]["grads"] for i in range(tp)]
            for name in ("w1", "b1", "w2", "b2"):
                total = sum(g[name] for g in group)
                whole = np.stack([ref["experts"][j * El + q][name] for q in range(El)])
                add(f"grad_{name}", total, whole.reshape(total.shape))
    return {k: d / max(scale, 1e-30) for k, (d, scale) in worst.items()}
