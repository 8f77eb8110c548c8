"""Parallel layouts beyond pure expert parallelism, as seen by the shared layer builder.

DeepSpeed TED (`sim.strategies.ted`) and Tutel's switchable parallelism P1 / P2
(`sim.strategies.tutel`) move padded [E, C, M] buffers and run expert GEMMs whose shapes an
expert-parallel layer with other sizes has exactly. `ep_view` is that layer: the builder in
`sim.strategies.layer` costs its all-to-alls, expert GEMMs and activation memory, and the
layout adds its own communication around them (parameter all-gather, TP all-gather, ...).

- Tutel P1 (EP + DP, ZeRO-style slices): expert e's n = W/E replicas each take C/n of every
  GPU's capacity slots for e, so the exchange is EP over W "virtual experts" of capacity
  ceil(C/n) (Tutel aligns C to a multiple of n) with the full hidden size H.
- Tutel P2 (EP + MP): every GPU's buffer is repeated n times, each replica going to one slice
  of the expert (H/n of its hidden units): EP over W virtual experts of capacity C and hidden
  size H/n.
- DeepSpeed TED: inside each expert-parallel group (the W/tp ranks that share a tensor-parallel
  index) EP over E experts with capacity ceil(C/tp) (this rank's slice of the capacity dim).

Padded buffers do not depend on which tokens are routed where, so views are uniform.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sim.core.graph import Task, TaskGraph
from sim.workload.moe import MoELayer


@dataclass(frozen=True)
class ViewLayer(MoELayer):
    """An MoELayer whose capacity is given instead of derived from (T, k, f, E)."""

    view_capacity: int = 1

    @property
    def capacity(self) -> int:
        return self.view_capacity


def ep_view(layer: MoELayer, *, experts: int, world: int, capacity: int, hidden: int) -> ViewLayer:
    return ViewLayer(
        batch=layer.batch,
        seq_len=layer.seq_len,
        model_dim=layer.model_dim,
        hidden_dim=hidden,
        experts=experts,
        world=world,
        top_k=min(layer.top_k, experts),
        capacity_factor=layer.capacity_factor,
        dtype=layer.dtype,
        routing={"kind": "uniform"},
        view_capacity=capacity,
    )


def aligned(capacity: int, parts: int) -> int:
    """Capacity rounded up to a multiple of `parts`, so that every part gets equal slots (the
    extra slots stay empty; gating still hands out `capacity`)."""
    return math.ceil(capacity / parts) * parts


def expert_param_bytes(layer: MoELayer) -> float:
    """One expert FFN's parameters: w1 [M, H], b1 [H], w2 [H, M], b2 [M]."""
    M, H = layer.model_dim, layer.hidden_dim
    return float((2 * M * H + H + M) * layer.elem)


def layer_meta(layer: MoELayer) -> dict[str, Any]:
    """The real layer's sizes for a graph's meta["layer"] (every builder writes these)."""
    d = {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer) if f.name != "routing"}
    return d | {"routing": layer.routing.get("kind"), "capacity": layer.capacity}


def gate_costs(layer: MoELayer, phase: str) -> tuple[float, float]:
    """(flops, bytes) of the gate over the layer's real E experts, as the shared builder
    costs it (backward twice the forward GEMM work)."""
    T, M, E, e = layer.tokens, layer.model_dim, layer.experts, layer.elem
    flops = 2.0 * T * M * E * (1 if phase == "fwd" else 2)
    return flops, float(e * (T * M + M * E) + 4 * T * E)


def fix_gates(g: TaskGraph, layer: MoELayer) -> None:
    """A view with other E costs its gate with the wrong E: put the real layer's back."""
    for t in g:
        if t.tags.get("step") in ("gate", "gate_grad"):
            t.flops, t.bytes = gate_costs(layer, t.tags["phase"])


def by_step(g: TaskGraph) -> dict[tuple[int, str, str], list[Task]]:
    """(rank, phase, step) -> its tasks in program order (one per chunk)."""
    out: dict[tuple[int, str, str], list[Task]] = defaultdict(list)
    for t in g:
        out[(t.rank, t.tags.get("phase", ""), t.tags.get("step", ""))].append(t)
    return out
