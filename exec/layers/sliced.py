"""Tutel's P1 / P2 in the real layer: fewer experts E than ranks W (`SlicedMoE`).

Expert e is sliced over ranks e*n .. e*n+n-1 (n = W/E). Rank e*n+i stores the i-th slice of
e's hidden units (w1[:, s_i], b1[s_i], w2[s_i, :]) and the i-th slice of its output bias
(b2[m_i]): one placement for both parallel modes, so switching costs nothing (Tutel Sec. 3.2).
P1 all-gathers the expert from the slices (`_GatherExpert`; the gradient is reduce-scattered
back) and runs it on C/n of every rank's slots; P2 repeats the buffer n times, runs each
slice on all slots and sums the n partial outputs (each slice adds its part of b2).

`tutel`'s executor entry is wrapped here: sliced layers take the P1 / P2 path, everything
else (E >= W, where P1 and P2 are plain expert parallelism) the original one. The
simulator's side is `sim.strategies.tutel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from exec.layers.moe import (
    ACTIVATIONS,
    Comms,
    MoESpec,
    Routing,
    decode,
    encode,
    make_expert,
    make_gate,
    route,
)
from exec.layers.pipelined import pipelined
from exec.layers.pipelined import tutel as _tutel_ep  # whole experts, wrapped below
from exec.layers.registry import STRATEGIES, register, resolve_strategy
from exec.layers.shapes import expert_slices, pad_capacity, sim_layer
from sim.core.errors import ConfigError
from sim.strategies.tutel import route_parallel
from sim.workload.slicing import aligned

if TYPE_CHECKING:
    from exec.layers.group_comms import GroupComms, LayoutComms


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
        hs, ms = expert_slices(spec, n, rank % n)
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

        virtual = pad_capacity(buf, n * c).reshape(
            W, c, M
        )  # virtual expert e*n+i: slot range i of e
        out = pipelined(_Proxy(self.comms, experts), virtual, {**params, "order": "tutel"})
        return out.reshape(E, n * c, M)[:, :C]

    def p2(self, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        """EP + MP: the buffer repeated n times (copy i to slice i of each expert); every
        slice runs all slots; the n partial outputs are summed."""
        E, C, M = buf.shape
        n, W = self.n, self.spec.world
        _, ms = expert_slices(self.spec, n, self.rank % n)
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

    def exchange(self, x: torch.Tensor, lo: int, back: bool, stream: str, what: str, key: Any):
        """Sliced layouts exchange the padded buffer (their routing is the gate's own)."""
        return self.comms.all_to_all(x, stream, what)


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


@register("sliced")  # strategy tutel's real layer (sim.strategies.tutel)
def tutel(moe: Any, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Tutel with switchable parallelism: P1 / P2 (or the inline router's pick) on a sliced
    layer; on E >= W ranks every choice is plain expert parallelism (the original entry)."""
    if not isinstance(moe, SlicedMoE):
        return _tutel_ep(moe, buf, params)
    choice = params["parallel"]
    if choice == "auto":
        choice = route_parallel(sim_layer(moe.spec))
    if choice == "p1":
        return moe.p1(buf, params)
    if choice == "p2":
        return moe.p2(buf, params)
    raise ConfigError(
        f"strategy.parallel: {choice!r} on {moe.spec.experts} experts over {moe.spec.world} "
        f"ranks: sliced experts run 'p1', 'p2' or 'auto'"
    )


# Tutel exchanges its padded [E, C, M] buffer whatever the routing: DistMoE.forward plans no
# all-to-allv of the filled rows for it (equal all-to-alls of the whole capacity)
tutel.padded = True  # type: ignore[attr-defined]
