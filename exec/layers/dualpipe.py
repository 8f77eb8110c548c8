"""DualPipe and DualPipeV for real (gloo or NCCL): each process is one pipeline device, the
chunks (pipeline stages) it holds are real transformer blocks with a local MoE layer (the
device's EP group is itself), activations and their gradients travel by point-to-point
send / receive, and every device runs the op list the simulator's graph is built from
(`sim.strategies.dualpipe.schedule.Pipeline.ops`): forward chunks, backward chunks (input
gradients and weight gradients together, or the weight gradients (W) deferred to a FIFO when
zero-bubble), W ops, and forward/backward pairs.

As in the simulator's builder (`sim.strategies.dualpipe.builder`): a chunk (or pair) starts
once its inputs have arrived (a blocking receive; the turn of DualPipeV's V, two stages on
one device, hands the tensor over in memory), and its sends are issued after it, without
waiting (the receiver waits). DualPipe runs the same model in both directions: device d
holds a copy of stages h and PP-1-h, and the gradients of a stage's two copies add up (the
tests sum them; a trainer all-reduces them). Direction 0 carries the first half of the
micro-batches, direction 1 the second.

A pair runs its forward chunk, then its backward chunk: on one CPU they share the cores, and
with no EP group there is no all-to-all for the pair to hide (`exec.layers.ep_overlap` runs
that overlap). The outputs and gradients equal the sequential model's (every micro-batch
through the stages in order, plain autograd): `sequential` here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from exec.layers.block import BlockSpec, block, make_attention, make_shared
from exec.layers.ep_overlap import layer_spec, micro_spec
from exec.layers.grads import grad_of
from exec.layers.moe import (
    ACTIVATIONS,
    decode,
    encode,
    make_expert,
    make_gate,
    make_output_grad,
    make_tokens,
    route,
)
from exec.layers.nodes import Node
from exec.layers.registry import register_schedule
from exec.layers.waits import wait_work
from sim.strategies.dualpipe.schedule import Pipeline

Weights = list[dict[str, torch.Tensor]]  # per block of a stage


def stage_weights(spec: BlockSpec, stage: int, layers: int) -> Weights:
    """A stage's blocks: attention, gate and every expert (stacked), seeded per block."""
    out = []
    for i in range(layers):
        s = layer_spec(spec, stage * layers + i).moe
        ex = [make_expert(s, e) for e in range(s.experts)]
        bs = layer_spec(spec, stage * layers + i)
        w = {**make_attention(bs), **make_shared(bs), "gate": make_gate(s)}
        w.update({k: torch.stack([e[k] for e in ex]) for k in ("w1", "b1", "w2", "b2")})
        out.append({k: v.requires_grad_(True) for k, v in w.items()})
    return out


def stage_forward(x: torch.Tensor, ws: Weights, spec: BlockSpec) -> torch.Tensor:
    """The stage's blocks on x: attention, then the MoE layer with all experts here."""
    s = spec.moe
    act = ACTIVATIONS[s.activation]
    for w in ws:

        def moe(z: torch.Tensor, w: dict = w) -> torch.Tensor:
            r = route(z, w["gate"], s.top_k, s.capacity)
            buf = encode(z, r, s.experts, s.capacity)
            h = act(buf @ w["w1"] + w["b1"].unsqueeze(1))
            return decode(h @ w["w2"] + w["b2"].unsqueeze(1), r)

        x = block(x, w, spec, moe)
    return x


def micro_data(spec: BlockSpec, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global micro-batch m's tokens and output gradient (loss = sum(y * dy))."""
    s = micro_spec(spec, m).moe
    return make_tokens(s, 0), make_output_grad(s, 0)


class Device:
    """One pipeline device running its op list (module docstring)."""

    def __init__(self, pipe: Pipeline, dev: int, spec: BlockSpec, layers: int, timeout_s: float):
        self.pipe, self.dev, self.spec, self.timeout_s = pipe, dev, spec, timeout_s
        self.where = [pipe.stage_of(dev, p) for p in (0, 1)]  # (direction, stage) per phase
        self.weights = [stage_weights(spec, s, layers) for _, s in self.where]
        self.count = {(k, p): 0 for k in "FB" for p in (0, 1)}
        self.nodes: dict[tuple[int, int], Node] = {}  # (phase, mb) -> the chunk's forward
        self.local: dict[tuple[str, int, int, int], torch.Tensor] = {}  # DualPipeV's turn
        self.sends: list[Any] = []
        self.wq: list[Node] = []  # zero-bubble: backward chunks whose W waits
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}  # (direction, mb) -> y

    # -- point-to-point -------------------------------------------------------------------
    def _tag(self, direction: int, grad: bool, src: int, mb: int) -> int:
        return ((direction * 2 + grad) * self.pipe.pp + src) * self.pipe.micro + mb

    def _peer(self, direction: int, stage: int) -> int:
        return self.pipe.locate(direction, stage)[0]

    def _recv(self, direction: int, grad: bool, src: int, mb: int) -> torch.Tensor:
        s = self.spec.moe
        buf = torch.empty(s.tokens, s.model_dim)
        peer = self._peer(direction, src)
        work = dist.irecv(buf, src=peer, tag=self._tag(direction, grad, src, mb))
        what = f"recv of {'gradient' if grad else 'activation'} {mb} from stage {src}"
        wait_work(work, self.dev, what, [peer], self.timeout_s)
        return buf

    def _send(self, kind: str, phase: int, mb: int, t: torch.Tensor) -> None:
        d, s = self.where[phase]
        nxt = s + 1 if kind == "F" else s - 1
        if kind == "F" and s == self.pipe.pp - 1:
            self.outputs[(d, mb)] = t
        elif kind == "B" and s == 0:
            return  # the input gradient of the data: nobody needs it
        elif self._peer(d, nxt) == self.dev:
            self.local[(kind, d, nxt, mb)] = t
        else:
            tag = self._tag(d, kind == "B", s, mb)
            self.sends.append(dist.isend(t.contiguous(), dst=self._peer(d, nxt), tag=tag))

    def _input(self, kind: str, phase: int) -> tuple[int, torch.Tensor]:
        mb = self.count[(kind, phase)]
        self.count[(kind, phase)] += 1
        d, s = self.where[phase]
        if kind == "F" and s == 0:
            return mb, micro_data(self.spec, d * self.pipe.per_phase + mb)[0]
        if kind == "B" and s == self.pipe.pp - 1:
            return mb, micro_data(self.spec, d * self.pipe.per_phase + mb)[1]
        if (key := (kind, d, s, mb)) in self.local:
            return mb, self.local.pop(key)
        return mb, self._recv(d, kind == "B", s - 1 if kind == "F" else s + 1, mb)

    # -- chunks ---------------------------------------------------------------------------
    def forward(self, phase: int, mb: int, x: torch.Tensor) -> torch.Tensor:
        ws = self.weights[phase]
        node = self.nodes[(phase, mb)] = Node([t for w in ws for t in w.values()])
        return node.forward(lambda x: (stage_forward(x, ws, self.spec),), (x,))[0]

    def backward(self, phase: int, mb: int, g: torch.Tensor, zero_bubble: bool) -> torch.Tensor:
        node = self.nodes.pop((phase, mb))
        (gx,) = node.backward((g,))
        assert gx is not None  # a stage's output depends on its input
        if zero_bubble:
            self.wq.append(node)
        else:
            node.weights()
        return gx

    def run(self, op: tuple) -> None:
        if op[0] == "W":
            self.wq.pop(0).weights()
        elif op[0] == "F":
            mb, x = self._input("F", op[1])
            self._send("F", op[1], mb, self.forward(op[1], mb, x))
        elif op[0] == "B":
            mb, g = self._input("B", op[1])
            self._send("B", op[1], mb, self.backward(op[1], mb, g, op[2]))
        else:  # a pair: both inputs in, forward then backward, then both sends
            pf, pb = op[1], op[2]
            fmb, x = self._input("F", pf)
            bmb, g = self._input("B", pb)
            y = self.forward(pf, fmb, x)
            gx = self.backward(pb, bmb, g, False)
            self._send("F", pf, fmb, y)
            self._send("B", pb, bmb, gx)

    def finish(self) -> None:
        for w in self.sends:
            wait_work(w, self.dev, "send", [], self.timeout_s)
        assert not (self.wq or self.nodes or self.local), "the schedule left work behind"


@register_schedule("dualpipe")
def dualpipe_job(
    rank: int, world: int, spec: BlockSpec, params: dict[str, Any], timeout_s: float, backend: str
) -> dict[str, Any]:
    """One device: its op list; the last stages' outputs and every chunk's weight gradients
    (keyed by stage) as numpy."""
    pipe = Pipeline(params["variant"], params["pp"], params["micro"])
    layers = params.get("layers") or 1
    if pipe.devices != world:
        from exec.errors import ExecError

        raise ExecError(
            f"{pipe.variant} on {pipe.pp} stages needs {pipe.devices} processes, got {world}"
        )
    d = Device(pipe, rank, spec, layers, timeout_s)
    ran: dict[str, int] = {}
    for op in pipe.ops(rank):
        d.run(op)
        kind = op[0] + ("zb" if op[0] == "B" and op[2] else "")
        ran[kind] = ran.get(kind, 0) + 1
    ran["sends"] = len(d.sends)
    d.finish()
    grads = {}
    for (_, s), ws in zip(d.where, d.weights):
        for i, w in enumerate(ws):
            grads.update({f"{s}.{i}.{k}": grad_of(v).numpy().copy() for k, v in w.items()})
    ys = {f"{dr}/{mb}": y.numpy() for (dr, mb), y in d.outputs.items()}
    return {"rank": rank, "y": ys, "grads": grads, "ops": ran}


def run_dualpipe(
    spec: BlockSpec, params: dict[str, Any], timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """Every device's results on local gloo processes (one per device)."""
    from exec.runtime.launch import call_ranks
    from sim.strategies import resolve_params

    full = resolve_params("dualpipe", params)
    if full["micro"] is None:
        full["micro"] = 2 * full["pp"]
    pipe = Pipeline(full["variant"], full["pp"], full["micro"])
    return call_ranks(dualpipe_job, (spec, full, timeout_s, "gloo"), pipe.devices, "gloo")


def sequential(spec: BlockSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The reference in one process: every micro-batch through the stages in order."""
    pipe = Pipeline(params["variant"], params["pp"], params["micro"])
    layers = params.get("layers") or 1
    stages = [stage_weights(spec, s, layers) for s in range(pipe.pp)]
    ys = {}
    for m in range(pipe.micro):
        x, dy = micro_data(spec, m)
        for ws in stages:
            x = stage_forward(x, ws, spec)
        (x * dy).sum().backward()
        ys[f"{m // pipe.per_phase}/{m % pipe.per_phase}"] = x.detach().numpy()
    grads = {
        f"{s}.{i}.{k}": grad_of(v).numpy()
        for s, ws in enumerate(stages)
        for i, w in enumerate(ws)
        for k, v in w.items()
    }
    return {"y": ys, "grads": grads}
