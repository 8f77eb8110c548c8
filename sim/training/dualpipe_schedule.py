"""DualPipe's and DualPipeV's order as the training step's task graph (the recipe's
`pipeline`, `sim.training.pipeline_kind`), in the style of `sim.training.pipeline.step_graph`:
one representative GPU per pipeline device, its two chunks' passes as chains of timed phases
(compute on the compute stream, EP collectives on the communication stream), activations and
their gradients sent between devices.

Each device runs its published order (`sim.strategies.dualpipe.schedule.device_ops`, the
DeepSeek-V3 report's Sec. 3.2.1 and github.com/deepseek-ai/DualPipe), op by op:
- F: a forward of a chunk (the next micro-batch of that chunk);
- B: a backward; where the order runs it zero-bubble, only its input gradient: each compute
  phase less its weight-gradient GEMMs (`Phase.wgrad`: half of a GEMM's backward), which wait
  in a FIFO for the next W;
- W: the weight gradients of the oldest deferred B, one compute task;
- F&B: a forward and a backward of two micro-batches (of either chunk) issued phase by phase
  in turn, so that one's EP all-to-all runs beside the other's compute, slowing it by the
  SMs the collectives hold while they run (`Phase.hold`), as `step_graph` merges
  Megatron's combined 1F1B pairs; without EP overlap the two run one after the other.

A pass waits for its input: the previous stage's activations (the next stage's gradient for a
backward, and its own forward), received from the device that holds that stage, or taken
locally where the same device holds it (DualPipeV's turn: stages pp-1 and pp). Receives are
posted ahead, in the order the device consumes them, on a stream per (chunk, activations or
gradients): each has one source, which sends in the same micro-batch order, so no receive
waits behind one that needs a later send. Sends go out on one stream in the order the device
makes them (the reference code's one communicator; eight streams in all, within the
hardware queues, `costs.resources.max_connections`). As in the reference code (and
`sim.strategies.dualpipe.builder`), an op starts once all its inputs are in, a pair once
both passes' are, and its sends wait for the whole op, without blocking the next op (the
reference code's asynchronous isend / irecv). The distributed optimizer's gathers come
before a chunk's first forward, its gradient reduce-scatters after the chunk's last weight
gradient, and the optimizer step after both chunks' reduce-scatters.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace

from sim.core.graph import TaskGraph
from sim.strategies.dualpipe.schedule import Op, Pipeline
from sim.training.pipeline import Phase, StagePrograms, _emit_chains, _Emitter


def dualpipe_graph(
    stages: list[StagePrograms],
    ranks: list[int],
    world: int,
    pipe: Pipeline,
    p2p_s: float,
    overlap: bool,
) -> TaskGraph:
    """The step's graph over one GPU per pipeline device (`ranks[d]`; `stages[d]`: its two
    chunks' programs, chunk = the schedule's phase), `pipe` the schedule (its devices are
    `len(stages)`)."""
    assert pipe.devices == len(stages) == len(ranks), "one program per device"
    meta = {"step": "training", "pp": pipe.devices, "vp": 1, "micro": pipe.micro}
    g = TaskGraph(world, meta=meta | {"pipeline": pipe.variant, "stages": pipe.pp})
    em = [_Emitter(g, ranks[d], d) for d in range(pipe.devices)]
    recvs = _post_receives(pipe, em, ranks, p2p_s)
    for d in range(pipe.devices):
        _Device(pipe, d, stages[d], em[d], ranks, recvs, p2p_s, overlap).run()
    return g


def _consumed(op: Op) -> list[tuple[str, int]]:
    """The (F | B, chunk) passes an op runs, in order."""
    if op[0] == "FB":
        return [("F", op[1]), ("B", op[2])]
    return [(op[0], op[1])] if op[0] in ("F", "B") else []


def _post_receives(
    pipe: Pipeline, em: list[_Emitter], ranks: list[int], p2p_s: float
) -> dict[tuple[int, str, int, int], str]:
    """A receive task for every pass whose input another device makes, posted in the order
    the device runs its passes; (device, F | B, chunk, micro-batch) -> its id."""
    out = {}
    for d in range(pipe.devices):
        count: Counter[tuple[str, int]] = Counter()
        for op in pipe.ops(d):
            for kind, p in _consumed(op):
                mb = count[(kind, p)]
                count[(kind, p)] += 1
                direction, stage = pipe.stage_of(d, p)
                src = stage - 1 if kind == "F" else stage + 1
                if not 0 <= src < pipe.pp:
                    continue
                src_dev = pipe.locate(direction, src)[0]
                if src_dev == d:
                    continue
                out[(d, kind, p, mb)] = em[d].task(
                    f"recv.{kind}{mb}.c{p}",
                    f"comm.r{kind.lower()}{p}",
                    "recv",
                    p2p_s,
                    [],
                    peer=ranks[src_dev],
                    coll=f"p2p.d{direction}.{kind}.{mb}.{src}",
                )
    return out


class _Device:
    """One device's ops laid out in order."""

    def __init__(
        self,
        pipe: Pipeline,
        d: int,
        prog: StagePrograms,
        em: _Emitter,
        ranks: list[int],
        recvs: dict[tuple[int, str, int, int], str],
        p2p_s: float,
        overlap: bool,
    ):
        self.pipe, self.d, self.prog, self.em, self.ranks = pipe, d, prog, em, ranks
        self.recvs, self.p2p_s, self.overlap = recvs, p2p_s, overlap
        self.count: Counter[tuple[str, int]] = Counter()
        self.done: dict[tuple[str, int, int, int], str] = {}  # (F|B, dir, stage, mb) -> task
        self.wq: deque[tuple[int, int, float, str]] = deque()  # (chunk, mb, W seconds, after)
        self.weighted = [0, 0]  # micro-batches whose weight gradients are done, per chunk
        self.last = ""  # the last compute task
        self.reduced: list[str] = []
        self.gathered = [
            [
                em.task(f"ag.c{c}.l{layer}", "comm.dp", "all_gather", sec, [], hold=(k, u))
                for layer, sec, k, u in (prog.gather[c] if prog.gather else [])
            ]
            for c in range(2)
        ]

    def run(self) -> None:
        for op in self.pipe.ops(self.d):
            if op[0] == "W":
                self._weights()
                continue
            zb = op[0] == "B" and op[2]
            chains = [self._chain(kind, p, zb) for kind, p in _consumed(op)]
            if len(chains) == 2:  # a pair starts once both its inputs are in
                both = chains[0][4] + chains[1][4]
                chains[0][4], chains[1][4] = both, list(both)
            merged = len(chains) == 2 and self.overlap
            scratch: dict = {}  # (F|B, mb, chunk, 0) -> its last task, as `_emit_chains` keys
            for group in [chains] if merged else [[ch] for ch in chains]:
                _emit_chains(self.em, group, scratch, 0, 1)
            ends = [scratch[(kind, mb, p, 0)] for kind, mb, p, _, _ in chains]
            self.last = ends[-1] or self.last
            for kind, mb, p, _, _ in chains:
                last = scratch[(kind, mb, p, 0)]
                direction, stage = self.pipe.stage_of(self.d, p)
                self.done[(kind, direction, stage, mb)] = last
                # a send waits for the whole op (NCCL waits for the compute launched before)
                self._send(kind, p, mb, direction, stage, [e for e in ends if e])
                if kind == "B":
                    if zb:
                        self.wq.append((p, mb, self.w_seconds[p], last))
                    else:
                        self._weighted(p, last)
        assert not self.wq, "the order left weight gradients behind"
        self.em.task(
            "optimizer",
            "compute",
            "elementwise",
            self.prog.optimizer_s,
            [self.last, *self.reduced],
            tags={"phase": "optimizer"},
        )

    @property
    def w_seconds(self) -> list[float]:
        """Per chunk, the weight-gradient seconds of a backward (`Phase.wgrad`)."""
        return [sum(ph.wgrad for ph in self.prog.bwd[c] if ph.stream == "compute") for c in (0, 1)]

    def _chain(self, kind: str, p: int, zb: bool) -> list:
        """[kind, mb, chunk, phases, deps] of the chunk's next pass of `kind` (`zb`: a
        zero-bubble backward), as `_emit_chains` takes a pass."""
        mb = self.count[(kind, p)]
        self.count[(kind, p)] += 1
        direction, stage = self.pipe.stage_of(self.d, p)
        deps = [self.recvs.get((self.d, kind, p, mb), "")]
        if kind == "F":
            deps.append(self.done.get(("F", direction, stage - 1, mb), ""))
            deps += self.gathered[p] if mb == 0 else []
            phases = self.prog.fwd[p]
        else:
            deps.append(self.done.get(("B", direction, stage + 1, mb), ""))
            deps.append(self.done[("F", direction, stage, mb)])
            phases = self.prog.bwd[p]
            if zb:  # its input gradient only; the weight gradients wait for a W
                phases = [_input_part(ph) for ph in phases]
        return [kind, mb, p, phases, [x for x in deps if x]]

    def _send(
        self, kind: str, p: int, mb: int, direction: int, stage: int, after: list[str]
    ) -> None:
        dst = stage + 1 if kind == "F" else stage - 1
        if not 0 <= dst < self.pipe.pp:
            return
        dst_dev = self.pipe.locate(direction, dst)[0]
        if dst_dev == self.d:
            return  # the same device's next chunk takes it (DualPipeV's turn)
        self.em.task(
            f"send.{kind}{mb}.c{p}",
            "comm.send",
            "send",
            self.p2p_s,
            after,
            peer=self.ranks[dst_dev],
            coll=f"p2p.d{direction}.{kind}.{mb}.{stage}",
        )

    def _weights(self) -> None:
        p, mb, sec, after = self.wq.popleft()
        tid = self.em.task(
            f"W{mb}.c{p}",
            "compute",
            "gemm",
            sec,
            [after],
            tags={"phase": "bwd", "mb": mb, "chunk": p, "layer": -1},
        )
        self.last = tid
        self._weighted(p, tid)

    def _weighted(self, p: int, last: str) -> None:
        """A micro-batch's weight gradients of chunk `p` are done; after the chunk's last,
        its gradients' reduce-scatters."""
        self.weighted[p] += 1
        if self.weighted[p] < self.pipe.per_phase:
            return
        for layer, sec, k, u in self.prog.reduce[p] if self.prog.reduce else []:
            self.reduced.append(
                self.em.task(
                    f"rs.c{p}.l{layer}", "comm.dp", "reduce_scatter", sec, [last], hold=(k, u)
                )
            )


def _input_part(ph: Phase) -> Phase:
    """A backward phase without its weight gradients (the zero-bubble B)."""
    return replace(ph, seconds=ph.seconds - ph.wgrad, wgrad=0.0) if ph.stream == "compute" else ph
