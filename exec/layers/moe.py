"""A real, deterministic MoE layer on torch.distributed, and its strategies.

Every rank holds T seeded tokens [T, M] and E/P of the E experts (FFN M -> H -> M); weights
are seeded per expert, so any process can rebuild any expert (a single-process reference
needs nothing from the run). The layer (GShard / Switch):

1. gate: softmax(x W_g) over the E experts, top-k choices per token (under a routing model,
   zipf or matrix, the choices are prescribed so that the kept tokens per (rank, expert) are
   the simulator's: `sim.workload.gate_plan`; the combine weights stay the gate's);
2. capacity: each expert takes at most C = ceil(k f T / E) tokens from each rank; slots are
   given out first to every token's first choice in token order, then to second choices, and
   so on; a choice that finds its expert full is dropped (it adds nothing to the output);
3. encode: tokens into the [E, C, M] dispatch buffer (empty slots are zero);
4. the strategy: dispatch all-to-all, experts on the received [E/P, P*C, M], combine
   all-to-all back to [E, C, M] (under a routing model, all-to-allv of the filled slots only,
   as the simulator's graph: `exec.layers.sparse`);
5. decode: y[t] = sum over kept choices of gate probability * expert output.

Strategies differ only in step 4 and are registered by name (`exec.layers.registry`), with the
same names and parameters as `sim.strategies`; a `token_level` one (`deepep`) replaces steps
3-5: it moves token rows (deduplicated) rather than capacity slots, for the same kept choices.
`pipelined` splits the capacity dimension into r chunks (chunk j = slots [jC/r, (j+1)C/r)) and
runs the communication on threads of its own, one per communication stream, in the issue order
`sim.strategies.chunking.comm_order` gives the simulator (tutel / alternating / two_streams);
each stream has its own process group. Its output equals `sequential`'s because every token row
goes through the same expert either way; the tests check it, forward and backward (autograd
through the all-to-alls; the backward all-to-alls run where autograd runs them, so the backward
is exact but not overlapped).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from exec.layers.registry import STRATEGIES, resolve_strategy
from exec.layers.sparse import Fill, SplitLog, exchange_counts, exchange_slots
from exec.layers.waits import wait_work
from sim.core.errors import ConfigError
from sim.workload.gate_plan import plan, token_choices
from sim.workload.moe import MoELayer, check_sizes, expert_capacity

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"gelu": F.gelu, "relu": F.relu}


@dataclass(frozen=True)
class MoESpec:
    """Sizes and seed of the layer; `tokens` is T per rank, `experts` E in total."""

    tokens: int
    model_dim: int
    hidden_dim: int
    experts: int
    world: int
    top_k: int = 1
    capacity_factor: float = 1.0
    activation: str = "gelu"
    seed: int = 0
    # per rank, choices per expert the gate makes (sim.workload.gate_plan); None: the gate's own
    demand: tuple[tuple[int, ...], ...] | None = None
    dropless: bool = False  # every choice kept: C is the largest demand (T under the gate's own)

    def __post_init__(self) -> None:
        check_sizes(
            "moe",
            {
                n: getattr(self, n)
                for n in ("tokens", "model_dim", "hidden_dim", "experts", "world", "top_k")
            },
            self.capacity_factor,
        )
        kT = self.top_k * self.tokens
        if self.demand is not None and (
            len(self.demand) != self.world
            or any(len(r) != self.experts or sum(r) != kT for r in self.demand)
        ):
            raise ConfigError(
                f"moe.demand: expected {self.world} rows of {self.experts} choice counts adding "
                f"up to k*T = {kT} (sim.workload.gate_plan)"
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"moe.activation: expected one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
            )

    @classmethod
    def from_layer(cls, layer: MoELayer, seed: int = 0, activation: str = "gelu") -> MoESpec:
        """The simulator's layer as a real one: under a routing model (zipf, matrix) the gate
        chooses experts as `sim.workload.gate_plan` says (the same kept counts); uniform
        routing (every buffer full whatever the routing) keeps the gate's own choices."""
        demand = None if layer.uniform else tuple(map(tuple, plan(layer).demand.tolist()))
        return cls(
            layer.tokens,
            layer.model_dim,
            layer.hidden_dim,
            layer.experts,
            layer.world,
            layer.top_k,
            layer.capacity_factor,
            activation,
            seed,
            demand,
            layer.dropless,
        )

    @property
    def local_experts(self) -> int:
        return self.experts // self.world

    @property
    def capacity(self) -> int:
        """C, as sim.workload.moe.MoELayer.capacity: slots per (rank, expert). Dropless: the
        largest demand, or under the gate's own choices T (an expert gets each token once at
        most), so that nothing is dropped whatever the gate picks."""
        if not self.dropless:
            return expert_capacity(self.tokens, self.experts, self.top_k, self.capacity_factor)
        if self.demand is None:
            return self.tokens
        return max(1, max(max(row) for row in self.demand))


# -- seeded data ------------------------------------------------------------------------------
# Distinct generator streams per purpose; 1_000_003 (prime) separates seeds.


def _gen(spec: MoESpec, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(spec.seed * 1_000_003 + stream)


def make_tokens(spec: MoESpec, rank: int) -> torch.Tensor:
    return torch.randn(spec.tokens, spec.model_dim, generator=_gen(spec, 1 + rank))


def make_output_grad(spec: MoESpec, rank: int) -> torch.Tensor:
    """A fixed upstream gradient dL/dy for backward checks: L = sum(y * this)."""
    return torch.randn(spec.tokens, spec.model_dim, generator=_gen(spec, 500_000 + rank))


def make_gate(spec: MoESpec) -> torch.Tensor:
    g = _gen(spec, 100_000)
    return torch.randn(spec.model_dim, spec.experts, generator=g) / math.sqrt(spec.model_dim)


def make_expert(spec: MoESpec, e: int) -> dict[str, torch.Tensor]:
    """Expert e's FFN: w1 [M, H], b1 [H], w2 [H, M], b2 [M]."""
    g = _gen(spec, 200_000 + e)
    M, H = spec.model_dim, spec.hidden_dim
    return {
        "w1": torch.randn(M, H, generator=g) / math.sqrt(M),
        "b1": torch.randn(H, generator=g) * 0.1,
        "w2": torch.randn(H, M, generator=g) / math.sqrt(H),
        "b2": torch.randn(M, generator=g) * 0.1,
    }


# -- gating, encode, decode -------------------------------------------------------------------


@dataclass
class Routing:
    """Per token and choice: expert, capacity slot (-1 where dropped), combine weight."""

    expert: torch.Tensor  # [T, k] int64
    slot: torch.Tensor  # [T, k] int64
    weight: torch.Tensor  # [T, k], the gate probabilities (differentiable)

    @property
    def kept(self) -> torch.Tensor:
        return self.slot >= 0


def route(
    x: torch.Tensor,
    gate: torch.Tensor,
    top_k: int,
    capacity: int,
    choices: torch.Tensor | None = None,
) -> Routing:
    """Top-k gating with capacity; `choices` [T, k] prescribes the experts (the weights are
    still the gate's probabilities of them)."""
    probs = torch.softmax(x @ gate, dim=-1)
    if choices is None:
        weight, expert = probs.topk(top_k, dim=-1)
    else:
        expert = choices
        weight = probs.gather(1, expert)
    T, E = probs.shape
    # GShard priority: all first choices (in token order), then all second choices, ...
    onehot = F.one_hot(expert.t().reshape(-1), E)  # [k*T, E], choice-major
    position = (onehot.cumsum(0) - 1).mul(onehot).sum(-1).view(top_k, T).t()
    slot = torch.where(position < capacity, position, torch.full_like(position, -1))
    return Routing(expert, slot, weight)


def encode(x: torch.Tensor, routing: Routing, experts: int, capacity: int) -> torch.Tensor:
    """The [E, C, M] dispatch buffer: token rows at their (expert, slot), zeros elsewhere."""
    token, choice = routing.kept.nonzero(as_tuple=True)
    flat = routing.expert[token, choice] * capacity + routing.slot[token, choice]
    buf = x.new_zeros(experts * capacity, x.shape[1]).index_add(0, flat, x[token])
    return buf.view(experts, capacity, x.shape[1])


def decode(out: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Weighted sum over each token's kept choices of its expert outputs in `out` [E, C, M]."""
    E, C, M = out.shape
    token, choice = routing.kept.nonzero(as_tuple=True)
    flat = routing.expert[token, choice] * C + routing.slot[token, choice]
    rows = out.reshape(E * C, M)[flat] * routing.weight[token, choice].unsqueeze(1)
    T = routing.expert.shape[0]
    return out.new_zeros(T, M).index_add(0, token, rows)


# -- communication -----------------------------------------------------------------------------


class Comms:
    """One process group per communication stream ('comm', 'comm.1'), created on every rank
    in the same order, so two streams never share a communicator."""

    STREAMS = ("comm", "comm.1")

    def __init__(self, rank: int, world: int, timeout_s: float, device: torch.device):
        from exec.runtime.timeouts import SETUP_TIMEOUT_S

        self.rank, self.world, self.timeout_s, self.device = rank, world, timeout_s, device
        # setup waits for the slowest rank; exchanges are bounded by timeout_s (exchange)
        timeout = timedelta(seconds=max(timeout_s, SETUP_TIMEOUT_S))
        self.groups = {s: dist.new_group(list(range(world)), timeout=timeout) for s in self.STREAMS}

    def exchange(self, x: torch.Tensor, stream: str, what: str) -> torch.Tensor:
        """all_to_all_single with equal splits over the first dimension (a multiple of P)."""
        x = x.contiguous()
        out = torch.empty_like(x)
        work = dist.all_to_all_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(
            work,
            self.rank,
            f"all_to_all for {what} (stream {stream})",
            list(range(self.world)),
            self.timeout_s,
        )
        return out

    def all_to_all(self, x: torch.Tensor, stream: str, what: str) -> torch.Tensor:
        """Differentiable: the gradient of an equal-split all-to-all is the same exchange."""
        return _AllToAll.apply(x, self, stream, what)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, comms: Comms, stream: str, what: str) -> torch.Tensor:
        ctx.comms, ctx.stream, ctx.what = comms, stream, what
        return comms.exchange(x, stream, what)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.comms.exchange(grad, ctx.stream, f"{ctx.what} (gradient)"), None, None, None


# -- the layer --------------------------------------------------------------------------------


class DistMoE(torch.nn.Module):
    """This rank's share of the layer: the (replicated) gate and its E/P experts."""

    def __init__(self, spec: MoESpec, rank: int, comms: Comms, device: torch.device):
        super().__init__()
        if spec.experts < spec.world:  # sliced experts: exec.layers.sliced.SlicedMoE
            raise ConfigError(
                f"moe.experts: {spec.experts} experts on {spec.world} ranks slice each expert; "
                f"this layer holds whole experts (exec.layers.layouts runs sliced layouts)"
            )
        self.spec, self.rank, self.comms = spec, rank, comms
        self.act = ACTIVATIONS[spec.activation]
        El = spec.local_experts
        experts = [make_expert(spec, rank * El + i) for i in range(El)]

        def stack(name: str, *shape: int) -> torch.nn.Parameter:
            t = torch.stack([e[name] for e in experts]).reshape(El, *shape)
            return torch.nn.Parameter(t.to(device))

        M, H = spec.model_dim, spec.hidden_dim
        self.gate = torch.nn.Parameter(make_gate(spec).to(device))
        self.w1, self.b1 = stack("w1", M, H), stack("b1", 1, H)
        self.w2, self.b2 = stack("w2", H, M), stack("b2", 1, M)
        self.choices = None
        if spec.demand is not None:
            c = token_choices(spec.demand[rank], spec.tokens, spec.top_k, spec.seed, rank)
            self.choices = torch.as_tensor(c, dtype=torch.long, device=device)
        self.fill: Fill | None = None  # this forward's filled slots (under a routing model)
        self.splits = SplitLog()  # rows per peer of every all-to-allv

    def forward(
        self, x: torch.Tensor, strategy: str = "sequential", params: dict | None = None
    ) -> tuple[torch.Tensor, Routing]:
        s = self.spec
        full = resolve_strategy(strategy, params or {})
        routing = route(x, self.gate, s.top_k, s.capacity, self.choices)
        self.splits = SplitLog()
        self.fill = None
        fn = STRATEGIES[strategy]
        if getattr(fn, "token_level", False):  # DeepEP: moves tokens, not slots; decodes itself
            return fn(self, x, routing, full), routing
        buf = encode(x, routing, s.experts, s.capacity)
        # all-to-allv: every rank learns what it will receive (not a `padded` layer's)
        if self.choices is not None and not getattr(fn, "padded", False):
            kept = routing.expert[routing.kept].cpu().numpy()
            send = np.bincount(kept, minlength=s.experts)
            self.fill = Fill(send, exchange_counts(self.comms, send, s.local_experts))
        out = fn(self, buf, full)
        return decode(out, routing), routing

    def exchange(
        self, x: torch.Tensor, lo: int, back: bool, stream: str, what: str, key: tuple | None
    ) -> torch.Tensor:
        """A chunk [E, c, M] of slots [lo, lo + c): dispatched (`back`: combined) as an equal
        all-to-all of the padded buffer, or under a routing model as an all-to-allv of its
        filled rows (logged under `key`, the simulator's (phase, step, chunk))."""
        if self.fill is None:
            return self.comms.all_to_all(x, stream, what)
        return exchange_slots(self.comms, x, self.fill, lo, back, stream, what, self.splits, key)

    def experts(self, received: torch.Tensor) -> torch.Tensor:
        """Expert FFNs on a received [E, c, M] buffer (from rank p: rows p*E/P .. for my
        experts), returned in the same layout for the combine exchange."""
        E, c, M = received.shape
        P, El = self.spec.world, self.spec.local_experts
        x = received.view(P, El, c, M).transpose(0, 1).reshape(El, P * c, M)
        h = self.act(torch.baddbmm(self.b1, x, self.w1))
        y = torch.baddbmm(self.b2, h, self.w2)
        return y.view(El, P, c, M).transpose(0, 1).reshape(E, c, M)
