"""DeepEP's normal dispatch and combine in the real layer, as a two-stage all-to-allv stand-in
(gloo has no NVLink / RDMA kernels; the data path is DeepEP's, the transport is not).

Ranks are GPUs on nodes of G (`strategy.gpus_per_node`; rank p is local index p % G of node
p // G). For the kept (token, expert) choices of the layer's gate (`exec.layers.moe.route`):

- notify: an all-to-all of row counts before each stage, so receivers size their buffers;
- stage 1 (inter-node, "rdma"): a token crosses to each *other* node holding one of its
  experts exactly once, to the GPU with the owner's local index there (the forwarder), with
  the ids and gate weights of its choices on that node;
- stage 2 (intra-node, "nvlink"): each GPU sends its own tokens and the tokens it forwards
  once to every GPU of its node holding one of their experts (a rank's rows to itself stay in
  its memory and are not logged as traffic);
- experts: every received (token, local expert) pair through that expert's FFN; the outputs
  are weighted by their gate weights and summed per (token, GPU): one row goes back;
- combine: stage 2 reversed (one row per (token, GPU)), summed at the forwarder per token
  (the top-k weighted reduction of its node is complete there), then stage 1 reversed: one
  row per (token, node) crosses back, and the owner adds its nodes' rows.

The rows per peer of both stages are logged under (phase, step, "rdma" | "nvlink") so they can
be checked against the flows of the simulator's `deepep` collective
(`exec.layers.split_check`). Outputs and gradients equal `sequential`'s: the same kept choices
go through the same experts with the same weights, only the order of the sums differs.
Node-limited routing (`max_nodes`) is a property of DeepSeek's gate that this layer's gate
does not have, so it is refused; `dispatch_dtype` sizes the simulator's bytes, while the real
rows keep the layer's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from exec.layers.registry import register
from exec.layers.sparse import ExchangeV, SplitLog, exchange_v
from exec.layers.waits import wait_work
from sim.core.errors import ConfigError

if TYPE_CHECKING:
    from exec.layers.moe import Comms, DistMoE, Routing


def node_size(params: dict[str, Any], world: int) -> int:
    """GPUs per node: the parameter (None: one node, as the simulator without a cluster),
    at most the world (as `sim.strategies.deepep.volumes`), dividing it."""
    G = params.get("gpus_per_node")
    if G is None:
        return world
    if not isinstance(G, int) or isinstance(G, bool) or G < 1:
        raise ConfigError(f"strategy.gpus_per_node: expected a positive integer, got {G!r}")
    G = min(G, world)
    if world % G:
        raise ConfigError(f"strategy.gpus_per_node: {world} ranks are no whole nodes of {G}")
    return G


class _Transfers:
    """A SplitLog view that drops a rank's rows to itself (a local copy, not a transfer)."""

    def __init__(self, log: SplitLog, rank: int):
        self.log, self.rank = log, rank

    def add(self, key: Any, send: list[int]) -> None:
        rows = list(send)
        rows[self.rank] = 0
        self.log.add(key, rows)


@dataclass
class _Rows:
    """Rows to send, grouped by destination rank: data [R, M + k] (token, masked weights),
    ids [R, k] (expert per choice on the destination, -1 elsewhere), `src` [R] the index of
    each row in the sender's table, `send` rows per peer."""

    data: torch.Tensor
    ids: torch.Tensor
    src: torch.Tensor
    send: list[int]


def _select(
    x: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
    dest: torch.Tensor,
    peers: list[int],
    world: int,
) -> _Rows:
    """One row per (table row, peer in `peers`) that has a choice whose `dest` is that peer:
    the token, and its weights and expert ids masked to that peer's choices."""
    k = ids.shape[1]
    data = [x.new_zeros(0, x.shape[1] + k)]  # nothing to send (one node: no stage 1)
    out_ids, src, send = [ids.new_zeros(0, k)], [ids.new_zeros(0)], [0] * world
    for q in peers:
        on_q = (ids >= 0) & (dest == q)
        rows = on_q.any(dim=1).nonzero(as_tuple=True)[0]
        send[q] = int(rows.numel())
        m = on_q[rows]
        data.append(torch.cat([x[rows], torch.where(m, w[rows], torch.zeros_like(w[rows]))], 1))
        out_ids.append(torch.where(m, ids[rows], torch.full_like(ids[rows], -1)))
        src.append(rows)
    return _Rows(torch.cat(data), torch.cat(out_ids), torch.cat(src), send)


def _notify(comms: Comms, send: list[int], what: str) -> list[int]:
    """Rows every peer will send me (DeepEP's notify: counts first, buffers sized from them)."""
    t = torch.tensor(send, dtype=torch.int64, device=comms.device)
    out = torch.empty_like(t)
    work = dist.all_to_all_single(out, t, group=comms.groups["comm"], async_op=True)
    wait_work(
        work, comms.rank, f"all_to_all of {what} counts", list(range(comms.world)), comms.timeout_s
    )
    return [int(n) for n in out.tolist()]


def _stage(moe: DistMoE, rows: _Rows, stage: str) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Dispatch one stage: (data, ids) received, and the rows received from each peer."""
    comms, what = moe.comms, f"deepep dispatch ({stage})"
    recv = _notify(comms, rows.send, what)
    log = _Transfers(moe.splits, comms.rank)
    data = ExchangeV.apply(
        rows.data, comms, "comm", rows.send, recv, what, log, ("fwd", "dispatch", stage)
    )
    ids = exchange_v(comms, rows.ids, "comm", rows.send, recv, f"{what} expert ids")
    return data, ids, recv


def _back(moe: DistMoE, y: torch.Tensor, rows: _Rows, recv: list[int], stage: str) -> torch.Tensor:
    """Combine one stage: rows y (one per row received) back to their senders."""
    comms, what = moe.comms, f"deepep combine ({stage})"
    log = _Transfers(moe.splits, comms.rank)
    return ExchangeV.apply(y, comms, "comm", recv, rows.send, what, log, ("fwd", "combine", stage))


def _experts(moe: DistMoE, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per received row, the gate-weighted sum of its choices' expert outputs on this GPU."""
    El = moe.spec.local_experts
    row, choice = (ids >= 0).nonzero(as_tuple=True)
    local = ids[row, choice] - moe.rank * El
    out = x.new_zeros(x.shape[0], x.shape[1])
    for i in range(El):
        sel = (local == i).nonzero(as_tuple=True)[0]
        if sel.numel() == 0:
            continue
        r = row[sel]
        h = moe.act(torch.addmm(moe.b1[i], x[r], moe.w1[i]))
        y = torch.addmm(moe.b2[i], h, moe.w2[i]) * w[r, choice[sel]].unsqueeze(1)
        out = out.index_add(0, r, y)
    return out


@dataclass
class TwoStage:
    """What the combine needs of a two-stage dispatch: both stages' rows and received counts,
    the tokens this rank keeps on its node (`own`), the forwarding table's and input's rows."""

    s1: _Rows
    s2: _Rows
    recv1: list[int]
    recv2: list[int]
    own: torch.Tensor
    table: int
    tokens: int


def dispatch(
    moe: DistMoE, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, params: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, TwoStage]:
    """DeepEP's dedup-and-forward: rows [x | w] at the experts' GPUs, their expert ids, and
    the route back. `ids` are the kept choices (-1: dropped)."""
    P, rank, M, El = moe.spec.world, moe.rank, x.shape[1], moe.spec.local_experts
    G = node_size(params, P)
    node, loc = rank // G, rank % G
    gpu_of = torch.where(ids >= 0, ids // El, torch.full_like(ids, -1))
    node_of = torch.where(ids >= 0, gpu_of // G, torch.full_like(ids, -1))
    # stage 1: to the owner's local index on every other node its choices reach
    remote = [n * G + loc for n in range(P // G) if n != node]
    s1 = _select(x, w, ids, node_of * G + loc, remote, P)
    d1, ids1, recv1 = _stage(moe, s1, "rdma")
    # the forwarding table: my own tokens on my node, then the tokens forwarded to me
    own = ((ids >= 0) & (node_of == node)).any(dim=1).nonzero(as_tuple=True)[0]
    own_ids = torch.where(node_of[own] == node, ids[own], torch.full_like(ids[own], -1))
    own_w = torch.where(node_of[own] == node, w[own], torch.zeros_like(w[own]))
    tx = torch.cat([x[own], d1[:, :M]])
    tw = torch.cat([own_w, d1[:, M:]])
    tids = torch.cat([own_ids, ids1])
    # stage 2: to every GPU of my node holding one of the table row's experts
    local_gpus = list(range(node * G, (node + 1) * G))
    s2 = _select(tx, tw, tids, torch.where(tids >= 0, tids // El, tids), local_gpus, P)
    d2, ids2, recv2 = _stage(moe, s2, "nvlink")
    return d2, ids2, TwoStage(s1, s2, recv1, recv2, own, tx.shape[0], x.shape[0])


def combine(moe: DistMoE, y: torch.Tensor, r: TwoStage) -> torch.Tensor:
    """The experts' weighted outputs back: stage 2 back, summed per table row (the node's
    reduction at the forwarder), then stage 1 back to the tokens' ranks."""
    M = moe.spec.model_dim
    back2 = _back(moe, y, r.s2, r.recv2, "nvlink")
    table = back2.new_zeros(r.table, M).index_add(0, r.s2.src, back2)
    back1 = _back(moe, table[r.own.numel() :], r.s1, r.recv1, "rdma")
    out = back1.new_zeros(r.tokens, M).index_add(0, r.own, table[: r.own.numel()])
    return out.index_add(0, r.s1.src, back1)


@register("deepep")
def deepep(moe: DistMoE, x: torch.Tensor, routing: Routing, params: dict[str, Any]) -> torch.Tensor:
    if params.get("max_nodes") is not None:
        raise ConfigError(
            "strategy.max_nodes: node-limited routing is a gate the real layer does not have; "
            "run it with max_nodes null (the simulator models it)"
        )
    ids = torch.where(routing.kept, routing.expert, torch.full_like(routing.expert, -1))
    d2, ids2, route = dispatch(moe, x, routing.weight, ids, params)
    M = x.shape[1]
    return combine(moe, _experts(moe, d2[:, :M], d2[:, M:], ids2), route)


deepep.token_level = True  # type: ignore[attr-defined]  # exec.layers.moe.DistMoE.forward
