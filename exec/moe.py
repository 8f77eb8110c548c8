"""A real, deterministic MoE layer on torch.distributed, and its strategies.

Every rank holds T seeded tokens [T, M] and E/P of the E experts (FFN M -> H -> M); weights
are seeded per expert, so any process can rebuild any expert (a single-process reference
needs nothing from the run). The layer (GShard / Switch):

1. gate: softmax(x W_g) over the E experts, top-k choices per token;
2. capacity: each expert takes at most C = ceil(k f T / E) tokens from each rank; slots are
   given out first to every token's first choice in token order, then to second choices, and
   so on; a choice that finds its expert full is dropped (it adds nothing to the output);
3. encode: tokens into the [E, C, M] dispatch buffer (empty slots are zero);
4. the strategy: dispatch all-to-all, experts on the received [E/P, P*C, M], combine
   all-to-all back to [E, C, M];
5. decode: y[t] = sum over kept choices of gate probability * expert output.

Strategies differ only in step 4 and are registered by name (`STRATEGIES`), with the same
names and parameters as `sim.strategies`. `pipelined` splits the capacity dimension into r
chunks (chunk j = slots [jC/r, (j+1)C/r)) and runs the communication on threads of its own,
one per communication stream, in the issue order `sim.strategies.moe.comm_order` gives the
simulator (tutel / alternating / two_streams); each stream has its own process group. Its
output equals `sequential`'s because every token row goes through the same expert either
way; the tests check it, forward and backward (autograd through the all-to-alls; the backward
all-to-alls run where autograd runs them, so the backward is exact but not overlapped).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from exec.errors import ExecError
from sim.errors import ConfigError
from sim.strategies import resolve_params
from sim.strategies.moe import comm_order
from sim.workload import MoELayer, check_sizes, expert_capacity

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"gelu": F.gelu, "relu": F.relu}
_POLL_S = 0.05


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

    def __post_init__(self) -> None:
        check_sizes(
            "moe",
            {
                n: getattr(self, n)
                for n in ("tokens", "model_dim", "hidden_dim", "experts", "world", "top_k")
            },
            self.capacity_factor,
        )
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"moe.activation: expected one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
            )

    @classmethod
    def from_layer(cls, layer: MoELayer, seed: int = 0, activation: str = "gelu") -> MoESpec:
        """The simulator's layer as a real one (its routing model is replaced by a real gate)."""
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
        )

    @property
    def local_experts(self) -> int:
        return self.experts // self.world

    @property
    def capacity(self) -> int:
        """C, as sim.workload.MoELayer.capacity: slots per (rank, expert)."""
        return expert_capacity(self.tokens, self.experts, self.top_k, self.capacity_factor)


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


def route(x: torch.Tensor, gate: torch.Tensor, top_k: int, capacity: int) -> Routing:
    probs = torch.softmax(x @ gate, dim=-1)
    weight, expert = probs.topk(top_k, dim=-1)
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


def wait_work(work: Any, rank: int, what: str, peers: list[int], timeout_s: float) -> None:
    """Wait for an async collective within the timeout; fail naming the rank, the operation
    and its peers, never hang."""
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        ok, err = False, e
    else:
        err = None
    if not ok:
        why = f"failed: {str(err).strip().splitlines()[0]}" if err else ""
        if err is None or "timed out" in str(err).lower():
            why = f"did not complete within {timeout_s:g} s"
        raise ExecError(f"rank {rank}: {what} (peers {peers}) {why}")


class Comms:
    """One process group per communication stream ('comm', 'comm.1'), created on every rank
    in the same order, so two streams never share a communicator."""

    STREAMS = ("comm", "comm.1")

    def __init__(self, rank: int, world: int, timeout_s: float, device: torch.device):
        from exec.launch import SETUP_TIMEOUT_S

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
        if spec.experts < spec.world:  # sliced experts: exec.moe_layouts.SlicedMoE
            raise ConfigError(
                f"moe.experts: {spec.experts} experts on {spec.world} ranks slice each expert; "
                f"this layer holds whole experts (exec.moe_layouts runs sliced layouts)"
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

    def forward(
        self, x: torch.Tensor, strategy: str = "sequential", params: dict | None = None
    ) -> tuple[torch.Tensor, Routing]:
        s = self.spec
        full = resolve_strategy(strategy, params or {})
        routing = route(x, self.gate, s.top_k, s.capacity)
        buf = encode(x, routing, s.experts, s.capacity)
        out = STRATEGIES[strategy](self, buf, full)
        return decode(out, routing), routing

    def experts(self, received: torch.Tensor) -> torch.Tensor:
        """Expert FFNs on a received [E, c, M] buffer (from rank p: rows p*E/P .. for my
        experts), returned in the same layout for the combine exchange."""
        E, c, M = received.shape
        P, El = self.spec.world, self.spec.local_experts
        x = received.view(P, El, c, M).transpose(0, 1).reshape(El, P * c, M)
        h = self.act(torch.baddbmm(self.b1, x, self.w1))
        y = torch.baddbmm(self.b2, h, self.w2)
        return y.view(El, P, c, M).transpose(0, 1).reshape(E, c, M)


# -- strategies -------------------------------------------------------------------------------

Strategy = Callable[[DistMoE, torch.Tensor, dict[str, Any]], torch.Tensor]
STRATEGIES: dict[str, Strategy] = {}


def register(name: str) -> Callable[[Strategy], Strategy]:
    """Add an executor strategy; `name` and its parameters are those of sim.strategies."""

    def add(fn: Strategy) -> Strategy:
        STRATEGIES[name] = fn
        return fn

    return add


def resolve_strategy(name: str, params: dict[str, Any]) -> dict[str, Any]:
    full = resolve_params(name, params)  # the simulator's defaults and parameter checks
    if name not in STRATEGIES:
        raise ExecError(
            f"strategy {name!r} has no real-layer implementation yet (have: {sorted(STRATEGIES)})"
        )
    return full


@register("sequential")
def sequential(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    received = moe.comms.all_to_all(buf, "comm", "dispatch")
    return moe.comms.all_to_all(moe.experts(received), "comm", "combine")


@register("pipemoe")
def pipemoe(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """PipeMoE is the pipelined layer at the degree its selector picked (sim side)."""
    if not isinstance(params["degree"], int):
        raise ConfigError(
            "strategy pipemoe in the real layer needs an integer strategy.degree (the "
            "selector runs in the simulator: `moesim simulate` reports the degree it chose)"
        )
    return pipelined(moe, buf, params)


@register("tutel")
def tutel(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Tutel's pipelining at its chosen degree (the all-to-all algorithm changes how bytes
    travel, not what arrives: the real layer uses one all_to_all for either)."""
    return pipelined(moe, buf, {**params, "order": "tutel"})


class _Aborted(Exception):
    """Another thread of the layer failed; this one stops quietly."""


def _wait(event: threading.Event, abort: threading.Event) -> None:
    while not event.wait(_POLL_S):
        if abort.is_set():
            raise _Aborted


@register("pipelined")
def pipelined(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    r, order = params["degree"], params["order"]
    C = buf.shape[1]
    if not isinstance(r, int) or not 1 <= r <= C:
        raise ConfigError(f"strategy.degree: expected 1..C={C} chunks, got {r!r}")
    bounds = [C * j // r for j in range(r + 1)]
    plan = comm_order(r, order)
    received: dict[int, torch.Tensor] = {}
    expert_out: dict[int, torch.Tensor] = {}
    combined: dict[int, torch.Tensor] = {}
    arrived = [threading.Event() for _ in range(r)]
    computed = [threading.Event() for _ in range(r)]
    abort = threading.Event()
    errors: list[BaseException] = []
    grad_mode, n_threads = torch.is_grad_enabled(), torch.get_num_threads()

    def comm_stream(stream: str) -> None:
        torch.set_grad_enabled(grad_mode)  # both are per thread
        torch.set_num_threads(n_threads)
        try:
            for what, j, s in plan:
                if s != stream:
                    continue
                if what == "first":
                    chunk = buf[:, bounds[j] : bounds[j + 1]]
                    received[j] = moe.comms.all_to_all(chunk, stream, f"dispatch chunk {j}")
                    arrived[j].set()
                else:
                    _wait(computed[j], abort)
                    combined[j] = moe.comms.all_to_all(expert_out[j], stream, f"combine chunk {j}")
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - re-raised by the compute thread
            errors.append(e)
            abort.set()

    threads = [
        threading.Thread(target=comm_stream, args=(s,), name=f"moe:{s}", daemon=True)
        for s in dict.fromkeys(s for _, _, s in plan)
    ]
    for th in threads:
        th.start()
    try:
        for j in range(r):  # the compute stream: expert chunks as their dispatch arrives
            _wait(arrived[j], abort)
            expert_out[j] = moe.experts(received[j])
            computed[j].set()
    except _Aborted:
        pass
    except BaseException:
        abort.set()
        raise
    while any(th.is_alive() for th in threads) and not abort.is_set():
        for th in threads:
            th.join(_POLL_S)
    if errors:
        raise errors[0]
    return torch.cat([combined[j] for j in range(r)], dim=1)


# -- running it on every rank ----------------------------------------------------------------


@dataclass
class Variant:
    """One strategy with its parameters; `label` names it in results."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}({inner})"


def moe_job(
    rank: int,
    world: int,
    spec: MoESpec,
    variants: list[Variant],
    timeout_s: float,
    backward: bool,
    backend: str,
) -> dict[str, Any]:
    """One rank: run every variant on the same tokens and weights; return numpy results."""
    if spec.world != world:
        raise ExecError(f"the MoE layer is for {spec.world} ranks but {world} were started")
    device = (
        torch.device("cuda", rank % torch.cuda.device_count())
        if backend == "nccl"
        else torch.device("cpu")
    )
    comms = Comms(rank, world, timeout_s, device)
    moe = DistMoE(spec, rank, comms, device)
    x0 = make_tokens(spec, rank).to(device)
    dy = make_output_grad(spec, rank).to(device)
    results: dict[str, Any] = {}
    for v in variants:
        moe.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(backward)
        t0 = time.perf_counter()
        with torch.set_grad_enabled(backward):
            y, routing = moe(x, v.name, v.params)
        t1 = time.perf_counter()
        rec: dict[str, Any] = {
            "y": y.detach().cpu().numpy(),
            "expert": routing.expert.cpu().numpy(),
            "slot": routing.slot.cpu().numpy(),
            "weight": routing.weight.detach().cpu().numpy(),
            "forward_s": t1 - t0,
        }
        if backward:
            (y * dy).sum().backward()
            rec["backward_s"] = time.perf_counter() - t1
            rec["grads"] = {
                n: p.grad.detach().cpu().numpy() for n, p in [("x", x), *moe.named_parameters()]
            }
        results[v.label] = rec
    return {"rank": rank, "x": x0.cpu().numpy(), "variants": results}


@dataclass
class MoERun:
    """Every rank's results (rank order), per variant label."""

    spec: MoESpec
    ranks: list[dict[str, Any]]

    def output(self, label: str) -> np.ndarray:
        """y of all ranks stacked: [P, T, M]."""
        return np.stack([r["variants"][label]["y"] for r in self.ranks])

    def max_abs_diff(self, label: str, base: str = "sequential") -> dict[str, float]:
        """max |label - base| over outputs and (if run) each gradient, over all ranks."""
        return {k: d for k, (d, _) in self._diffs(label, base).items()}

    def max_rel_diff(self, label: str, base: str = "sequential") -> dict[str, float]:
        """max |label - base| / max |base| per quantity: float32 rounding grows with the
        magnitude of sums (weight gradients add over tokens), so compare it relatively."""
        return {k: d / max(scale, 1e-30) for k, (d, scale) in self._diffs(label, base).items()}

    def _diffs(self, label: str, base: str) -> dict[str, tuple[float, float]]:
        y, y0 = self.output(label), self.output(base)
        out = {"y": (float(np.abs(y - y0).max()), float(np.abs(y0).max()))}
        for r in self.ranks:
            a, b = r["variants"][label], r["variants"][base]
            for name, g in a.get("grads", {}).items():
                g0 = b["grads"][name]
                d, scale = out.get(f"grad_{name}", (0.0, 0.0))
                out[f"grad_{name}"] = (
                    max(d, float(np.abs(g - g0).max())),
                    max(scale, float(np.abs(g0).max())),
                )
        return out


def run_moe(
    spec: MoESpec,
    variants: list[Variant],
    nprocs: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    backward: bool = True,
) -> MoERun:
    """Run the layer with each variant on `nprocs` local processes (spec.world of them)."""
    from exec.launch import call_ranks

    if spec.world != nprocs:
        raise ExecError(
            f"the MoE layer is for {spec.world} ranks but {nprocs} processes were asked for"
        )
    ranks = call_ranks(
        moe_job, (spec, variants, timeout_s, backward, backend), nprocs, backend, timeout_s
    )
    return MoERun(spec, ranks)


from exec import (  # noqa: E402, F401 - strategies registered in modules of their own
    moe_fastermoe,  # "fastermoe"
    moe_layouts,  # "ted", and "tutel" wrapped for sliced experts (P1 / P2)
    moe_mpipemoe,  # "mpipemoe"
)
