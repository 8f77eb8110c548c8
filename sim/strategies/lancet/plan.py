"""Lancet's choice of partition ranges and partition count (Sec. 5.1) for a model of blocks.

The forward pass of one rank is laid out as Lancet's instruction sequence: each block's
operators in program order, and in a MoE block the layer as gate, encode, dispatch, experts,
combine, decode. For every partition count k (1..K) the range DP
(`sim.strategies.lancet.ranges.best_segments`) picks the segments; a segment holding a MoE
layer's dispatch, experts and combine is partitioned k ways and pipelined, its cost the
pipeline simulation of its partitions' times (compute from the run's cost model on the
partitioned operators, all-to-alls from its collective model on the partition's bytes). The
best k wins. Limits:
- every MoE layer is in exactly one pipeline with the chosen k (the layer is built once with
  k chunks; k = 1 is the plain layer), and a pipeline holds one MoE layer;
- a pipeline with any batch-partitioned operator needs k <= batch (sequences per GPU), one
  of only dispatch..combine (Tutel's capacity chunks) k <= capacity;
- gate `batch_prioritized` ranks the whole batch's tokens: the gate and what comes before it
  stay whole, so a pipeline starts at the encode at the earliest (only after, Fig. 4(c));
  `switch` routes each token alone: before and after (Fig. 4(d));
- partitioning computation without an all-to-all only adds launch overhead: no such segment.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sim.core.graph import Task
from sim.strategies.chunking import ChunkSizes, chunk_sizes
from sim.strategies.lancet.capacity import batch_bounds, partition_sizes
from sim.strategies.lancet.ranges import best_segments, pipeline_time
from sim.strategies.layer import build_layer
from sim.strategies.model.builder import block_ops
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer

GATES = ("switch", "batch_prioritized")
MAX_PARTITIONS = 8  # the paper's K (Sec. 6: "we set the maximum number of partitions to 8")
MOE_STEPS = ("gate", "encode", "dispatch", "experts", "combine", "decode")
PIPE_CORE = ("dispatch", "experts", "combine")  # never left whole, never cut apart


@dataclass(frozen=True)
class Instr:
    block: int
    step: str  # a forward op's name, or one of MOE_STEPS
    comm: bool = False
    moe: bool = False  # in a MoE block (its ops differ from a dense block's)


@dataclass
class Plan:
    """k partitions; per MoE block, the steps its pipeline partitions along the batch (the
    MoE layer's own dispatch..combine are its k chunks); the DP's estimate per candidate."""

    k: int
    ranges: dict[int, tuple[list[tuple[int, str]], list[tuple[int, str]]]] = field(
        default_factory=dict
    )
    baseline: bool = False  # the plain layer of k capacity chunks won: nothing to rewrite
    estimate: dict[str, float] = field(default_factory=dict)


def instructions(blocks: BlockModel, layer: MoELayer) -> list[Instr]:
    """The forward sequence of one rank, in the model builder's program order."""
    out: list[Instr] = []
    for b in range(blocks.n):
        moe = blocks.is_moe(b)
        ops = block_ops(blocks, layer, moe)
        names = [op.name for part in ("attn", "res1", "ln2", "ffn") for op in ops[part]]
        out += [Instr(b, s, moe=moe) for s in names]
        if moe:
            out += [Instr(b, s, s in ("dispatch", "combine"), True) for s in MOE_STEPS]
        out.append(Instr(b, "res2", moe=moe))
    return out


def scale(t: Task, frac: float) -> Task:
    """A batch partition holding `frac` of a GPU's sequences: the work and the activations
    shrink, a GEMM's weights do not (its rows, or its batch of heads, shrink)."""
    s = t.shape
    if t.kind == "gemm" and s and {"m", "n", "k"} <= s.keys():
        b0, m0, n0, k0 = s.get("batch", 1), s["m"], s["n"], s["k"]
        full = b0 * (m0 * k0 + k0 * n0 + m0 * n0)
        if b0 > 1:
            shape = dict(s) | {"batch": round(b0 * frac)}
        else:
            shape = dict(s) | {"m": round(m0 * frac)}
        b, m = shape.get("batch", 1), shape["m"]
        part = b * (m * k0 + k0 * n0 + m * n0)
        rows = b * m / (b0 * m0)
        return replace(t, shape=shape, flops=t.flops * rows, bytes=t.bytes * part / full)
    return replace(t, flops=t.flops * frac, bytes=t.bytes * frac)


def fractions(batch: int, k: int) -> list[float]:
    bounds = batch_bounds(batch, k)
    return [(hi - lo) / batch for lo, hi in zip(bounds, bounds[1:])]


def _op_tasks(blocks: BlockModel, layer: MoELayer, moe: bool) -> dict[str, Task]:
    ops = block_ops(blocks, layer, moe)
    tags = {"dtype": layer.dtype, "phase": "fwd"}
    return {
        op.name: Task(
            f"plan/{op.name}",
            0,
            "compute",
            op.kind,
            flops=op.flops,
            bytes=op.bytes,
            shape=dict(op.shape) if op.shape else None,
            tags=dict(tags, step=op.name),
        )
        for part in ops.values()
        for op in part
    }


def _moe_durations(
    layer: MoELayer,
    k: int,
    algo: str | None,
    duration: Callable[[Task], float],
    sizes: ChunkSizes | None = None,
) -> dict[str, list[float]]:
    """Per MoE step, its k partitions' times: the slowest rank's (even routing: any rank)."""
    sizes = sizes or partition_sizes(layer, k)
    g = build_layer(
        layer, degree=k, order="tutel", passes=("fwd",), strategy="lancet", algo=algo, sizes=sizes
    )
    fr = fractions(layer.batch, k)
    out = {s: [0.0] * k for s in MOE_STEPS}
    ranks = [0] if layer.uniform else range(layer.world)
    for r in ranks:
        for step in ("gate", "encode", "decode"):
            t = g.tasks[f"r{r}/L0/fwd/{step}"]
            for j in range(k):
                out[step][j] = max(out[step][j], duration(scale(t, fr[j])))
        for j in range(k):
            ex = sum(duration(g.tasks[f"r{r}/L0/fwd/{s}.{j}"]) for s in ("fc1", "fc2"))
            out["experts"][j] = max(out["experts"][j], ex)
            for s in ("dispatch", "combine"):
                out[s][j] = max(out[s][j], duration(g.tasks[f"r{r}/L0/fwd/{s}.{j}"]))
    return out


def choose(
    blocks: BlockModel,
    layer: MoELayer,
    duration: Callable[[Task], float],
    ks: list[int],
    gate: str,
    algo: str | None = None,
    baseline: int | None = None,
) -> Plan:
    """The best plan over the partition counts `ks` (module docstring); with `baseline`, the
    plain layer of that many capacity chunks (Tutel's) is a candidate too, so the plan is
    never worse than it by the same estimate."""
    seq = instructions(blocks, layer)
    ops = {moe: _op_tasks(blocks, layer, moe) for moe in (False, True)}
    best: Plan | None = None
    best_t = math.inf
    estimate: dict[str, float] = {}
    moe_whole = {s: d[0] for s, d in _moe_durations(layer, 1, algo, duration).items()}
    whole = [
        moe_whole[i.step] if i.step in moe_whole else duration(ops[i.moe][i.step]) for i in seq
    ]
    cands = [(k, False) for k in ks] + ([(baseline, True)] if baseline else [])
    for k, plain in cands:
        if k > layer.capacity:
            continue
        fr = fractions(layer.batch, k)
        sizes = chunk_sizes(layer, k) if plain else partition_sizes(layer, k)
        moe_d = _moe_durations(layer, k, algo, duration, sizes)
        durs = [
            moe_d[i.step]
            if i.step in MOE_STEPS
            else [duration(scale(ops[i.moe][i.step], f)) for f in fr]
            for i in seq
        ]
        seg = _segment_cost(seq, durs, whole, k, 0 if plain else layer.batch, gate)
        total, segs = best_segments(len(seq), seg, _max_len(seq))
        estimate[f"tutel {k}" if plain else f"k={k}"] = total
        if total < best_t:
            best_t = total
            best = Plan(k, _ranges(seq, segs) if k > 1 else {}, baseline=plain)
    if best is None:  # no k fits (e.g. capacity 1): the plain layer
        best = Plan(1, {}, baseline=True)
    best.estimate = estimate
    return best


def _segment_cost(
    seq: list[Instr],
    durs: list[list[float]],
    whole: list[float],
    k: int,
    batch: int,
    gate: str,
) -> Callable[[int, int], float]:
    cache: dict[tuple, float] = {}
    n = len(seq)
    ncore = [0] * (n + 1)  # core instructions before each index
    for x, ins in enumerate(seq):
        ncore[x + 1] = ncore[x] + (ins.step in PIPE_CORE)
    nxt = [n] * (n + 1)  # the first core instruction at or after each index
    for x in range(n - 1, -1, -1):
        nxt[x] = x if seq[x].step in PIPE_CORE else nxt[x + 1]
    ids: dict[tuple[bool, str], int] = {}
    sig = [ids.setdefault((ins.moe, ins.step), len(ids)) for ins in seq]
    kinds = [ins.comm for ins in seq]

    def cost(i: int, m: int) -> float:
        cores = ncore[m] - ncore[i]
        if not cores:
            return whole[i] if m == i + 1 else math.inf
        d = nxt[i]
        if cores != 3 or seq[d].step != "dispatch" or d + 3 > m:
            return math.inf  # a MoE layer cut apart, or two in one pipeline
        if m - i > 3 and k > batch:
            return math.inf  # batch 0: the plain layer, nothing around it partitioned
        if gate == "batch_prioritized" and i < d - 1:
            return math.inf  # the gate (and before) stays whole
        key = tuple(sig[i:m])
        t = cache.get(key)
        if t is None:
            t = cache[key] = pipeline_time(kinds[i:m], durs[i:m])
        return t

    return cost


def _max_len(seq: list[Instr]) -> int:
    """The paper's range limit: the instructions from one MoE layer to the next."""
    at = [i for i, s in enumerate(seq) if s.step == "dispatch"]
    gaps = [b - a for a, b in zip(at, at[1:])] or [len(seq)]
    return min(len(seq), max(gaps) + len(MOE_STEPS))


def _ranges(
    seq: list[Instr], segs: list[tuple[int, int]]
) -> dict[int, tuple[list[tuple[int, str]], list[tuple[int, str]]]]:
    """Per MoE block, the (block, step) instructions its pipeline partitions along the batch,
    before its dispatch and after its combine."""
    out: dict[int, tuple[list[tuple[int, str]], list[tuple[int, str]]]] = {}
    for i, m in segs:
        if m - i < 3:
            continue
        d = next(x for x in range(i, m) if seq[x].step == "dispatch")
        pre = [(seq[x].block, seq[x].step) for x in range(i, d)]
        post = [(seq[x].block, seq[x].step) for x in range(d + 3, m)]
        if pre or post:
            out[seq[d].block] = (pre, post)
    return out
