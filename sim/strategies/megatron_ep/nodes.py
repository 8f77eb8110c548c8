"""One MoE transformer layer cut into Megatron-Core's schedule nodes, and the tasks of each.

Forward nodes: `attn` (the previous layer's residual, LN1, attention, residual, LN2, router),
`dispatch` (tokens to their experts' GPUs), `mlp` (the local experts' grouped GEMMs; the
shared experts too unless they overlap), `combine` (expert outputs back). Backward nodes, in
the order the gradient flows: `combine` (the output gradient goes out as a dispatch), `mlp`
(input gradients), `mlp_dw` (the experts' weight gradients, kept apart so that they can be
delayed), `dispatch` (the gradient comes back as a combine), `attn` (input gradients) and
`attn_dw`. With shared-expert overlap the shared experts run on a second compute stream
(`compute.1`) beside the dispatch / combine.

Dispatchers (the tokens each rank sends, per destination, from the layer's routing):
- `alltoall`: an all-to-allv of the (token, expert) rows (dropless, BF16 both ways);
- `allgather`: every rank all-gathers all tokens and keeps its experts' (dispatch), the
  outputs come back by a reduce-scatter of the full token buffer (combine);
- `flex`: DeepEP's normal kernels (`sim.strategies.deepep.volumes`: per-node dedup, `sms`
  SMs held), the forward dispatch in `dispatch_dtype`, everything else BF16. Megatron-Core
  hands DeepEP the hidden states as they are (`fused_a2a.FusedDispatch`: BF16 rows, buffers
  sized by `hidden * max(element size, 2)`), so "bf16" is the default; "fp8" is DeepSeek's own
  FP8 dispatch (1 byte per element and an fp32 scale per 128).

The all-to-allv dispatchers need their split sizes on the host before the forward dispatch:
`alltoall` all-gathers the per-expert token counts (int64) over the EP group, copies them to
the host and synchronises the stream (Megatron-Core's MoEAlltoAllTokenDispatcher: the counts
`.to("cpu")` then a cuda sync point); `flex` runs DeepEP's notify (an all-to-all of int32
counts) and the host waits on the received counts. Either is a small comm task with
`host_sync`: the host launches nothing after it until the counts arrive (`sim.engine.launch`).
The combine and the backward reuse the sizes (no second sync).

`Emitter` adds a node's tasks to the graph when asked: a schedule calls the nodes in the
order the host launches them, which is the order they enter the graph (with one hardware
queue, kernels of all streams start in that order). Attention is the model's
(`sim.workload.blocks.attention_ops`); the small unpermute is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.deepep.builder import COUNT_BYTES
from sim.strategies.deepep.volumes import choice_probs, row_bytes, volumes
from sim.strategies.megatron_ep.memory import moe_tensors
from sim.strategies.model.builder import backward_ops
from sim.workload.blocks import (
    MLA,
    Op,
    attention_ops,
    check_heads,
    dense_ffn_ops,
    gemm,
    kept_bytes,
    residual,
)
from sim.workload.moe import MoELayer

# a node's memory: (allocs of its first task, frees of its last)
_Mem = tuple[dict[str, float], list[str]]

DISPATCHERS = ("alltoall", "allgather", "flex")
COMM = "comm"  # the EP communication stream (Megatron's one comm stream)
COPY = "copy"  # the counts' copy to the host
SHARED = "compute.1"  # shared experts, when they overlap the dispatch / combine


@dataclass(frozen=True)
class LayerSpec:
    """What one MoE layer costs on each rank, whatever the schedule."""

    attn: list[Op]  # forward ops of the attention node (residual .. router)
    shared: list[Op]  # shared experts' forward ops (empty: none)
    experts: list[list[Op]]  # per rank: fc1, activation, fc2 on its expert rows
    dispatcher: str
    sms: int | None
    world: int
    send: dict[str, np.ndarray] = field(default_factory=dict)  # direction -> [P, P] bytes
    node_bytes: dict[str, np.ndarray] = field(default_factory=dict)  # flex only: [P, N]
    ag_bytes: float = 0.0  # allgather: one rank's tokens (bf16)
    count_bytes: float = 0.0  # the counts one rank sends before a forward dispatch (0: none)
    host_count_bytes: float = 0.0  # the counts it then copies to the host
    elem: float = 2  # bytes of an activation element
    tensors: list[dict[str, float]] = field(default_factory=list)  # per rank (place_moe)


def layer_spec(
    layer: MoELayer,
    heads: int,
    shared: int,
    flash: bool,
    dispatcher: str,
    gpus_per_node: int,
    sms: int | None = None,
    dispatch_dtype: str = "bf16",
    mla: MLA | None = None,
    *,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> LayerSpec:
    if dispatcher not in DISPATCHERS:
        raise ConfigError(f"strategy.dispatcher: expected one of {DISPATCHERS}, got {dispatcher!r}")
    check_heads(layer.model_dim, heads, kv_heads, head_dim, mla, "strategy")
    B, L, M, H, E, P, e = (
        layer.batch,
        layer.seq_len,
        layer.model_dim,
        layer.hidden_dim,
        layer.experts,
        layer.world,
        layer.elem,
    )
    T, k = B * L, layer.top_k
    fwd_row = row_bytes(M, dispatch_dtype)  # checked whatever the dispatcher
    att = attention_ops(B, L, M, heads, e, flash, mla, kv_heads=kv_heads, head_dim=head_dim)
    attn = _order_attention(att, T, M, E, e)
    sh = dense_ffn_ops("shared_", T, M, shared * H, e) if shared else []
    q = choice_probs(layer)  # [P, E]
    El = E // P
    share = q.reshape(P, P, El).sum(axis=2)  # [P, P]: share of a source's choices per GPU
    rows_to = T * k * share  # (token, expert) rows each source sends each GPU
    rows = rows_to.sum(axis=0)  # rows each GPU's experts compute
    experts = []
    for p in range(P):
        m = int(round(rows[p]))
        experts.append(
            [
                gemm("fc1", 1, m, H, M, e, params=El * (M * H + H)),
                Op("act", "elementwise", 8.0 * m * H, float(2 * e * m * H)),
                gemm("fc2", 1, m, M, H, e, params=El * (H * M + M)),
            ]
        )
    spec = LayerSpec(attn, sh, experts, dispatcher, sms, P, elem=e)
    spec.tensors.extend(moe_tensors(layer, dispatcher, rows_to, fwd_row, gpus_per_node))
    if dispatcher == "alltoall":  # all-gather of E int64 counts, all of them to the host
        object.__setattr__(spec, "count_bytes", float(8 * E))
        object.__setattr__(spec, "host_count_bytes", float(8 * E * P))
    elif dispatcher == "flex":  # DeepEP's notify: int32 counts per rank and per local expert
        object.__setattr__(spec, "count_bytes", float(COUNT_BYTES * P * (1 + El)))
        object.__setattr__(spec, "host_count_bytes", float(COUNT_BYTES * (1 + El)))
    bf16 = row_bytes(M, "bf16")
    if dispatcher == "alltoall":
        spec.send["dispatch"] = rows_to * bf16
        spec.send["combine"] = rows_to.T * bf16
    elif dispatcher == "flex":
        vol = volumes(layer, gpus_per_node)
        spec.send["dispatch"] = vol.gpu_tokens * fwd_row
        spec.send["combine"] = vol.gpu_tokens.T * bf16
        spec.send["dispatch_bf16"] = vol.gpu_tokens * bf16  # backward of the combine
        spec.node_bytes["dispatch"] = vol.node_tokens * fwd_row
        spec.node_bytes["bf16"] = vol.node_tokens * bf16
    else:
        object.__setattr__(spec, "ag_bytes", float(T * bf16))
    return spec


def _order_attention(att: list[Op], T: int, M: int, E: int, e: float) -> list[Op]:
    """res2 (the previous layer's residual), LN1 .. output projection (`att`), res1, LN2,
    router."""
    ln = att[0]
    return [
        residual("res2", T, M, e),
        Op("ln1", ln.kind, ln.flops, ln.bytes, params=ln.params),
        *att[1:],
        residual("res1", T, M, e),
        Op("ln2", ln.kind, ln.flops, ln.bytes, params=ln.params),
        Op("gate", "gate", 2.0 * T * M * E, float(e * (T * M + M * E) + 4 * T * E), params=M * E),
    ]


def _bwd(ops: list[Op], role: str) -> list[tuple[str, str, float, float, dict | None]]:
    """The `role` (dX or dW) backward tasks of ops, in backward order."""
    out = []
    for op in reversed(ops):
        for step, kind, flops, nbytes, shape, r in backward_ops(op):
            if r == role:
                out.append((step, kind, flops, nbytes, shape))
    return out


class Emitter:
    """One rank's tasks, added to `graph` in the order the node methods are called.

    `chain` (the plain schedule): every task also waits for the one launched before it on
    the rank, as when every kernel, communication included, runs on one stream in order."""

    def __init__(
        self,
        graph: TaskGraph,
        spec: LayerSpec,
        rank: int,
        shared_overlap: bool,
        chain: bool = False,
        dtype: str = "bf16",
        prefix: str = "",
    ):
        self.g, self.s, self.rank = graph, spec, rank
        self.shared_overlap, self.chain, self.dtype, self.prefix = (
            shared_overlap,
            chain,
            dtype,
            prefix,
        )
        self.last: str | None = None
        self.group = list(range(spec.world))
        self.offset = 0  # rank offset of this EP group in the graph (pipeline stages)
        self.tips: dict[str, str] | None = None  # stream -> its last task, when tracked
        self.block_ids: list[int] | None = None  # the model's block of each layer (tags)

    # -- plumbing -------------------------------------------------------------------------
    def _id(self, mb: int, lid: int, phase: str, step: str) -> str:
        return f"r{self.rank + self.offset}/{self.prefix}mb{mb}/L{lid}/{phase}/{step}"

    def add(
        self, t: Task, mb: int, lid: int, phase: str, step: str, node: str, role: str | None = None
    ) -> str:
        block = lid if self.block_ids is None else self.block_ids[lid]
        t.tags.update(
            {
                "layer": block,
                "phase": phase,
                "step": step,
                "micro": mb,
                "node": node,
                "dtype": self.dtype,
            }
        )
        if role is not None:
            t.tags["role"] = role
        if self.chain and self.last is not None and self.last not in t.deps:
            t.deps.append(self.last)
        self.g.add(t)
        self.last = t.id
        if self.tips is not None:
            self.tips[t.stream] = t.id
        return t.id

    def _compute(
        self, mb, lid, phase, node, items, deps, stream="compute", role=None, mem=None
    ) -> str:
        """The node's tasks in a chain; `mem` = (allocs of its first task, frees of its last)."""
        out = list(deps)
        tasks = []
        for step, kind, flops, nbytes, shape in items:
            t = Task(
                self._id(mb, lid, phase, step),
                self.rank + self.offset,
                stream,
                kind,
                deps=out,
                flops=flops,
                bytes=nbytes,
                shape=dict(shape) if shape else None,
            )
            tasks.append(t)
            out = [self.add(t, mb, lid, phase, step, node, role)]
        if mem is not None and tasks:
            tasks[0].allocs, tasks[-1].frees = mem
        return out[0] if out else (deps[0] if deps else "")

    def _buf(self, mb: int, lid: int, what: str) -> str:
        """A buffer's name: unique on the rank while it is live."""
        return f"{self.prefix}mb{mb}/L{lid}/{what}"

    @staticmethod
    def _fwd_items(ops: list[Op]) -> list[tuple]:
        return [(op.name, op.kind, op.flops, op.bytes, op.shape) for op in ops]

    def _exchange(
        self, mb, lid, phase, step, node, direction, deps, allocs=None, frees=None
    ) -> str:
        s, p, r0 = self.s, self.rank, self.offset
        group = [g + r0 for g in self.group]
        coll = f"{self.prefix}mb{mb}/L{lid}/{phase}/{step}/{r0}"
        tags: dict[str, Any] = {}
        if s.dispatcher == "allgather":
            kind = "all_gather" if direction == "dispatch" else "reduce_scatter"
            nbytes = s.ag_bytes if kind == "all_gather" else s.ag_bytes * s.world
            t = Task(
                self._id(mb, lid, phase, step),
                p + r0,
                COMM,
                kind,
                deps=list(deps),
                bytes=nbytes,
                group=group,
                coll=coll,
                algo="ring",
            )
        else:
            key = direction
            if s.dispatcher == "flex" and phase == "bwd" and direction == "dispatch":
                key = "dispatch_bf16"
            D = s.send[key]
            send, recv = D[p], D[:, p]
            algo = None
            if s.dispatcher == "flex":
                algo = "deepep"
                nb = s.node_bytes["dispatch" if key == "dispatch" else "bf16"]
                # the combine direction returns what the dispatch direction brought
                tags = {
                    "deepep": "combine" if direction == "combine" else "dispatch",
                    "node_bytes": nb[p].tolist(),
                }
            t = Task(
                self._id(mb, lid, phase, step),
                p + r0,
                COMM,
                "all_to_allv",
                deps=list(deps),
                bytes=float(send.sum()),
                split=send.tolist(),
                recv_split=recv.tolist(),
                group=group,
                coll=coll,
                algo=algo,
                sms=(s.sms or 0) if algo == "deepep" else 0,  # DeepEP's kernels hold their SMs
            )
        t.tags.update(tags)
        t.allocs, t.frees = allocs or {}, frees or []
        return self.add(t, mb, lid, phase, step, node)

    # -- forward nodes -----------------------------------------------------------------------
    # Activations (task allocs / frees): the attention node and the shared experts keep what
    # their operators' backward reads (`Op.kept`) until their weight gradients; the MoE part's
    # tensors are every MoE builder's (`sim.strategies.megatron_ep.memory.place_moe`).
    def attn_fwd(self, mb: int, lid: int, deps: list[str]) -> str:
        mem: _Mem = ({self._buf(mb, lid, "attn"): kept_bytes(self.s.attn)}, [])
        return self._compute(mb, lid, "fwd", "attn", self._fwd_items(self.s.attn), deps, mem=mem)

    def dispatch_fwd(self, mb: int, lid: int, attn: str) -> str:
        deps = [attn] if self.s.count_bytes <= 0 else [self._split_sizes(mb, lid, attn)]
        return self._exchange(mb, lid, "fwd", "dispatch", "dispatch", "dispatch", deps)

    def _split_sizes(self, mb: int, lid: int, attn: str) -> str:
        """The count exchange and the host's wait for the counts (see the module docstring)."""
        s, p, r0 = self.s, self.rank + self.offset, self.offset
        group = [g + r0 for g in self.group]
        kind = "all_to_all" if s.dispatcher == "flex" else "all_gather"
        counts = Task(
            self._id(mb, lid, "fwd", "counts"),
            p,
            COMM,
            kind,
            deps=[attn],
            bytes=s.count_bytes,
            group=group,
            coll=f"{self.prefix}mb{mb}/L{lid}/fwd/counts/{r0}",
            # the host reads the counts as they land (no d2h task: a topology need not model
            # a host, and the copy of E counts is nothing beside the wait)
            host_sync=True,
        )
        return self.add(counts, mb, lid, "fwd", "counts", "dispatch")

    def shared_fwd(self, mb: int, lid: int, attn: str) -> str | None:
        """The shared experts on their own stream (overlap on), else None (they are in mlp)."""
        if not self.s.shared or not self.shared_overlap:
            return None
        mem: _Mem = ({self._buf(mb, lid, "shared"): kept_bytes(self.s.shared)}, [])
        return self._compute(
            mb, lid, "fwd", "shared", self._fwd_items(self.s.shared), [attn], SHARED, mem=mem
        )

    def mlp_fwd(self, mb: int, lid: int, dispatched: str, attn: str) -> str:
        ops = self._mlp_ops()
        mem: _Mem | None = None
        if self.s.shared and not self.shared_overlap:  # the shared experts run in this node
            mem = ({self._buf(mb, lid, "shared"): kept_bytes(self.s.shared)}, [])
        return self._compute(mb, lid, "fwd", "mlp", self._fwd_items(ops), [dispatched], mem=mem)

    def combine_fwd(self, mb: int, lid: int, mlp: str) -> str:
        return self._exchange(mb, lid, "fwd", "combine", "combine", "combine", [mlp])

    # -- backward nodes ----------------------------------------------------------------------
    def combine_bwd(self, mb: int, lid: int, deps: list[str]) -> str:
        return self._exchange(mb, lid, "bwd", "combine_grad", "combine", "dispatch", deps)

    def shared_bwd(self, mb: int, lid: int, deps: list[str]) -> str | None:
        """Shared experts' input gradients on their stream (overlap on), else None."""
        if not self.s.shared or not self.shared_overlap:
            return None
        return self._compute(
            mb, lid, "bwd", "shared", _bwd(self.s.shared, "dX"), deps, SHARED, "dX"
        )

    def shared_bwd_dw(self, mb: int, lid: int, deps: list[str]) -> str | None:
        if not self.s.shared or not self.shared_overlap:
            return None
        mem: _Mem = ({}, [self._buf(mb, lid, "shared")])
        return self._compute(
            mb, lid, "bwd", "shared_dw", _bwd(self.s.shared, "dW"), deps, SHARED, "dW", mem
        )

    def _mlp_ops(self) -> list[Op]:
        return self.s.experts[self.rank] + ([] if self.shared_overlap else self.s.shared)

    def mlp_bwd(self, mb: int, lid: int, got: str) -> str:
        return self._compute(mb, lid, "bwd", "mlp", _bwd(self._mlp_ops(), "dX"), [got], role="dX")

    def mlp_bwd_dw(self, mb: int, lid: int, deps: list[str]) -> str:
        mem: _Mem | None = None
        if self.s.shared and not self.shared_overlap:
            mem = ({}, [self._buf(mb, lid, "shared")])
        return self._compute(
            mb, lid, "bwd", "mlp_dw", _bwd(self._mlp_ops(), "dW"), deps, role="dW", mem=mem
        )

    def dispatch_bwd(self, mb: int, lid: int, mlp: str) -> str:
        return self._exchange(mb, lid, "bwd", "dispatch_grad", "dispatch", "combine", [mlp])

    def attn_bwd(self, mb: int, lid: int, deps: list[str]) -> str:
        return self._compute(mb, lid, "bwd", "attn", _bwd(self.s.attn, "dX"), deps, role="dX")

    def attn_bwd_dw(self, mb: int, lid: int, deps: list[str]) -> str:
        mem: _Mem = ({}, [self._buf(mb, lid, "attn")])
        return self._compute(
            mb, lid, "bwd", "attn_dw", _bwd(self.s.attn, "dW"), deps, role="dW", mem=mem
        )
