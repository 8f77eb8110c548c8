"""MPipeMoE's performance model of the memory-reuse strategies (paper 001, Table II, Eq. 7-10).

Table II: with memory reuse, T_DI and T_M of a micro-batch are overwritten by the next one and
restored in the backward, T_DI by offloading (d2h in the forward, h2d in the backward) or by
re-communication (the dispatch all-to-all again, from T_I), T_M by offloading or by
re-computation (fc1 again, from the restored T_DI):

    strategy  T_DI     T_M        Q_fw      Q_bw
    none      -        -          [2,2,0]   [4,2,0]
    S1        offload  offload    [2,2,5]   [4,2,5]
    S2        comm.    offload    [2,2,4]   [4,3,4]
    S3        offload  recompute  [2,2,1]   [5,2,1]
    S4        comm.    recompute  [2,2,0]   [5,3,0]

Q counts, per micro-batch and pass, expert GEMMs (units of b*H*M, Eq. 7), all-to-alls (units
of b*M, Eq. 8) and host copies (units of b*M, Eq. 9; T_M counts H/M units, the table's 4 for
H = 4M). Eq. 10 takes the pass time as its slowest stream:

    C = max(q1 t_comp / sigma, q2 t_comm / mu, q3 t_mem / eta)

with t_x the time of one unit alone (1/W_x of the paper, measured at the micro-batch size b so
that fixed costs count) and sigma, mu, eta the speeds of compute, communication and copies
while the other streams run (Sec. II-C, Fig. 3). Strategies with copies see everything
running (mu_all, eta_all), the others compute beside communication only (mu_comp); the paper
sets sigma = 1, here it is read like mu and eta.

Where the factors come from (the mapping onto this simulator's cost model):
- t_comp: the compute model's duration of one expert GEMM of the micro-batch;
- t_comm: one micro-batch all-to-all: alpha-beta in `collective` network mode; in `flow` mode
  the all-to-all's flows (the algorithm's phases) under max-min sharing of the topology's links;
- t_mem: one b*M host copy with every GPU copying at once (GPUs behind one PCIe switch share
  its uplink), or the calibrated d2h fit in collective mode, as the engine costs copies;
- sigma_x, mu_x, eta_x: the interference table (relative speeds, `costs.interference`):
  sigma_comm = compute[comm], sigma_all = compute[comm+copy], mu_comp = comm[compute],
  mu_all = comm[compute+copy], eta_all = copy[compute+comm]; in `flow` mode mu_all and eta_all
  are further multiplied by the link sharing of copies and communication (on DGX A100 a GPU's
  PCIe link carries both its host copies and its NIC traffic), computed with the same max-min
  solver the engine uses: the share the paper's Fig. 3 measurement would include.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.hardware import collectives as coll_algos
from sim.hardware.network import (
    BundleBatch,
    bundled_uniform,
    max_min_rates,
    pair_mask,
    per_flow,
    product_layout,
)
from sim.strategies.mpipemoe.chunks import chunk_plan
from sim.workload.moe import MoELayer

# Table II: (how T_DI is restored, how T_M is restored); None keeps the tensor.
RESTORE: dict[str, tuple[str | None, str | None]] = {
    "none": (None, None),
    "S1": ("offload", "offload"),
    "S2": ("comm", "offload"),
    "S3": ("offload", "recompute"),
    "S4": ("comm", "recompute"),
}
REUSE_STRATEGIES = ("S1", "S2", "S3", "S4")

Q = tuple[float, float, float]


def q_vectors(strategy: str, h_over_m: float = 4.0) -> tuple[Q, Q]:
    """(Q_fw, Q_bw) of Table II for a layer with H = h_over_m * M."""
    if strategy not in RESTORE:
        raise ConfigError(f"strategy.reuse: expected one of {list(RESTORE)}, got {strategy!r}")
    di, m = RESTORE[strategy]
    copies = (di == "offload") * 1.0 + (m == "offload") * h_over_m
    q_fw = (2.0, 2.0, copies)
    q_bw = (4.0 + (m == "recompute"), 2.0 + (di == "comm"), copies)
    return q_fw, q_bw


@dataclass(frozen=True)
class Factors:
    """Eq. 10's inputs for one micro-batch size: unit times alone, and relative speeds."""

    t_comp: float
    t_comm: float
    t_mem: float
    sigma_comm: float = 1.0
    sigma_all: float = 1.0
    mu_comp: float = 1.0
    mu_all: float = 1.0
    eta_all: float = 1.0

    @property
    def alpha(self) -> float:
        """Eq. 10's alpha = W_comp / W_comm (per unit of work)."""
        return self.t_comm / self.t_comp

    @property
    def beta(self) -> float:
        """Eq. 10's beta = W_comp / W_mem."""
        return self.t_mem / self.t_comp

    def speeds(self, strategy: str) -> tuple[float, float, float]:
        """(sigma, mu, eta) Table II assigns: all streams busy where there are copies."""
        copies = q_vectors(strategy)[0][2] > 0
        if copies:
            return self.sigma_all, self.mu_all, self.eta_all
        return self.sigma_comm, self.mu_comp, 1.0

    def stream_times(self, strategy: str, h_over_m: float) -> list[tuple[float, float, float]]:
        """Per pass (fw, bw): time of each stream's per-micro-batch work under interference."""
        sigma, mu, eta = self.speeds(strategy)
        return [
            (q[0] * self.t_comp / sigma, q[1] * self.t_comm / mu, q[2] * self.t_mem / eta)
            for q in q_vectors(strategy, h_over_m)
        ]

    def cost(self, strategy: str, h_over_m: float) -> float:
        """Eq. 10 summed over the forward and backward pass (per micro-batch)."""
        return sum(max(c) for c in self.stream_times(strategy, h_over_m))

    def pipeline_time(self, strategy: str, h_over_m: float, n: int) -> float:
        """n micro-batches through the three streams: the slowest stream's per-micro-batch
        time (Eq. 10) for n - 1 of them, plus one of every stream to fill and drain."""
        return sum((n - 1) * max(c) + sum(c) for c in self.stream_times(strategy, h_over_m))


def select(factors: Factors, h_over_m: float, candidates=REUSE_STRATEGIES) -> tuple[str, dict]:
    """The reuse strategy with the lowest Eq. 10 cost (ties: the first in Table II order)."""
    costs = {s: factors.cost(s, h_over_m) for s in candidates}
    best = min(candidates, key=lambda s: costs[s])
    return best, costs


# -- factors from a cluster's cost model --------------------------------------------------------


def micro_batch_tasks(layer: MoELayer, n: int) -> tuple[Task, list[Task], float]:
    """The largest micro-batch's fc1 GEMM (rank 0), its dispatch all-to-all (every rank) and
    its T_DI bytes on rank 0, as the graph builds them."""
    plan = chunk_plan(layer, n)
    j = int(np.argmax([c.di_bytes[0] for c in plan]))
    c = plan[j]
    gemm = Task(
        "probe/fc1",
        0,
        "compute",
        "gemm",
        flops=c.fc1_flops[0],
        bytes=c.fc1_bytes[0],
        shape=c.fc1_shape[0],
        tags={"dtype": layer.dtype},
    )
    group = list(range(layer.world))
    comm = [c.exchange(r, "probe", "probe/dispatch", group, None, reverse=False) for r in group]
    return gemm, comm, float(c.di_bytes[0])


def factors_from_cluster(cluster: Any, layer: MoELayer, n: int, algo: str | None = None) -> Factors:
    """Eq. 10's factors for micro-batches of layer split n ways on `cluster` (module doc)."""
    if cluster is None:
        raise ConfigError(
            "strategy mpipemoe: 'auto' degree or reuse needs the cluster's costs (give "
            "strategy.degree and strategy.reuse, or run through moesim simulate)"
        )
    topo, costs = cluster.topology, cluster.costs
    gemm, comm, mem_bytes = micro_batch_tasks(layer, n)
    for t in comm:
        t.algo = algo
    t_comp = costs.compute.duration(gemm)
    inter = costs.interference

    def table(kind: str, *others: str) -> float:
        return inter.speed(kind, frozenset(others))

    mu_struct = eta_struct = 1.0
    if costs.network == "flow":
        t_comm, t_comm_shared, t_mem, t_mem_shared = _flow_times(topo, costs, comm, mem_bytes)
        mu_struct, eta_struct = t_comm / t_comm_shared, t_mem / t_mem_shared
    else:
        t_comm = costs.collective.duration(comm[0].kind, layer.world, coll_algos.payload(comm[0]))
        fitted = getattr(costs.compute, "params", {}).get("d2h")
        if fitted is not None:
            t_mem = fitted[0] + fitted[1] * mem_bytes
        else:
            bw = float(topo.link_cap[topo.host_route(0, to_host=True)].min())
            t_mem = costs.alpha + mem_bytes / bw
    return Factors(
        t_comp=t_comp,
        t_comm=t_comm,
        t_mem=t_mem,
        sigma_comm=table("compute", "comm"),
        sigma_all=table("compute", "comm", "copy"),
        mu_comp=table("comm", "compute"),
        mu_all=table("comm", "compute", "copy") * mu_struct,
        eta_all=table("copy", "compute", "comm") * eta_struct,
    )


def _flow_times(topo: Any, costs: Any, comm: list[Task], nbytes: float) -> tuple[float, ...]:
    """(all-to-all alone, all-to-all beside every GPU's host copy, copy alone, copy beside the
    all-to-all): phase by phase, every flow at its max-min rate."""
    ranks = np.asarray(comm[0].group, dtype=np.int64)
    copies = _copy_batch(topo, costs, ranks, nbytes)
    t_copy_alone = _batch_time(topo, [copies])[0]
    t_alone = t_shared = 0.0
    t_copy_shared = t_copy_alone
    for phase in coll_algos.phases(comm, topo):
        if isinstance(phase, coll_algos.LocalPhase):
            d2d = Task("probe/d2d", 0, "copy", "d2d", bytes=2.0 * phase.nbytes)
            dt = costs.compute.duration(d2d)
            t_alone, t_shared = t_alone + dt, t_shared + dt
            continue
        flows = _phase_batch(topo, costs, phase, len(ranks))
        t_alone += _batch_time(topo, [flows])[0]
        both = _batch_time(topo, [flows, copies])
        t_shared += both[0]
        t_copy_shared = max(t_copy_shared, both[1])
    return t_alone, t_shared, t_copy_alone, t_copy_shared


def _phase_batch(topo: Any, costs: Any, phase: Any, group_size: int) -> BundleBatch:
    """The flows of one phase, bundled where that is exact (as the engine does)."""
    if isinstance(phase, coll_algos.UniformPhase):
        layout = product_layout(topo, phase.members)
        if layout is not None and group_size >= costs.bundle_min_ranks:
            b = bundled_uniform(
                topo, layout[0], layout[1], phase.per_pair, costs.alpha, phase.pairs, phase.relay
            )
            if b is not None:
                return b
        mem = phase.members
        src, dst = np.repeat(mem, len(mem)), np.tile(mem, len(mem))
        keep = pair_mask(topo, src, dst, phase.pairs)
        return per_flow(
            topo,
            src[keep],
            dst[keep],
            np.full(int(keep.sum()), phase.per_pair),
            costs.alpha,
            phase.relay,
        )
    return per_flow(topo, phase.src, phase.dst, phase.nbytes, costs.alpha, phase.relay)


def _copy_batch(topo: Any, costs: Any, ranks: np.ndarray, nbytes: float) -> BundleBatch:
    """One d2h flow per GPU over its host route."""
    routes = [np.asarray(topo.host_route(int(r), to_host=True), dtype=np.int64) for r in ranks]
    k = len(routes)
    lat = np.array([costs.alpha + topo.route_latency(list(rt)) for rt in routes])
    return BundleBatch(
        np.ones(k),
        np.full(k, float(nbytes)),
        lat,
        np.concatenate([np.full(len(rt), i) for i, rt in enumerate(routes)]),
        np.concatenate(routes),
        np.ones(sum(len(rt) for rt in routes)),
        np.arange(k),
        ranks.copy(),
    )


def _batch_time(topo: Any, batches: list[BundleBatch]) -> list[float]:
    """Per batch, the time its slowest bundle needs when all batches share the links."""
    offs = np.cumsum([0] + [len(b) for b in batches])
    inc_b = np.concatenate([b.inc_b + o for b, o in zip(batches, offs)])
    inc_l = np.concatenate([b.inc_l for b in batches])
    inc_m = np.concatenate([b.inc_m for b in batches])
    links, compact = np.unique(inc_l, return_inverse=True)
    rate = max_min_rates(int(offs[-1]), inc_b, compact, inc_m, topo.link_cap[links])
    out = []
    for b, o in zip(batches, offs):
        r = rate[o : o + len(b)]
        out.append(float(np.max(b.latency + b.nbytes / r)) if len(b) else 0.0)
    return out
