"""Megatron-Core's pipeline schedules as orders of passes, and the step's task graph.

`schedule(pp, vp, micro, stage)` is the order in which one pipeline stage runs its forward
and backward passes: plain 1F1B (`vp` = 1: `pp - stage - 1` warm-up forwards, then one
forward and one backward in turn, then the remaining backwards) or the interleaved 1F1B of
Narayanan et al. (SC'21) as Megatron-Core runs it (`forward_backward_pipelining_with_
interleaving`): virtual micro-batches taken from a table of groups of `pp` micro-batches per
chunk, `(pp - stage - 1) * 2 + (vp - 1) * pp` warm-up forwards, the backward of chunk c
running the mirror chunk `vp - 1 - c`.

`step_graph` lays those orders out as a task graph over one representative GPU per stage
(every TP / CP / DP / EP rank of a stage runs the same program at the same time; their
collectives were timed with all groups at once, `sim.training.comm`): each pass is a chain of
phases, compute on the compute stream and EP collectives on the communication stream, and the
activations and gradients move between stages by send / receive. With Megatron-Core's EP
overlap (`--overlap-moe-expert-parallel-comm`), a steady-state forward and backward are
emitted phase by phase in turn, so that one's all-to-all runs beside the other's compute, as
the merged "combined 1F1B" schedule launches them. Plain 1F1B (`vp` = 1) exchanges with
`batch_p2p_comm`, which returns once the transfers are done, so a stage's next pass waits for
its send; the interleaved schedule overlaps them (`overlap_p2p_comm`). Data parallelism adds
the parameter all-gather before a layer's first forward and the gradient reduce-scatter after
its last backward (the distributed optimizer, overlapped as `--overlap-param-gather` /
`--overlap-grad-reduce` do), then the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core.graph import Task, TaskGraph

Pass = tuple[str, int, int]  # ("F" | "B", micro-batch, chunk)


def _table(micro: int, pp: int, vp: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of the virtual micro-batches in forward order: groups of `pp`
    micro-batches, each group through every chunk in turn (the last group may be smaller)."""
    out = []
    for lo in range(0, micro, pp):
        hi = min(lo + pp, micro)
        for c in range(vp):
            out += [(m, c) for m in range(lo, hi)]
    return out


def schedule(pp: int, vp: int, micro: int, stage: int) -> list[Pass]:
    """The passes stage `stage` runs in one step, in order."""
    if vp == 1:
        warm = min(pp - stage - 1, micro)
        fwd = [(m, 0) for m in range(micro)]
        bwd = fwd
    else:
        fwd = _table(micro, pp, vp)
        bwd = [(m, vp - 1 - c) for m, c in fwd]
        warm = min((pp - stage - 1) * 2 + (vp - 1) * pp, len(fwd))
    out: list[Pass] = [("F", m, c) for m, c in fwd[:warm]]
    for i in range(len(fwd) - warm):
        out.append(("F", *fwd[warm + i]))
        out.append(("B", *bwd[i]))
    out += [("B", m, c) for m, c in bwd[len(fwd) - warm :]]
    return out


@dataclass(frozen=True)
class Phase:
    """A stretch of one pass: compute (seconds on the compute stream) or a collective (on
    the communication stream, already timed). `layer` and `what` only name it."""

    stream: str  # "compute" | "comm"
    seconds: float
    what: str
    layer: int = -1
    kind: str = "gemm"
    wgrad: float = 0.0  # of a backward's compute: its weight-gradient GEMMs' seconds
    # of a collective: the SMs its kernel holds and the HBM share it takes while it runs
    # (the engine slows the compute beside it only then, `sim.engine.resources`)
    hold: tuple[int, float] = (0, 0.0)


@dataclass
class StagePrograms:
    """Per chunk of one stage: the phases of a forward and of a backward pass, and the
    layers' data-parallel collectives (seconds: all-gather before, reduce-scatter after)."""

    fwd: list[list[Phase]]
    bwd: list[list[Phase]]
    # per chunk: (layer, seconds, SMs its kernel holds, HBM share it takes) of each layer's
    # collective (the SMs and share slow the compute beside it; 0: nothing)
    gather: list[list[tuple[int, float, int, float]]] = field(default_factory=list)
    reduce: list[list[tuple[int, float, int, float]]] = field(default_factory=list)
    optimizer_s: float = 0.0


@dataclass
class _Emitter:
    g: TaskGraph
    rank: int
    stage: int
    n: int = 0

    def task(
        self,
        name: str,
        stream: str,
        kind: str,
        seconds: float,
        deps: list[str],
        tags: dict | None = None,
        peer: int | None = None,
        coll: str | None = None,
        hold: tuple[int, float] = (0, 0.0),
    ) -> str:
        """A timed task; a collective of one member (its time measured already) or a
        send / receive to `peer`; `hold`: the SMs and the HBM share its kernel takes from
        the compute beside it."""
        self.n += 1
        tid = f"s{self.stage}.{name}#{self.n}"
        group = None
        if kind in ("all_to_all", "all_gather", "reduce_scatter"):
            group, coll = [self.rank], tid
        self.g.add(
            Task(
                tid,
                self.rank,
                stream,
                kind,
                deps=[d for d in deps if d],
                group=group,
                coll=coll,
                peer=peer,
                bytes=1.0 if peer is not None else 0.0,
                sms=hold[0],
                tags={
                    "measured_s": float(seconds),
                    **({"hbm_share": hold[1]} if hold[1] else {}),
                    **(tags or {}),
                },
            )
        )
        return tid


def step_graph(
    stages: list[StagePrograms],
    ranks: list[int],
    world: int,
    micro: int,
    vp: int,
    p2p_s: float,
    overlap: bool,
) -> TaskGraph:
    """The step's graph over one GPU per stage (`ranks[s]`)."""
    pp = len(stages)
    g = TaskGraph(world, meta={"step": "training", "pp": pp, "vp": vp, "micro": micro})
    em = [_Emitter(g, ranks[s], s) for s in range(pp)]
    done: dict[tuple[str, int, int, int], str] = {}  # (F|B, mb, virtual stage) -> last task
    orders = [schedule(pp, vp, micro, s) for s in range(pp)]
    gathered: dict[tuple[int, int], list[str]] = {}
    for s in range(pp):  # the parameters' all-gather of each chunk, before its first forward
        for c in range(vp):
            gathered[(s, c)] = (
                [
                    em[s].task(f"ag.l{layer}", "comm.dp", "all_gather", sec, [], hold=(k, u))
                    for layer, sec, k, u in stages[s].gather[c]
                ]
                if stages[s].gather
                else []
            )
    # recvs in the host's issue order, which the hardware queues follow (`sim.engine.queues`):
    # the interleaved schedule (`overlap_p2p_comm`) posts the next forward's (backward's)
    # recv with the last forward's (backward's) send, so it lands during the pass between
    # (`ahead`: those posted early, by pass); plain 1F1B's batched exchange posts it just
    # before the pass
    sources = _sources(orders, vp)
    ahead: dict[tuple[str, int, int], str] = {}
    last_bwd: dict[tuple[int, int], int] = {}
    for s in range(pp):
        for i, (kind, _m, c) in enumerate(orders[s]):
            if kind == "B":
                last_bwd[(s, c)] = i
    # emit stage by stage in pass order; cross-stage waits are recv tasks, so any order works
    for s in range(pp):
        order, i = orders[s], 0
        waits: list[str] = []
        while i < len(order):
            kind, m, c = order[i]
            merged = overlap and kind == "F" and i + 1 < len(order) and order[i + 1][0] == "B"
            passes = [order[i], order[i + 1]] if merged else [order[i]]
            chains = []
            for pk, pm, pc in passes:
                prog = stages[s].fwd[pc] if pk == "F" else stages[s].bwd[pc]
                v = pc * pp + s
                src = sources.get((s, pk, pm, pc))
                deps = [ahead.pop((pk, pm, pc), "") or _recv(em[s], pk, pm, pc, src, ranks, p2p_s)]
                local = {"F": [("F", pm, v - 1, 0)], "B": [("B", pm, v + 1, 0), ("F", pm, v, 0)]}
                deps += [done[key] for key in local[pk] if key in done and key[2] % pp == s]
                deps += waits
                if pk == "F" and pm == 0:
                    deps += gathered.get((s, pc), [])
                chains.append([pk, pm, pc, prog, deps])
            _emit_chains(em[s], chains, done, s, pp)
            blocking = []
            for pk, pm, pc in passes:
                sent = _send(em[s], pk, pm, pc, s, ranks, vp, done, p2p_s)
                if sent and vp == 1:
                    blocking.append(sent)
                if pk == "B" and last_bwd.get((s, pc)) == i + passes.index((pk, pm, pc)):
                    last = done[("B", pm, pc * pp + s, 0)]
                    for layer, sec, k, u in stages[s].reduce[pc] if stages[s].reduce else []:
                        em[s].task(
                            f"rs.l{layer}", "comm.dp", "reduce_scatter", sec, [last], hold=(k, u)
                        )
            i += len(passes)
            waits = blocking  # plain 1F1B's batched send / receive returns once sent
            for pk in dict.fromkeys(p[0] for p in passes) if vp > 1 else ():  # in pass order
                nxt = next((p for p in order[i:] if p[0] == pk), None)
                if nxt is not None and (s, *nxt) in sources and nxt not in ahead:
                    ahead[nxt] = _recv(em[s], *nxt, sources[(s, *nxt)], ranks, p2p_s)
    for s in range(pp):  # the optimizer step once every gradient is reduced
        ends = [t.id for t in g.tasks.values() if t.rank == ranks[s]]
        em[s].task(
            "optimizer",
            "compute",
            "elementwise",
            stages[s].optimizer_s,
            ends[-1:],
            tags={"phase": "optimizer"},
        )
    return g


def _emit_chains(em: _Emitter, chains: list[list], done: dict, s: int, pp: int) -> None:
    """Emit the phases of one pass, or of a forward and a backward in turn (merged): a
    collective's kernel holds its SMs (`Phase.hold`) from the compute beside it."""
    longest = max(len(ch[3]) for ch in chains)
    prev = [ch[4] for ch in chains]
    for j in range(longest):
        for k, (pk, pm, pc, prog, _) in enumerate(chains):
            if j >= len(prog):
                continue
            ph = prog[j]
            stream = "compute" if ph.stream == "compute" else "comm.ep"
            tid = em.task(
                f"{pk}{pm}.c{pc}.{ph.what}",
                stream,
                ph.kind,
                ph.seconds,
                prev[k],
                tags={
                    "phase": "fwd" if pk == "F" else "bwd",
                    "mb": pm,
                    "chunk": pc,
                    "layer": ph.layer,
                },
                hold=ph.hold,
            )
            prev[k] = [tid]
    for k, (pk, pm, pc, _prog, _) in enumerate(chains):
        done[(pk, pm, pc * pp + s, 0)] = prev[k][0] if prev[k] else ""


def _peer(pk: str, v: int, pp: int, vp: int) -> int | None:
    """The virtual stage a pass of virtual stage v sends to (None: none)."""
    nxt = v + 1 if pk == "F" else v - 1
    return nxt if 0 <= nxt < pp * vp else None


def _sources(orders: list[list[Pass]], vp: int) -> dict[tuple[int, str, int, int], int]:
    """(stage, F|B, mb, chunk) -> the virtual stage its input comes from, for every pass
    whose input another stage sends."""
    pp = len(orders)
    out = {}
    for s in range(pp):
        for pk, m, c in orders[s]:
            v = c * pp + s
            src = v - 1 if pk == "F" else v + 1
            if 0 <= src < pp * vp and src % pp != s:  # pp == 1: chunks of one stage are local
                out[(s, pk, m, c)] = src
    return out


def _recv(
    em: _Emitter, pk: str, m: int, c: int, src: int | None, ranks: list[int], p2p_s: float
) -> str:
    """The receive of a pass's input from virtual stage `src` (on a stream per direction,
    in the order the stage runs its passes); "" where the input is local."""
    if src is None:
        return ""
    return em.task(
        f"recv.{pk}{m}.c{c}",
        "comm.rf" if pk == "F" else "comm.rb",
        "recv",
        p2p_s,
        [],
        peer=ranks[src % len(ranks)],
        coll=f"p2p.{pk}.{m}.{src}",
    )


def _send(
    em: _Emitter,
    pk: str,
    m: int,
    c: int,
    s: int,
    ranks: list[int],
    vp: int,
    done: dict,
    p2p_s: float,
) -> str | None:
    """The send of a pass's output (activations forward, gradients backward) to the next
    virtual stage's GPU; its task id, or None where the next stage is local or absent."""
    pp = len(ranks)
    v = c * pp + s
    dst = _peer(pk, v, pp, vp)
    if dst is None or dst % pp == s:
        return None
    stream = "comm.sf" if pk == "F" else "comm.sb"
    return em.task(
        f"send.{pk}{m}.c{c}",
        stream,
        "send",
        p2p_s,
        [done[(pk, m, v, 0)]],
        peer=ranks[dst % pp],
        coll=f"p2p.{pk}.{m}.{v}",
    )
