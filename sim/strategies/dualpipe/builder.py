"""The task graph of a DualPipe / DualPipeV step: every device's chunk order
(`schedule.Pipeline.ops`), each chunk `layers` MoE layers of Megatron's nodes
(`sim.strategies.megatron_ep.nodes`) on the device's EP group, pairs overlapped layer by
layer as Megatron's merged schedule does, and point-to-point sends of activations (forward)
and their gradients (backward) between neighbouring stages.

Device d's EP group is graph ranks d*W .. d*W+W-1 (W = the layer's world); EP rank j of a
stage sends to EP rank j of the next. As in the reference code, a chunk (or pair) starts
once all its inputs have arrived, and its sends are issued after it: a NCCL send waits for
everything launched before it on the compute stream, so it waits for the whole pair. Each
(phase, forward/backward, send/receive) has its own stream, in micro-batch order on both
ends, so that unrelated transfers never queue behind each other.
"""

from __future__ import annotations

from typing import Any

from sim.core.graph import Task, TaskGraph
from sim.strategies.dualpipe.schedule import Pipeline, activation_peak
from sim.strategies.megatron_ep.memory import place_moe
from sim.strategies.megatron_ep.nodes import Emitter, LayerSpec
from sim.strategies.megatron_ep.schedule import Deferred, backward, forward, merged, weights


class _Device:
    def __init__(
        self,
        g: TaskGraph,
        pipe: Pipeline,
        spec: LayerSpec,
        dev: int,
        j: int,
        layers: int,
        shared_overlap: bool,
        act_bytes: float,
        dtype: str,
        block_ids: list[int] | None = None,
    ):
        self.g, self.pipe, self.dev, self.j, self.layers = g, pipe, dev, j, layers
        self.W, self.act_bytes = spec.world, act_bytes
        self.rank = dev * spec.world + j
        self.em = []
        self.tips: dict[str, str] = {}  # the op's last task per stream (both chunks')
        for phase in (0, 1):
            em = Emitter(g, spec, j, shared_overlap, dtype=dtype, prefix=f"c{phase}/")
            em.offset, em.tips, em.block_ids = dev * spec.world, self.tips, block_ids
            self.em.append(em)
        self.count = {(k, p): 0 for k in "FB" for p in (0, 1)}
        self.outputs: dict[tuple[int, int], list[str]] = {}  # last stage: loss inputs
        self.wq: list[Deferred] = []
        # DualPipeV's turn: stages PP/2-1 and PP/2 share a device, no transfer between them
        self.local: dict[tuple[str, int, int], list[str]] = {}

    # -- point-to-point -------------------------------------------------------------------
    def _p2p(
        self,
        kind: str,
        grad: bool,
        direction: int,
        stage: int,
        mb: int,
        peer_stage: int,
        phase: int,
        deps: list[str],
    ) -> str:
        peer_dev, _ = self.pipe.locate(direction, peer_stage)
        src, dst = (stage, peer_stage) if kind == "send" else (peer_stage, stage)
        what = "b" if grad else "f"
        t = Task(
            f"r{self.rank}/c{phase}/mb{mb}/pp/{what}{kind}",
            self.rank,
            f"comm.pp_{what}{phase}{kind[0]}",
            kind,
            deps=deps,
            bytes=self.act_bytes,
            peer=peer_dev * self.W + self.j,
            coll=f"pp/d{direction}/{what}/{src}-{dst}/mb{mb}/j{self.j}",
            tags={
                "phase": "bwd" if grad else "fwd",
                "step": f"pp_{what}{kind}",
                "micro": mb,
                "layer": -1,
            },
        )
        self.g.add(t)
        return t.id

    def _inputs(self, kind: str, phase: int) -> tuple[int, list[str]]:
        """The next micro-batch of (kind, phase) and what it waits for."""
        mb = self.count[(kind, phase)]
        self.count[(kind, phase)] += 1
        d, s = self.pipe.stage_of(self.dev, phase)
        if kind == "F":
            if s == 0:
                return mb, []
            if (key := ("F", s, mb)) in self.local:
                return mb, self.local.pop(key)
            return mb, [self._p2p("recv", False, d, s, mb, s - 1, phase, [])]
        if s == self.pipe.pp - 1:
            return mb, self.outputs.pop((phase, mb))
        if (key := ("B", s, mb)) in self.local:
            return mb, self.local.pop(key)
        return mb, [self._p2p("recv", True, d, s, mb, s + 1, phase, [])]

    def _send(self, kind: str, phase: int, mb: int, deps: list[str]) -> None:
        d, s = self.pipe.stage_of(self.dev, phase)
        nxt = s + 1 if kind == "F" else s - 1
        if kind == "F" and s == self.pipe.pp - 1:
            self.outputs[(phase, mb)] = deps
        elif 0 <= nxt < self.pipe.pp and self.pipe.locate(d, nxt)[0] == self.dev:
            self.local[(kind, nxt, mb)] = deps
        elif kind == "F":
            self._p2p("send", False, d, s, mb, s + 1, phase, deps)
        elif s > 0:
            self._p2p("send", True, d, s, mb, s - 1, phase, deps)

    # -- ops ------------------------------------------------------------------------------
    def _tip(self, out: list[str]) -> list[str]:
        """A send issued now waits for the output and for everything launched so far on the
        compute streams (the stream a NCCL call waits on at launch)."""
        return out + [t for s, t in self.tips.items() if s.startswith("compute") and t not in out]

    def run(self, op: tuple) -> None:
        L = self.layers
        self.tips.clear()
        if op[0] == "W":
            weights(self.wq.pop(0))
        elif op[0] == "F":
            p = op[1]
            mb, x = self._inputs("F", p)
            out = forward(self.em[p], mb, L, x)
            self._send("F", p, mb, self._tip(out))
        elif op[0] == "B":
            p, zb = op[1], op[2]
            mb, gin = self._inputs("B", p)
            defer: Deferred | None = [] if zb else None
            out = backward(self.em[p], mb, L, gin, defer)
            if defer is not None:
                self.wq.append(defer)
            self._send("B", p, mb, self._tip(out))
        else:  # a pair starts when both inputs are in; its sends wait for all of it
            pf, pb = op[1], op[2]
            fmb, x = self._inputs("F", pf)
            bmb, gin = self._inputs("B", pb)
            xo, go = merged(self.em[pf], fmb, bmb, L, x + gin, gin + x, em_b=self.em[pb])
            self._send("F", pf, fmb, self._tip(xo + go))
            self._send("B", pb, bmb, self._tip(go + xo))


def build_pipeline(
    pipe: Pipeline,
    spec: LayerSpec,
    layers: int,
    shared_overlap: bool,
    act_bytes: float,
    dtype: str,
    meta: dict[str, Any],
    block_ids: list[int] | None = None,
) -> TaskGraph:
    W = spec.world
    peaks = [activation_peak(pipe.ops(d)) for d in range(pipe.devices)]
    g = TaskGraph(
        pipe.devices * W,
        meta=meta
        | {
            "variant": pipe.variant,
            "pp": pipe.pp,
            "devices": pipe.devices,
            "micro": pipe.micro,
            "memory": {"param_chunks": 2, "activation_chunks": max(peaks)},
        },
    )
    for dev in range(pipe.devices):
        for j in range(W):
            d = _Device(g, pipe, spec, dev, j, layers, shared_overlap, act_bytes, dtype, block_ids)
            for op in pipe.ops(dev):
                d.run(op)
            assert not (d.wq or d.outputs or d.local), "schedule left work behind"
    place_moe(g, spec.tensors, ("fwd", "bwd"))
    g.validate()
    return g
