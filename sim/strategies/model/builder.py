"""A model of N transformer blocks as a task graph of one data-parallel replica.

Forward, block by block: the attention sublayer and residual, LN2, then a dense FFN or the
MoE layer of the run's strategy (spliced, `sim.strategies.model.splice`) and the residual.
Backward, blocks in reverse, every operator split into its input-gradient task (`dX`, on the
critical path) and, for operators with weights, its weight-gradient task (`dW`, needed only by
the gradient reduction); both tagged `role`. A GEMM's backward is two GEMMs of the forward's
work (dX = dY W^T, dW = X^T dY); the batched attention GEMMs have two input gradients and no
weights. PyTorch's order is kept as the plain schedule: each dW right after its dX.

At the end of the backward the gradients are reduced: the non-expert weights (replicated on
every GPU) by one all-reduce over the whole world (hierarchical: inside nodes, then across
them), the experts' by an all-reduce over their data-parallel group (the same expert in
every replica). Both are written with the replica's members and `dp_span` (see
`sim.workload.dp_span`), so one replica's graph stands for all of them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sim.core.graph import Task, TaskGraph
from sim.strategies.model.splice import ROLE_TAG, PhaseTemplate, splice, templates
from sim.strategies.steps import dgrad_shape, wgrad_shape
from sim.workload import dp_span
from sim.workload.blocks import (
    BlockModel,
    Op,
    attention_ops,
    dense_ffn_ops,
    expert_params,
    kept_bytes,
    residual,
)
from sim.workload.moe import MoELayer

GRAD_STREAM = "comm.dp"  # gradient reductions: apart from the all-to-alls' streams
FLASH_BWD = 2.5  # FlashAttention's backward: 5 GEMMs per tile against the forward's 2


def block_ops(blocks: BlockModel, layer: MoELayer, moe: bool) -> dict[str, list[Op]]:
    """The forward ops of one block, by part: attention, ln2, ffn (dense or shared experts),
    the residual adds."""
    B, L, M, e = layer.batch, layer.seq_len, layer.model_dim, layer.elem
    T = B * L
    ffn: list[Op] = []
    if not moe:
        ffn = dense_ffn_ops("", T, M, blocks.ffn_hidden or 4 * M, e)
    elif blocks.shared:
        ffn = dense_ffn_ops("shared_", T, M, blocks.shared * layer.hidden_dim, e)
    attn = attention_ops(
        B,
        L,
        M,
        blocks.heads,
        e,
        blocks.flash,
        blocks.mla,
        kv_heads=blocks.kv_heads,
        head_dim=blocks.head_dim,
    )
    ln2 = attn[0]
    return {
        "attn": attn,
        "ln2": [Op("ln2", ln2.kind, ln2.flops, ln2.bytes, params=ln2.params)],
        "ffn": ffn,
        "res1": [residual("res1", T, M, e)],
        "res2": [residual("res2", T, M, e)],
    }


def backward_ops(op: Op) -> list[tuple[str, str, float, float, dict | None, str]]:
    """(step, kind, flops, bytes, shape, role) of an op's backward tasks."""
    if op.kind == "gemm" and op.shape is not None:
        f, nb = op.flops, op.bytes
        dx = (f"{op.name}_dgrad", "gemm", f, nb, dgrad_shape(op.shape), "dX")
        if op.params:
            return [dx, (f"{op.name}_wgrad", "gemm", f, nb, wgrad_shape(op.shape), "dW")]
        # activation x activation (attention): both operands' gradients are input gradients
        return [dx, (f"{op.name}_dgrad2", "gemm", f, nb, wgrad_shape(op.shape), "dX")]
    if op.kind == "attention":
        return [(f"{op.name}_grad", op.kind, FLASH_BWD * op.flops, 2.0 * op.bytes, None, "dX")]
    # norms, softmax, activations: read y (or x) and dy, write dx; a norm's own weight
    # gradients come out of the same kernel (PyTorch's fused layer_norm backward)
    return [(f"{op.name}_grad", op.kind, op.flops, 1.5 * op.bytes, None, "dX")]


class _Rank:
    """One rank's streams, filled in program order.

    Activations: a part's forward (attention, LN2, the dense or shared FFN) keeps what its
    operators' backward reads (`Op.kept`), allocated by its first task and freed by the last
    task of its backward (or of its forward, when the graph has no backward); with no forward
    in the graph, the backward's first task finds them all live (`stash`)."""

    def __init__(self, rank: int, dtype: str, keep: bool = True):
        self.rank, self.dtype, self.keep = rank, dtype, keep
        self.streams: dict[str, list[Task]] = defaultdict(list)
        self.dws: list[str] = []

    def task(
        self,
        b: int,
        phase: str,
        step: str,
        kind: str,
        flops: float,
        nbytes: float,
        shape: dict | None,
        deps: list[str],
        role: str | None = None,
    ) -> str:
        tags: dict[str, Any] = {"layer": b, "phase": phase, "step": step, "dtype": self.dtype}
        if role is not None:
            tags[ROLE_TAG] = role
        t = Task(
            f"r{self.rank}/L{b}/{phase}/{step}",
            self.rank,
            "compute",
            kind,
            deps=deps,
            flops=flops,
            bytes=nbytes,
            shape=dict(shape) if shape else None,
            tags=tags,
        )
        self.streams["compute"].append(t)
        if role == "dW":
            self.dws.append(t.id)
        return t.id

    def _last(self) -> Task:
        return self.streams["compute"][-1]

    def forward(self, b: int, ops: list[Op], inputs: list[str]) -> list[str]:
        out = inputs
        kept = kept_bytes(ops)
        for i, op in enumerate(ops):
            out = [self.task(b, "fwd", op.name, op.kind, op.flops, op.bytes, op.shape, out)]
            if i == 0 and kept > 0:
                self._last().allocs = {_buffer(b, ops): kept}
        if kept > 0 and not self.keep:
            self._last().frees = [_buffer(b, ops)]
        return out

    def backward(self, b: int, ops: list[Op], grads: list[str]) -> list[str]:
        """Ops in reverse; each one's tasks wait for the gradient of its output."""
        kept = kept_bytes(ops)
        for op in reversed(ops):
            nxt = []
            for step, kind, flops, nbytes, shape, role in backward_ops(op):
                tid = self.task(b, "bwd", step, kind, flops, nbytes, shape, grads, role)
                if role == "dX":
                    nxt.append(tid)
            grads = nxt
        if kept > 0 and ops:
            self._last().frees = [_buffer(b, ops)]
        return grads

    def stash(self, blocks: BlockModel, kinds: dict[bool, dict[str, list[Op]]]) -> None:
        """A backward with no forward before it: every part's kept activations are live from
        the backward's first task on."""
        first = next(t for t in self.streams["compute"] if t.tags.get("phase") == "bwd")
        for b in range(blocks.n):
            for ops in kinds[blocks.is_moe(b)].values():
                if ops and kept_bytes(ops) > 0:
                    first.allocs[_buffer(b, ops)] = kept_bytes(ops)


def _buffer(b: int, ops: list[Op]) -> str:
    """The activations of block b's part whose first operator is ops[0]."""
    return f"L{b}/{ops[0].name}.kept"


def build_model(
    blocks: BlockModel,
    layer: MoELayer,
    layer_graph: TaskGraph,
    passes: tuple[str, ...],
    per_block: dict[int, TaskGraph] | None = None,
) -> TaskGraph:
    """The model's graph on `layer.world` ranks (one replica), its MoE blocks spliced from
    `layer_graph` (the strategy's graph of one layer, forward and backward), or from
    `per_block[b]` where a block routes its own way (`sim.workload.routing.per_block`)."""
    tpls = templates(layer_graph)
    own = {b: templates(g) for b, g in (per_block or {}).items()}
    kinds = {moe: block_ops(blocks, layer, moe) for moe in (False, True)}
    g = TaskGraph(
        layer.world,
        meta=dict(layer_graph.meta)
        | {"model": {k: v for k, v in vars(blocks).items()}, "passes": list(passes)},
    )
    mp = layer.world
    everyone = list(range(mp))  # shared: validated once
    sync_bytes = grad_bytes(blocks, layer)
    for rank in range(mp):
        r = _Rank(rank, layer.dtype, "bwd" in passes)
        last: list[str] = []
        if "fwd" in passes:
            for b in range(blocks.n):
                moe = blocks.is_moe(b)
                tpl = own.get(b, tpls).get((rank, "fwd")) if moe else None
                last = _forward_block(r, b, kinds[moe], tpl, last)
        if "bwd" in passes:
            grads = last
            for b in reversed(range(blocks.n)):
                moe = blocks.is_moe(b)
                tpl = own.get(b, tpls).get((rank, "bwd")) if moe else None
                grads = _backward_block(r, b, kinds[moe], tpl, grads)
            _grad_sync(r, grads, sync_bytes, everyone, blocks.dp, layer)
            if "fwd" not in passes:
                r.stash(blocks, kinds)
        for tasks in r.streams.values():
            for t in tasks:
                g.add(t)
    g.validate()
    return g


def _forward_block(
    r: _Rank, b: int, ops: dict[str, list[Op]], tpl: PhaseTemplate | None, x: list[str]
) -> list[str]:
    h = r.forward(b, ops["attn"], x)
    res1 = r.forward(b, ops["res1"], h + x)
    y = r.forward(b, ops["ln2"], res1)
    out = r.forward(b, ops["ffn"], y) if ops["ffn"] else []
    if tpl is not None:
        sinks, _ = splice(tpl, b, y, r.streams)
        out = out + sinks
    return r.forward(b, ops["res2"], out + res1)


def _backward_block(
    r: _Rank, b: int, ops: dict[str, list[Op]], tpl: PhaseTemplate | None, g_out: list[str]
) -> list[str]:
    grads = r.backward(b, ops["ffn"], g_out) if ops["ffn"] else []
    if tpl is not None:
        sinks, dws = splice(tpl, b, g_out, r.streams)
        r.dws += dws
        grads = grads + sinks
    grads = r.backward(b, ops["ln2"], grads)
    (op,) = ops["res2"]
    mid = [r.task(b, "bwd", "res2_grad", op.kind, op.flops, op.bytes, None, grads + g_out, "dX")]
    grads = r.backward(b, ops["attn"], mid)
    (op,) = ops["res1"]
    return [r.task(b, "bwd", "res1_grad", op.kind, op.flops, op.bytes, None, grads + mid, "dX")]


def grad_bytes(blocks: BlockModel, layer: MoELayer) -> dict[str, float]:
    """Gradient bytes one GPU reduces: the non-expert weights (every block's attention and
    norms, dense FFNs, MoE gates and shared experts) and its share of the experts'."""
    M, E, e = layer.model_dim, layer.experts, layer.elem
    non_expert = 0.0
    experts = 0.0
    for b in range(blocks.n):
        moe = blocks.is_moe(b)
        ops = block_ops(blocks, layer, moe)
        non_expert += sum(op.params for part in ops.values() for op in part)
        if moe:
            non_expert += M * E  # the gate's weights
            experts += expert_params(M, layer.hidden_dim, E) / layer.world
    return {"non_expert": e * non_expert, "experts": e * experts}


def _grad_sync(
    r: _Rank,
    last: list[str],
    nbytes: dict[str, float],
    everyone: list[int],
    dp: int,
    layer: MoELayer,
) -> None:
    """The gradient reductions at the end of the backward (module docstring)."""
    deps = r.dws + last
    tags = {"phase": "bwd", "dtype": layer.dtype, dp_span.TAG: True}
    if len(everyone) * dp > 1 and nbytes["non_expert"] > 0:
        r.streams[GRAD_STREAM].append(
            Task(
                f"r{r.rank}/grad_sync",
                r.rank,
                GRAD_STREAM,
                "all_reduce",
                deps=list(deps),
                bytes=nbytes["non_expert"],
                group=everyone,
                coll="grad_sync",
                algo="hierarchical",
                tags=tags | {"step": "grad_sync"},
            )
        )
    if dp > 1 and nbytes["experts"] > 0:
        r.streams[GRAD_STREAM].append(
            Task(
                f"r{r.rank}/expert_grad_sync",
                r.rank,
                GRAD_STREAM,
                "all_reduce",
                deps=list(deps),
                bytes=nbytes["experts"],
                group=[r.rank],
                coll=f"expert_grad_sync.{r.rank}",
                algo="ring",
                tags=tags | {"step": "expert_grad_sync"},
            )
        )
