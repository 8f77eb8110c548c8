"""FasterMoE's greedy shadowing rule (He et al., PPoPP'22, dynamic shadowing) on the cluster's
cost model: which hot experts to replicate so that the busiest rank stops being the bottleneck.

The rule follows FasterMoE's performance model as FastMoE's default policy implements it
(fmoe/fastermoe/shadow_policy.py): the layer's time is the busiest worker's compute (3x the
forward FFN for forward + backward) plus its exchanges (4 all-to-alls), plus a cost per
shadowed expert; experts are tried hottest first and join while the predicted time drops.
Differences: FastMoE charges one parameter transfer per shadowed expert, here both the
broadcast and the gradient all-reduce the graph runs are charged; the model is per rank (a
rank holds E/P experts); its constants come from the cluster instead of environment
variables: GEMM times from the compute model, bandwidths from the topology's routes (or the
collective-level alpha-beta fits). Like FasterMoE's, the model adds compute and
communication (no overlap), so near the break-even point it can disagree with the simulator
(benchmarks/results/fastermoe_shadow.md lays its predictions next to simulated times).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.hardware.collectives import ring_broadcast_chunks
from sim.workload.moe import MoELayer


def param_bytes(layer: MoELayer) -> float:
    """One expert's parameters: w1, b1, w2, b2 (what a shadow broadcast moves)."""
    M, H = layer.model_dim, layer.hidden_dim
    return float((2 * M * H + H + M) * layer.elem)


@dataclass(frozen=True)
class RuleCosts:
    """What the greedy rule needs from the cluster.

    expert_fwd(rows): seconds for one rank's expert FFN forward on `rows` tokens;
    net_alpha + bytes / net_bw: one all-to-all's time for a rank moving `bytes` (FasterMoE's
    bw_net); bcast(bytes) / reduce(bytes): one expert's parameters broadcast from its owner
    to every rank / its gradients all-reduced.
    """

    expert_fwd: Callable[[float], float]
    net_alpha: float
    net_bw: float
    bcast: Callable[[float], float]
    reduce: Callable[[float], float]


def predicted_time(
    tok: np.ndarray,
    local_experts: int,
    shadow: tuple[int, ...] | list[int],
    row_bytes: float,
    pbytes: float,
    costs: RuleCosts,
    backward: bool,
) -> float:
    """FasterMoE's performance model of one layer under a shadow set S.

    Per rank q: rows_q = tokens of q's unshadowed experts from every rank plus q's own
    tokens of the shadowed experts; net_q = alpha + max(bytes sent, bytes received) / bw
    over the unshadowed traffic to other ranks (0 when q moves nothing). The layer takes
    max_q (c * expert_fwd(rows_q) + a * net_q) + |S| * (bcast + reduce), with c = 3, a = 4
    for forward + backward (backward GEMMs are twice the forward's; four all-to-alls) and
    c = 1, a = 2 (no reduce) for forward only. `tok` is [P, E] tokens rank p sends to e.
    """
    P, E = tok.shape
    shadowed = np.zeros(E, dtype=bool)
    shadowed[list(shadow)] = True
    owner = np.arange(E) // local_experts
    kept = np.where(shadowed[None, :], 0, tok)  # tokens still exchanged
    # [P, P] rows p sends to q (including p == q, which stays local)
    to_rank = np.zeros((P, P))
    np.add.at(to_rank.T, owner, kept.T)
    local = np.diag(to_rank).copy()
    rows = to_rank.sum(axis=0) + tok[:, shadowed].sum(axis=1)
    sent = (to_rank.sum(axis=1) - local) * row_bytes
    recv = (to_rank.sum(axis=0) - local) * row_bytes
    moved = np.maximum(sent, recv)
    c, a = (3.0, 4.0) if backward else (1.0, 2.0)
    per_rank = [
        c * costs.expert_fwd(float(rows[q]))
        + a * ((costs.net_alpha + moved[q] / costs.net_bw) if moved[q] > 0 else 0.0)
        for q in range(P)
    ]
    per_expert = costs.bcast(pbytes) + (costs.reduce(pbytes) if backward else 0.0)
    return max(per_rank) + len(shadow) * per_expert


def greedy_shadow(
    tok: np.ndarray,
    local_experts: int,
    row_bytes: float,
    pbytes: float,
    costs: RuleCosts,
    backward: bool,
) -> tuple[list[int], list[float]]:
    """FasterMoE's greedy choice: experts in decreasing order of load (tokens over all
    ranks; ties by id) join the shadow set while each one lowers the predicted time; the
    first that does not stops the search. Returns (shadowed experts, predicted time after
    each accepted step, the first entry being no shadowing)."""
    load = tok.sum(axis=0)
    order = sorted(range(tok.shape[1]), key=lambda e: (-int(load[e]), e))
    chosen: list[int] = []
    best = predicted_time(tok, local_experts, chosen, row_bytes, pbytes, costs, backward)
    trail = [best]
    if tok.shape[0] < 2:
        return chosen, trail
    for e in order:
        t = predicted_time(tok, local_experts, [*chosen, e], row_bytes, pbytes, costs, backward)
        if not t < best:
            break
        chosen.append(e)
        best = t
        trail.append(t)
    return sorted(chosen), trail


def _ffn_tasks(layer: MoELayer, rows: int) -> list[Task]:
    """The forward GEMMs of `rows` tokens through one expert, sized as the graph sizes them."""
    M, H, e = layer.model_dim, layer.hidden_dim, layer.elem
    out = []
    for name, n, k in (("fc1", H, M), ("fc2", M, H)):
        shape = {"batch": 1, "m": rows, "n": n, "k": k}
        out.append(
            Task(
                f"rule/{name}",
                0,
                "compute",
                "gemm",
                flops=2.0 * rows * n * k,
                bytes=float(e * (rows * k + rows * n + k * n)),
                shape=shape,
                tags={"dtype": layer.dtype},
            )
        )
    return out


def _msg_time(topo: Any, route: list[int]) -> float:
    """The largest per-message cost on a route (what sim.hardware.network charges per message)."""
    costs = [
        topo.trunk_class.msg_cost
        if link >= topo.trunk_base
        else float(topo.local_msg[link % topo.links_per_node])
        for link in route
    ]
    return max(costs, default=0.0)


def _share(topo: Any, routes: list[list[int]], alpha: float) -> tuple[float, float]:
    """(per-message start-up, bytes/s per route) when all `routes` carry traffic at once:
    each link's effective bandwidth is split among the routes crossing it."""
    users = Counter(link for r in routes for link in set(r))
    bw = min(float(topo.link_cap[link]) / users[link] for r in routes for link in r)
    start = max(alpha + topo.route_latency(r) + _msg_time(topo, r) for r in routes)
    return start, bw


def rule_costs(layer: MoELayer, cluster: Any) -> RuleCosts:
    """RuleCosts from the cluster's cost model: GEMM times from its compute model; with
    collective-level network costs, its alpha-beta fits (all_to_allv, broadcast,
    all_reduce); with flows, bandwidths read off the topology's routes:
    - bw_net: each GPU's share of the links its traffic to the GPU of the same local index on
      the next node crosses, all GPUs of a node sending at once (one node: to the next
      local GPU), i.e. its share of the NIC / NVLink it injects through;
    - the ring r -> r + 1 over the layer's ranks, each link shared by the hops crossing it,
      for the pipelined broadcast ((k + P - 2) phases of bytes / k) and ring all-reduce
      (2 (P - 1) phases of bytes / P), as sim.hardware.collectives moves them.
    """
    if cluster is None:
        raise ConfigError(
            "strategy fastermoe: shadow 'auto' needs the cluster's costs (give "
            "strategy.shadow as a list of expert ids or 'none', or run through moesim simulate)"
        )
    compute = cluster.costs.compute

    def expert_fwd(rows: float) -> float:
        if rows <= 0:
            return 0.0
        return sum(compute.duration(t) for t in _ffn_tasks(layer, int(round(rows))))

    P = layer.world
    if cluster.costs.network == "collective":
        coll = cluster.costs.collective
        a_a, b_a = coll.params("all_to_allv", P)
        a_b, b_b = coll.params("broadcast", P)
        a_r, b_r = coll.params("all_reduce", P)
        return RuleCosts(
            expert_fwd,
            a_a,
            1.0 / b_a if b_a > 0 else math.inf,
            lambda s: a_b + b_b * s,
            lambda s: a_r + b_r * s,
        )
    topo, alpha = cluster.topology, cluster.costs.alpha
    if P < 2:
        return RuleCosts(expert_fwd, 0.0, math.inf, lambda s: 0.0, lambda s: 0.0)
    G = topo.gpus_per_node
    if P > G:
        a2a = [topo.route(loc, G + loc) for loc in range(G)]
    else:
        a2a = [topo.route(loc, (loc + 1) % P) for loc in range(P)]
    net_alpha, net_bw = _share(topo, a2a, alpha)
    ring_alpha, ring_bw = _share(topo, [topo.route(r, (r + 1) % P) for r in range(P)], alpha)

    def bcast(s: float) -> float:
        k = ring_broadcast_chunks(s)
        return (k + P - 2) * (ring_alpha + s / k / ring_bw)

    def reduce(s: float) -> float:
        return 2 * (P - 1) * (ring_alpha + s / P / ring_bw)

    return RuleCosts(expert_fwd, net_alpha, net_bw, bcast, reduce)
