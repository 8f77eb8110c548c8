"""Collectives as phases of point-to-point flows.

A collective becomes a list of phases; a phase starts when the previous one has finished on
every member (a conservative barrier between algorithm steps). A phase is either a uniform
exchange among a member set (eligible for bundling) or explicit (src, dst, bytes) arrays.

Algorithms here are the baseline ones each kind needs: linear all-to-all (NCCL grouped
send/recv), explicit all-to-allv, ring all-gather / reduce-scatter / all-reduce, linear
broadcast from the first member. Further algorithms (pairwise, 2DH, rail relay, hierarchical
rings) plug in through ALGORITHMS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.errors import GraphError
from sim.graph import Task


@dataclass
class UniformPhase:
    """Every member sends `per_pair` bytes to every other member."""

    members: np.ndarray
    per_pair: float


@dataclass
class ExplicitPhase:
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray


Phase = UniformPhase | ExplicitPhase


def _group(t: Task) -> np.ndarray:
    return np.asarray(t.group, dtype=np.int64)


def all_to_all_linear(tasks: list[Task]) -> list[Phase]:
    t = tasks[0]
    n = len(t.group)  # type: ignore[arg-type]
    # task.bytes is the whole send buffer, the rank's own chunk included (stays local).
    return [UniformPhase(_group(t), t.bytes / n)]


def all_to_allv_linear(tasks: list[Task]) -> list[Phase]:
    group = _group(tasks[0])
    src, dst, nb = [], [], []
    for t in tasks:
        src.append(np.full(len(group), t.rank))
        dst.append(group)
        nb.append(np.asarray(t.split, dtype=float))
    return [ExplicitPhase(np.concatenate(src), np.concatenate(dst), np.concatenate(nb))]


def _ring(tasks: list[Task], steps: int, chunk: float) -> list[Phase]:
    group = _group(tasks[0])
    nxt = np.roll(group, -1)
    return [ExplicitPhase(group, nxt, np.full(len(group), chunk)) for _ in range(steps)]


def all_gather_ring(tasks: list[Task]) -> list[Phase]:
    n = len(tasks[0].group)  # type: ignore[arg-type]
    return _ring(tasks, n - 1, tasks[0].bytes)  # bytes = this rank's input shard


def reduce_scatter_ring(tasks: list[Task]) -> list[Phase]:
    n = len(tasks[0].group)  # type: ignore[arg-type]
    return _ring(tasks, n - 1, tasks[0].bytes / n)  # bytes = the full input buffer


def all_reduce_ring(tasks: list[Task]) -> list[Phase]:
    n = len(tasks[0].group)  # type: ignore[arg-type]
    return _ring(tasks, 2 * (n - 1), tasks[0].bytes / n)


def broadcast_linear(tasks: list[Task]) -> list[Phase]:
    group = _group(tasks[0])
    root = group[0]
    others = group[group != root]
    return [ExplicitPhase(np.full(len(others), root), others, np.full(len(others), tasks[0].bytes))]


ALGORITHMS: dict[tuple[str, str], Callable[[list[Task]], list[Phase]]] = {
    ("all_to_all", "linear"): all_to_all_linear,
    ("all_to_allv", "linear"): all_to_allv_linear,
    ("all_gather", "ring"): all_gather_ring,
    ("reduce_scatter", "ring"): reduce_scatter_ring,
    ("all_reduce", "ring"): all_reduce_ring,
    ("broadcast", "linear"): broadcast_linear,
}
DEFAULT_ALGO = {
    "all_to_all": "linear",
    "all_to_allv": "linear",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "all_reduce": "ring",
    "broadcast": "linear",
}


def phases(tasks: list[Task]) -> list[Phase]:
    """Decompose a collective (its member tasks) into flow phases."""
    t = tasks[0]
    algo = t.algo or DEFAULT_ALGO[t.kind]
    fn = ALGORITHMS.get((t.kind, algo))
    if fn is None:
        known = sorted(a for k, a in ALGORITHMS if k == t.kind)
        raise GraphError(f"task {t.id!r}: {t.kind} has no algorithm {algo!r} (known: {known})")
    return fn(tasks)


def payload(t: Task) -> float:
    """Bytes per rank for collective-level alpha-beta costs (PipeMoE Eq. 16's y)."""
    if t.kind == "all_to_allv":
        return float(sum(t.split or ()))
    return float(t.bytes)
