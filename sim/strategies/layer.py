"""Graph builder shared by the MoE layer strategies: gate -> encode -> dispatch chunks ->
expert chunks -> combine chunks -> decode, forward and backward.

Chunks split the capacity dimension (Tutel/PipeMoE): chunk j moves capacity slots
[jC/r, (j+1)C/r) of every (GPU, expert) buffer. Dispatch and combine chunks go to comm
streams in one of three issue orders; experts run on the compute stream. Backward mirrors the
forward with chunks walked in reverse: the combine gradient goes out first, the expert does
dgrad + wgrad (twice the forward GEMM work), then the dispatch gradient returns. A gradient
travels against its forward exchange: the combine gradient from the tokens' ranks to the
experts' (the dispatch's per-peer sizes), the dispatch gradient back (the combine's).

Chunk sizes and issue orders are in `sim.strategies.chunking`; the id/tag scheme and compute
steps every builder shares in `sim.strategies.steps`. Activations are MPipeMoE's ten tensors
under the one rule of `sim.strategies.activations` (every chunk writes a slice of each).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.activations import place
from sim.strategies.chunking import ChunkSizes, chunk_sizes, comm_order
from sim.strategies.steps import (
    PASSES,
    ComputeSteps,
    dgrad_shape,
    require_whole_experts,
    step_tags,
    task_id,
    wgrad_shape,
)
from sim.workload.memory import layer_tensors
from sim.workload.moe import MoELayer
from sim.workload.slicing import layer_meta


def build_layer(
    layer: MoELayer,
    degree: int = 1,
    order: str = "tutel",
    passes: tuple[str, ...] = ("fwd",),
    layer_id: int = 0,
    strategy: str = "pipelined",
    algo: str | None = None,
    sizes: ChunkSizes | None = None,
) -> TaskGraph:
    """The layer's graph; `algo` picks the all-to-all algorithm of every exchange (None: the
    collective's default, see sim.hardware.collectives). `sizes`: what each of the `degree`
    chunks moves, where not the capacity chunks (Lancet's batch partitions)."""
    if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
        raise ConfigError(f"strategy.degree: expected a positive integer, got {degree!r}")
    if degree > layer.capacity:
        raise ConfigError(
            f"strategy.degree: {degree} chunks exceed the expert capacity C={layer.capacity}"
        )
    require_whole_experts(layer, strategy)
    for p in passes:
        if p not in PASSES:
            raise ConfigError(f"passes: expected entries from {PASSES}, got {p!r}")
    if sizes is None:
        sizes = chunk_sizes(layer, degree)
    g = TaskGraph(
        layer.world,
        meta={
            "strategy": strategy,
            "degree": degree,
            "order": order,
            "algo": algo,
            "passes": list(passes),
            "layer": layer_meta(layer),
        },
    )
    seq = comm_order(degree, order)
    group = list(range(layer.world))  # one list shared by every task: validated once
    for rank in range(layer.world):
        streams: dict[str, list[Task]] = defaultdict(list)
        b = _RankBuilder(layer, sizes, rank, layer_id, streams, degree, passes, group, algo)
        for p in passes:
            b.pass_(p, seq)
        place([t for ts in streams.values() for t in ts], b.tensors(), passes)
        for tasks in streams.values():
            for t in tasks:
                g.add(t)
    g.validate()
    return g


class _RankBuilder(ComputeSteps):
    def __init__(
        self,
        layer: MoELayer,
        sizes: ChunkSizes,
        rank: int,
        layer_id: int,
        streams: dict[str, list[Task]],
        r: int,
        passes: tuple[str, ...],
        group: list[int],
        algo: str | None,
    ):
        self.l, self.s, self.rank, self.lid = layer, sizes, rank, layer_id
        self.streams, self.r = streams, r
        self.group, self.algo = group, algo

    def _id(self, phase: str, step: str, j: int | None = None) -> str:
        return task_id(self.rank, self.lid, phase, step, j)

    def _add(self, stream: str, t: Task) -> str:
        t.tags.setdefault("dtype", self.l.dtype)
        self.streams[stream].append(t)
        return t.id

    def _tags(self, phase: str, step: str, j: int | None = None) -> dict:
        return step_tags(self.lid, phase, step, j)

    # -- pieces --------------------------------------------------------------------------

    def _exchange(
        self,
        phase: str,
        step: str,
        j: int,
        stream: str,
        deps: list[str],
        reverse: bool,
    ) -> Task:
        """One all-to-all chunk; `reverse` sends expert outputs back to their token owners."""
        tid = self._id(phase, step, j)
        coll = f"L{self.lid}/{phase}/{step}.{j}"
        common: dict[str, Any] = dict(
            deps=deps,
            group=self.group,
            coll=coll,
            algo=self.algo,
            tags=self._tags(phase, step, j),
        )
        if self.s.uniform:
            t = Task(tid, self.rank, stream, "all_to_all", bytes=self.s.a2a_bytes[j], **common)
        else:
            m = self.s.split[j].T if reverse else self.s.split[j]
            send, recv = m[self.rank], m[:, self.rank]
            t = Task(
                tid,
                self.rank,
                stream,
                "all_to_allv",
                bytes=float(send.sum()),
                split=send.tolist(),
                recv_split=recv.tolist(),
                **common,
            )
        return t

    def _expert_shapes(self, j: int) -> tuple[dict, dict, float]:
        l = self.l
        rows = float(self.s.rows[j][self.rank])
        if self.s.uniform:
            m = int(rows) // l.local_experts  # P * (the chunk's capacity slots)
            fc1 = {"batch": l.local_experts, "m": m, "n": l.hidden_dim, "k": l.model_dim}
            fc2 = {"batch": l.local_experts, "m": m, "n": l.model_dim, "k": l.hidden_dim}
        else:
            fc1 = {"batch": 1, "m": int(rows), "n": l.hidden_dim, "k": l.model_dim}
            fc2 = {"batch": 1, "m": int(rows), "n": l.model_dim, "k": l.hidden_dim}
        return fc1, fc2, rows

    def _gemm_bytes(self, s: dict, weights: bool = True) -> float:
        b, m, n, k = s["batch"], s["m"], s["n"], s["k"]
        return float(self.l.elem * b * (m * k + m * n + (k * n if weights else 0)))

    # -- passes --------------------------------------------------------------------------
    def pass_(self, phase: str, seq: list[tuple[str, int, str]]) -> None:
        """One pass of the layer on this rank: `forward` or `backward`; `seq` is the issue
        order of the exchanges (`sim.strategies.chunking.comm_order`)."""
        if phase == "fwd":
            self.forward(seq)
        else:
            self.backward(seq)

    def _gate_costs(self, fwd: bool) -> tuple[float, float, float]:
        """The gate's FLOPs (its gradient twice the forward's) and bytes, and the bytes of
        the padded [E, C, M] buffer the encode writes and the decode reads."""
        l, e, T, M = self.l, self.l.elem, self.l.tokens, self.l.model_dim
        gate_flops = 2.0 * T * M * l.experts * (1 if fwd else 2)
        gate_bytes = float(e * (T * M + M * l.experts) + 4 * T * l.experts)
        return gate_flops, gate_bytes, float(e * l.experts * l.capacity * M)

    def forward(self, seq: list[tuple[str, int, str]]) -> None:
        """gate -> encode -> per chunk (0..r-1): dispatch, fc1, fc2, combine -> decode."""
        l, e, T, M = self.l, self.l.elem, self.l.tokens, self.l.model_dim
        gate_flops, gate_bytes, buf = self._gate_costs(fwd=True)
        gate = self._compute("fwd", "gate", "gate", gate_flops, gate_bytes, [])
        head = self._compute("fwd", "encode", "encode", 0.0, float(e * T * M) + buf, [gate])
        chunks = list(range(self.r))
        steps = ("dispatch", "combine")
        tail = self._chunks("fwd", seq, chunks, head, steps, self._experts_forward)
        self._compute(
            "fwd", "decode", "decode", float(2 * T * M * l.top_k), buf + float(e * T * M), tail
        )

    def backward(self, seq: list[tuple[str, int, str]]) -> None:
        """The forward mirrored, chunks in reverse (Tutel): decode gradient -> per chunk:
        combine gradient, fc2 and fc1 dgrad + wgrad, dispatch gradient -> encode gradient ->
        gate gradient."""
        e, T, M = self.l.elem, self.l.tokens, self.l.model_dim
        gate_flops, gate_bytes, buf = self._gate_costs(fwd=False)
        head = self._compute("bwd", "decode_grad", "encode", 0.0, float(e * T * M) + buf, [])
        chunks = list(reversed(range(self.r)))
        steps = ("combine_grad", "dispatch_grad")
        tail = self._chunks("bwd", seq, chunks, head, steps, self._experts_backward)
        enc = self._compute("bwd", "encode_grad", "decode", 0.0, buf + float(e * T * M), tail)
        self._compute("bwd", "gate_grad", "gate", gate_flops, gate_bytes, [enc])

    def _chunks(
        self,
        phase: str,
        seq: list[tuple[str, int, str]],
        chunks: list[int],
        head: str,
        steps: tuple[str, str],
        experts: Callable[[str, int, str], str],
    ) -> list[str]:
        """The chunked middle of a pass: each chunk's first exchange (after `head`), its
        expert steps (`experts`: the last one's id), its second exchange. Comm tasks are
        created first and queued in issue order at the end: the second exchange of a chunk
        depends on expert tasks that must exist by id first. The second exchanges' ids, in
        the order chunks are processed."""
        first_step, second_step = steps
        comm_plan = [(what, chunks[j], stream) for what, j, stream in seq]
        comm: dict[tuple[str, int], tuple[str, Task]] = {}
        for what, j, stream in comm_plan:
            if what == "first":  # dispatch, and its gradient's way: to experts
                task = self._exchange(phase, first_step, j, stream, [head], reverse=False)
                comm[(what, j)] = (stream, task)
        expert_last = {j: experts(phase, j, comm[("first", j)][1].id) for j in chunks}
        for what, j, stream in comm_plan:
            if what == "second":  # combine, and its gradient's way: to tokens
                deps = [expert_last[j]]
                comm[(what, j)] = (
                    stream,
                    self._exchange(phase, second_step, j, stream, deps, reverse=True),
                )
        for what, j, _stream in comm_plan:
            stream, task = comm[(what, j)]
            self._add(stream, task)
        return [comm[("second", j)][1].id for j in chunks]

    def _experts_forward(self, phase: str, j: int, got: str) -> str:
        """fc1 then fc2 of chunk `j` once its tokens arrived (`got`); the last one's id."""
        fc1, fc2, _ = self._expert_shapes(j)
        f1 = 2.0 * fc1["batch"] * fc1["m"] * fc1["n"] * fc1["k"]
        f2 = 2.0 * fc2["batch"] * fc2["m"] * fc2["n"] * fc2["k"]
        a = self._compute(phase, "fc1", "gemm", f1, self._gemm_bytes(fc1), [got], j, fc1)
        return self._compute(phase, "fc2", "gemm", f2, self._gemm_bytes(fc2), [a], j, fc2)

    def _experts_backward(self, phase: str, j: int, got: str) -> str:
        """dgrad and wgrad of fc2 then fc1 (twice the forward GEMM work) of chunk `j` once
        its gradient arrived (`got`); the last one's id."""
        fc1, fc2, _ = self._expert_shapes(j)
        f1 = 2.0 * fc1["batch"] * fc1["m"] * fc1["n"] * fc1["k"]
        f2 = 2.0 * fc2["batch"] * fc2["m"] * fc2["n"] * fc2["k"]
        b1, b2 = self._gemm_bytes(fc1), self._gemm_bytes(fc2)
        d2 = self._compute(phase, "fc2_dgrad", "gemm", f2, b2, [got], j, dgrad_shape(fc2))
        w2 = self._compute(phase, "fc2_wgrad", "gemm", f2, b2, [d2], j, wgrad_shape(fc2))
        d1 = self._compute(phase, "fc1_dgrad", "gemm", f1, b1, [w2], j, dgrad_shape(fc1))
        return self._compute(phase, "fc1_wgrad", "gemm", f1, b1, [d1], j, wgrad_shape(fc1))

    def tensors(self) -> dict[str, float]:
        """Bytes of the layer's tensors on this rank: T_I and T_O are the padded [E, C, M]
        buffer the encode writes and the decode reads; the experts' rows are the chunks'."""
        l = self.l
        rows = float(sum(r[self.rank] for r in self.s.rows))
        return layer_tensors(l.experts * l.capacity, rows, l.model_dim, l.hidden_dim, l.elem)
