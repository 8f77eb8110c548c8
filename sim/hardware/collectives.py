"""Collectives as phases of point-to-point flows.

A collective becomes a list of phases; a phase starts when the previous one has finished on
every member (a conservative barrier between algorithm steps). A phase is either a uniform
exchange among a member set (eligible for bundling) or explicit (src, dst, bytes) arrays.

Algorithms (a task's `algo` picks one; ALGORITHMS lists them): all-to-all linear (NCCL
grouped send/recv: every peer at once), pairwise (n-1 ordered rounds), 2dh (Tutel) and
rail_relay (NCCL PXN); all-to-allv linear, sized (count exchange first), rail_relay and
deepep (DeepEP's normal kernels: per-node dedup over RDMA to a same-local-rank forwarder,
then NVLink); ring
all-gather / reduce-scatter / all-reduce; hierarchical all-reduce; linear broadcast from the
first member, and ring broadcast (pipelined in chunks along the member order, as NCCL's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.core.errors import GraphError
from sim.core.graph import Task
from sim.hardware.topology import Topology


@dataclass
class UniformPhase:
    """Every member sends `per_pair` bytes to every other member `pairs` covers: all of them,
    those on its own node ("intra"), or those with its local index on other nodes ("rail").
    `relay` routes inter-node messages through the source node's GPU on the destination's
    rail first (NCCL PXN)."""

    members: np.ndarray
    per_pair: float
    pairs: str = "all"
    relay: bool = False


@dataclass
class ExplicitPhase:
    """One phase of a collective as explicit (src, dst, bytes) flows."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    relay: bool = False


@dataclass
class LocalPhase:
    """A local memory copy of `nbytes` (read + write) on every member, e.g. 2DH's stride copy."""

    nbytes: float


Phase = UniformPhase | ExplicitPhase | LocalPhase


def _group(t: Task) -> np.ndarray:
    return np.asarray(t.group, dtype=np.int64)


def _size(t: Task) -> int:
    """Members of the task's group (every collective has one: sim.core.graph_checks)."""
    assert t.group is not None
    return len(t.group)


def _layout(t: Task, topo: Topology) -> tuple[int, int]:
    return _layout_of(t, topo.gpus_per_node)


def _layout_of(t: Task, G: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a group made of whole nodes' worth of local ranks (G each)."""
    g = np.sort(_group(t))
    nodes, locs = np.unique(g // G), np.unique(g % G)
    full = (nodes[:, None] * G + locs[None, :]).ravel()
    if len(nodes) * len(locs) != len(g) or not np.array_equal(g, full):
        raise GraphError(
            f"task {t.id!r}: {t.kind} algorithm {t.algo!r} needs a group of the same local "
            f"ranks on every node it spans (nodes x locals), got {len(g)} ranks"
        )
    return len(nodes), len(locs)


def all_to_all_linear(tasks: list[Task], topo: Topology) -> list[Phase]:
    t = tasks[0]
    n = _size(t)
    # task.bytes is the whole send buffer, the rank's own chunk included (stays local).
    return [UniformPhase(_group(t), t.bytes / n)]


def all_to_all_rail_relay(tasks: list[Task], topo: Topology) -> list[Phase]:
    t = tasks[0]
    return [UniformPhase(_group(t), t.bytes / _size(t), relay=True)]


def all_to_all_pairwise(tasks: list[Task], topo: Topology) -> list[Phase]:
    """n-1 rounds; in round k member i sends to member (i + k) mod n."""
    g = _group(tasks[0])
    n = len(g)
    per = tasks[0].bytes / n
    return [ExplicitPhase(g, np.roll(g, -k), np.full(n, per)) for k in range(1, n)]


def all_to_all_2dh(tasks: list[Task], topo: Topology) -> list[Phase]:
    """Tutel's two-dimensional hierarchical all-to-all (Alg. 3 / Fig. 15): stride copy,
    intra-node all-to-all (S/m to each of the m-1 local peers), stride copy, inter-node
    all-to-all among same-local-rank GPUs (n/m - 1 messages of m*S/n each).

    The stride copies are the algorithm's own steps (Tutel Sec. 3.4: "additional phases that
    conduct efficient stride memory copies"; Alg. 3's strideMemcpy before each exchange):
    each is a kernel reading and writing the whole per-GPU buffer, timed as a d2d copy of
    2*S bytes (GPU memory bandwidth plus the kernel launch). Alg. 3 needs no third copy: the
    inter-node exchange lands chunks in source-rank order. The exchanges are uniform phases
    like the linear algorithm's, so they pay the same per-message and per-connection costs."""
    t = tasks[0]
    nodes, m = _layout(t, topo)
    n, S, g = _size(t), t.bytes, _group(t)
    phases: list[Phase] = [LocalPhase(S)]
    if m > 1:
        phases.append(UniformPhase(g, S / m, pairs="intra"))
    phases.append(LocalPhase(S))
    if nodes > 1:
        phases.append(UniformPhase(g, m * S / n, pairs="rail"))
    return phases


def all_to_allv_linear(tasks: list[Task], topo: Topology, relay: bool = False) -> list[Phase]:
    group = _group(tasks[0])
    src, dst, nb = [], [], []
    for t in tasks:
        src.append(np.full(len(group), t.rank))
        dst.append(group)
        nb.append(np.asarray(t.split, dtype=float))
    return [ExplicitPhase(np.concatenate(src), np.concatenate(dst), np.concatenate(nb), relay)]


def all_to_allv_sized(tasks: list[Task], topo: Topology) -> list[Phase]:
    """Lancet Fig. 10 / Megatron: an all-to-all of per-peer counts, then the data exchange."""
    count_bytes = float(tasks[0].tags.get("count_bytes", 8))
    return [UniformPhase(_group(tasks[0]), count_bytes), *all_to_allv_linear(tasks, topo)]


def all_to_allv_rail_relay(tasks: list[Task], topo: Topology) -> list[Phase]:
    return all_to_allv_linear(tasks, topo, relay=True)


def all_to_allv_deepep(tasks: list[Task], topo: Topology) -> list[Phase]:
    """DeepEP's normal dispatch (tag deepep: dispatch) or combine (deepep: combine) as one
    phase, since its kernel pipelines the RDMA and NVLink legs in chunks. Dispatch: a token
    owner p sends `split[q]` bytes to each GPU q of its own node over NVLink, and
    `tags.node_bytes[n]` once to each other node n, to the GPU with its local index (RDMA);
    that forwarder copies each GPU q of its node what p's tokens owe q (p's split[q]) over
    NVLink. Combine runs the same flows reversed (the member's split is then what it returns
    to each owner; node_bytes are still its own tokens' rows, reduced at the forwarder)."""
    return [deepep_flows(tasks, topo.gpus_per_node)]


def deepep_flows(tasks: list[Task], gpus_per_node: int) -> ExplicitPhase:
    """The flows of `all_to_allv_deepep` on nodes of `gpus_per_node` GPUs (the executor's
    DeepEP stand-in checks the bytes of its two stages against them)."""
    nodes, m = _layout_of(tasks[0], gpus_per_node)
    g = _group(tasks[0])
    by_rank = {t.rank: t for t in tasks}
    order = np.sort(g)
    W = len(order)
    pos = {int(r): i for i, r in enumerate(order)}
    gi = np.searchsorted(order, g)  # member order -> sorted order
    combine = tasks[0].tags.get("deepep") == "combine"
    D = np.zeros((W, W))  # [owner, expert GPU] bytes, sorted member order
    Nb = np.zeros((W, nodes))  # [owner, node] bytes
    for r, t in by_rank.items():
        row = np.zeros(W)
        row[gi] = np.asarray(t.split, dtype=float)
        if combine:
            D[:, pos[r]] = row
        else:
            D[pos[r]] = row
        nb_r = t.tags.get("node_bytes", [0.0] * nodes)
        if not isinstance(nb_r, list) or len(nb_r) != nodes:
            raise GraphError(
                f"task {t.id!r}: tags.node_bytes: expected a list of {nodes} byte counts "
                f"(one per node of its group), got {nb_r!r}"
            )
        Nb[pos[r]] = np.asarray(nb_r, dtype=float)
    node = np.arange(W) // m  # sorted member order is node-major, local-minor
    loc = np.arange(W) % m
    same = node[:, None] == node[None, :]
    src, dst, nb = [], [], []
    # direct NVLink copies inside the owner's node
    ps, qs = np.nonzero(same & ~np.eye(W, dtype=bool) & (D > 0))
    src.append(ps)
    dst.append(qs)
    nb.append(D[ps, qs])
    # RDMA: owner -> forwarder (node n, owner's local index), once per (token, node)
    p_i, n_i = np.nonzero((Nb > 0) & (np.arange(nodes)[None, :] != node[:, None]))
    src.append(p_i)
    dst.append(n_i * m + loc[p_i])
    nb.append(Nb[p_i, n_i])
    # NVLink forward: forwarder f -> q on its node, what remote owners of f's local index owe q
    remote = ~same
    fwd = np.zeros((W, W))
    for f in range(W):
        owners = remote[:, f] & (loc == loc[f])
        fwd[f] = D[owners].sum(axis=0) * (node == node[f])
    fwd[np.arange(W), np.arange(W)] = 0.0
    fs, qs2 = np.nonzero(fwd > 0)
    src.append(fs)
    dst.append(qs2)
    nb.append(fwd[fs, qs2])
    s, d, b = (np.concatenate(x) for x in (src, dst, nb))
    if combine:
        s, d = d, s
    return ExplicitPhase(order[s], order[d], b)


def _ring(tasks: list[Task], steps: int, chunk: float) -> list[Phase]:
    group = _group(tasks[0])
    nxt = np.roll(group, -1)
    return [ExplicitPhase(group, nxt, np.full(len(group), chunk)) for _ in range(steps)]


def all_gather_ring(tasks: list[Task], topo: Topology) -> list[Phase]:
    n = _size(tasks[0])
    return _ring(tasks, n - 1, tasks[0].bytes)  # bytes = this rank's input shard


def reduce_scatter_ring(tasks: list[Task], topo: Topology) -> list[Phase]:
    n = _size(tasks[0])
    return _ring(tasks, n - 1, tasks[0].bytes / n)  # bytes = the full input buffer


def all_reduce_ring(tasks: list[Task], topo: Topology) -> list[Phase]:
    n = _size(tasks[0])
    return _ring(tasks, 2 * (n - 1), tasks[0].bytes / n)


def all_reduce_hierarchical(tasks: list[Task], topo: Topology) -> list[Phase]:
    """Reduce-scatter inside each node (ring), all-reduce of the 1/m shard across nodes among
    same-local-rank GPUs (ring), all-gather inside each node (ring)."""
    t = tasks[0]
    nodes, m = _layout(t, topo)
    S, G = t.bytes, topo.gpus_per_node
    g = np.sort(_group(t))
    node_of, loc = g // G, g % G
    locs, node_ids = np.unique(loc), np.unique(node_of)
    # next member on the intra-node ring and on the cross-node ring
    li = np.searchsorted(locs, loc)
    ni = np.searchsorted(node_ids, node_of)
    intra_next = node_of * G + locs[(li + 1) % m]
    inter_next = node_ids[(ni + 1) % nodes] * G + loc
    phases: list[Phase] = []
    if m > 1:
        phases += [ExplicitPhase(g, intra_next, np.full(len(g), S / m)) for _ in range(m - 1)]
    if nodes > 1:
        chunk = S / m / nodes
        phases += [
            ExplicitPhase(g, inter_next, np.full(len(g), chunk)) for _ in range(2 * (nodes - 1))
        ]
    if m > 1:
        phases += [ExplicitPhase(g, intra_next, np.full(len(g), S / m)) for _ in range(m - 1)]
    return phases


def broadcast_linear(tasks: list[Task], topo: Topology) -> list[Phase]:
    group = _group(tasks[0])
    root = group[0]
    others = group[group != root]
    return [ExplicitPhase(np.full(len(others), root), others, np.full(len(others), tasks[0].bytes))]


# Ring broadcast chunk: NCCL's default 4 MiB buffer (NCCL_BUFFSIZE) over its 8 pipeline slots
# (NCCL_STEPS) moves 512 KiB per step (assumed: NCCL's defaults, not measured here); the chunk
# count is capped so that a huge broadcast stays a bounded number of phases.
RING_CHUNK_BYTES = 512 * 1024
RING_MAX_CHUNKS = 128


def ring_broadcast_chunks(nbytes: float) -> int:
    return max(1, min(RING_MAX_CHUNKS, math.ceil(nbytes / RING_CHUNK_BYTES)))


def broadcast_ring(tasks: list[Task], topo: Topology) -> list[Phase]:
    """Pipelined chain from the first member along the group's order: k chunks, phase p
    moves chunk p - i over hop i (member i -> i + 1), so (k + n - 2) phases of bytes / k."""
    g = _group(tasks[0])
    n = len(g)
    if n < 2:
        return []
    k = ring_broadcast_chunks(tasks[0].bytes)
    chunk = tasks[0].bytes / k
    out: list[Phase] = []
    for p in range(k + n - 2):
        hops = np.arange(max(0, p - k + 1), min(n - 2, p) + 1)
        out.append(ExplicitPhase(g[hops], g[hops + 1], np.full(len(hops), chunk)))
    return out


ALGORITHMS: dict[tuple[str, str], Callable[[list[Task], Topology], list[Phase]]] = {
    ("all_to_all", "linear"): all_to_all_linear,
    ("all_to_all", "pairwise"): all_to_all_pairwise,
    ("all_to_all", "2dh"): all_to_all_2dh,
    ("all_to_all", "rail_relay"): all_to_all_rail_relay,
    ("all_to_allv", "linear"): all_to_allv_linear,
    ("all_to_allv", "sized"): all_to_allv_sized,
    ("all_to_allv", "rail_relay"): all_to_allv_rail_relay,
    ("all_to_allv", "deepep"): all_to_allv_deepep,
    ("all_gather", "ring"): all_gather_ring,
    ("reduce_scatter", "ring"): reduce_scatter_ring,
    ("all_reduce", "ring"): all_reduce_ring,
    ("all_reduce", "hierarchical"): all_reduce_hierarchical,
    ("broadcast", "linear"): broadcast_linear,
    ("broadcast", "ring"): broadcast_ring,
}
DEFAULT_ALGO = {
    "all_to_all": "linear",
    "all_to_allv": "linear",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "all_reduce": "ring",
    "broadcast": "linear",
}


def algorithms(kind: str) -> list[str]:
    return sorted(a for k, a in ALGORITHMS if k == kind)


# collectives whose output is another buffer than their input (torch's all_to_all_single,
# all_gather_into_tensor, reduce_scatter_tensor): with one rank, NCCL copies the one into the
# other (an H200 measured a one-rank all_to_all end with the full-GPU GEMM beside it,
# reports/gpu-h200-2026-11-27). torch's all_reduce and broadcast work in place: nothing.
OUT_OF_PLACE = frozenset({"all_to_all", "all_to_allv", "all_gather", "reduce_scatter"})


def phases(tasks: list[Task], topo: Topology) -> list[Phase]:
    """Decompose a collective (its member tasks) into flow phases; a one-rank collective is
    a local copy of its payload where its output is another buffer (OUT_OF_PLACE), else
    nothing."""
    t = tasks[0]
    if t.group is not None and len(t.group) == 1:
        return [LocalPhase(payload(t))] if t.kind in OUT_OF_PLACE and payload(t) > 0 else []
    algo = t.algo or DEFAULT_ALGO[t.kind]
    fn = ALGORITHMS.get((t.kind, algo))
    if fn is None:
        raise GraphError(
            f"task {t.id!r}: {t.kind} has no algorithm {algo!r} (known: {algorithms(t.kind)})"
        )
    return fn(tasks, topo)


def payload(t: Task) -> float:
    """Bytes per rank for collective-level alpha-beta costs (PipeMoE Eq. 16's y)."""
    if t.kind == "all_to_allv":
        return float(sum(t.split or ()))
    return float(t.bytes)
