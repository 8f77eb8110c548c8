"""DeepSpeed TED: expert parallelism under tensor parallelism of the dense part (tp > 1).

With tensor parallelism of degree tp, the MoE layer's input is replicated over the tp ranks of
a TP group (consecutive ranks, inside a node, as Megatron places them). Experts are not
tensor-sliced, so after gating (identical on the tp ranks, on the same tokens) each rank keeps
only its 1/tp slice of the capacity dimension of the [E, C, M] dispatch buffer (DeepSpeed's
`drop_tokens`), runs the expert-parallel all-to-all within its EP group (the W/tp ranks that
share its tp index), the experts and the combine, and then all-gathers along the capacity
dimension within its TP group (`gather_tokens`); gating and dropping are those of the
unsliced layer. Backward mirrors it as autograd does: the gradient of the all-gather is the
local slice, the gradient of the drop an all-gather of the dispatch buffer's gradient.

Each EP group holds all E experts (E/(W/tp) per rank); the same experts sit on the tp ranks
of a TP group, which each see a different capacity slice, so their weight gradients are
partial sums that the expert data-parallel gradient all-reduce (outside the layer's step,
as for every strategy here) adds up. Buffers are padded (DeepSpeed moves [E, C, M]), so the
routing model does not change the graph; C is aligned up to a multiple of tp (the extra slots
stay empty).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.layer import build_layer
from sim.strategies.steps import step_tags, task_id
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout
from sim.workload.slicing import aligned, ep_view, layer_meta

NAME = "ted"


def check_layout(layer: MoELayer, tp: Any, gpus_per_node: int | None = None) -> int:
    """The expert-parallel group size W/tp, after checking the layout."""
    W, E = layer.world, layer.experts
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"strategy.tp: expected a positive integer, got {tp!r}")
    if W % tp:
        raise ConfigError(f"strategy.tp: {W} GPUs do not split into TP groups of {tp}")
    ep = W // tp
    if E % ep:
        raise ConfigError(
            f"strategy.tp: every EP group of {ep} GPUs (W/tp) holds all {E} experts, which "
            f"needs E to be a multiple of {ep}"
        )
    if gpus_per_node is not None and tp > 1 and gpus_per_node % tp:
        raise ConfigError(
            f"strategy.tp: TP groups of {tp} GPUs must lie inside a node of {gpus_per_node}"
        )
    return ep


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    tp = params["tp"]
    G = cluster.topology.gpus_per_node if cluster is not None else None
    ep = check_layout(layer, tp, G)
    if tp == 1:  # no TP group: DeepSpeed's plain expert-parallel layer
        return build_layer(
            layer, degree=1, order="tutel", passes=passes, strategy=NAME, algo=params["algo"]
        )
    return _layout(layer, tp, ep, passes, params["algo"], drop=True)


def duplicate_layout(
    layer: MoELayer, tp: int, passes: tuple[str, ...], algo: str | None = None
) -> TaskGraph:
    """What TED's token dropping avoids (a cost baseline, not a strategy): every TP rank
    dispatches the whole replicated buffer and the experts run each token tp times (their
    weight gradients would count it tp times, DeepSpeed's reason to drop)."""
    return _layout(layer, tp, check_layout(layer, tp), passes, algo, drop=False)


def _layout(
    layer: MoELayer, tp: int, ep: int, passes: tuple[str, ...], algo: str | None, drop: bool
) -> TaskGraph:
    C1 = aligned(layer.capacity, tp) if drop else layer.capacity
    view = ep_view(
        layer,
        experts=layer.experts,
        world=ep,
        capacity=C1 // tp if drop else C1,
        hidden=layer.hidden_dim,
    )
    sub = build_layer(view, degree=1, order="tutel", passes=passes, strategy=NAME, algo=algo)
    g = TaskGraph(layer.world, meta=dict(sub.meta))
    g.meta |= {"layer": layer_meta(layer), "tp": tp, "ep": ep, "drop_tokens": drop}
    _Weaver(layer, sub, g, tp, ep, C1, drop).run()
    g.validate()
    return g


class _Weaver:
    """Copies the EP-group graph onto every tp index (rank j of EP group i is global rank
    j*tp + i) and weaves in the TP drop / all-gather and their gradients."""

    def __init__(
        self,
        layer: MoELayer,
        sub: TaskGraph,
        g: TaskGraph,
        tp: int,
        ep: int,
        C1: int,
        drop: bool,
    ):
        self.l, self.sub, self.g, self.tp, self.ep, self.drop = layer, sub, g, tp, ep, drop
        e, E, M = layer.elem, layer.experts, layer.model_dim
        self.shard = float(e * E * (C1 // tp) * M)  # this rank's capacity slice of [E, C, M]
        self.extra = float(e * E * M * (C1 - C1 // tp))  # full minus view buffer (encode/decode)
        # the shared parallel layout places TP innermost: rank j of EP group i is j*tp + i
        self.lay = lay = ParallelLayout(ep=ep, tp=tp)
        self.ep_groups = [lay.ep_group(lay.rank(tp=i)) for i in range(tp)]
        self.tp_groups = [lay.tp_group(lay.rank(ep=k)) for k in range(ep)]

    def run(self) -> None:
        per_stream: dict[tuple[int, str], list[Task]] = defaultdict(list)
        for i in range(self.tp):
            for t in self.sub:
                for new in self._copy(t, i):
                    per_stream[(new.rank, new.stream)].append(new)
        for tasks in per_stream.values():
            for t in tasks:
                self.g.add(t)

    def _rank(self, j: int, i: int) -> int:
        return self.lay.rank(ep=j, tp=i)

    def _id(self, tid: str, i: int) -> str:
        j, rest = tid[1:].split("/", 1)
        return f"r{self._rank(int(j), i)}/{rest}"

    def _copy(self, t: Task, i: int) -> list[Task]:
        rank = self._rank(t.rank, i)
        new = Task(
            self._id(t.id, i),
            rank,
            t.stream,
            t.kind,
            deps=[self._id(d, i) for d in t.deps],
            flops=t.flops,
            bytes=t.bytes,
            shape=t.shape,
            group=self.ep_groups[i] if t.group is not None else None,
            coll=f"{t.coll}@ep{i}" if t.coll else None,
            split=t.split,
            recv_split=t.recv_split,
            algo=t.algo,
            allocs=dict(t.allocs),
            frees=list(t.frees),
            tags=dict(t.tags),
        )
        if not self.drop:
            return [new]
        step = t.tags.get("step")
        phase: str = t.tags.get("phase", "")  # set on every task with a step (step_tags)
        if step in ("encode", "decode", "decode_grad", "encode_grad"):
            new.bytes += self.extra  # these touch the full (aligned) [E, C, M] buffer
        if step in ("encode", "decode_grad"):
            # forward: drop_tokens; backward: the gradient of gather_tokens (a slice)
            what = "drop_tokens" if step == "encode" else "gather_tokens_grad"
            cut = self._local(rank, phase, what, [new.id])
            return [new, cut]
        if step in ("dispatch", "combine_grad"):
            src = "drop_tokens" if phase == "fwd" else "gather_tokens_grad"
            new.deps = [task_id(rank, 0, phase, src)]
        if step in ("combine", "dispatch_grad"):
            # forward: gather_tokens; backward: the gradient of drop_tokens (an all-gather)
            what = "gather_tokens" if step == "combine" else "drop_tokens_grad"
            return [new, self._gather(rank, phase, what, new.id)]
        if step in ("decode", "encode_grad"):
            what = "gather_tokens" if phase == "fwd" else "drop_tokens_grad"
            new.deps = [task_id(rank, 0, phase, what)]
            new.frees.append(f"tp.{what}")
        return [new]

    def _tags(self, phase: str, what: str) -> dict[str, Any]:
        return step_tags(0, phase, what) | {"dtype": self.l.dtype}

    def _local(self, rank: int, phase: str, what: str, deps: list[str]) -> Task:
        """Keep this rank's capacity slice: a strided copy (read + write) of the shard."""
        return Task(
            task_id(rank, 0, phase, what),
            rank,
            "compute",
            "elementwise",
            deps=deps,
            bytes=2.0 * self.shard,
            tags=self._tags(phase, what),
        )

    def _gather(self, rank: int, phase: str, what: str, dep: str) -> Task:
        k = rank // self.tp
        return Task(
            task_id(rank, 0, phase, what),
            rank,
            "comm",
            "all_gather",
            deps=[dep],
            bytes=self.shard,  # this rank's slice in, the TP group's [E, C, M] out
            group=self.tp_groups[k],
            coll=f"L0/{phase}/{what}@tp{k}",
            allocs={f"tp.{what}": self.shard * self.tp},
            tags=self._tags(phase, what),
        )


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:TEDParams",
    build=build,
    real_layer="ted",
    layout_tp=True,
)
