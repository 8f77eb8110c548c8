"""The MoE part's activations of Megatron's nodes: the ten tensors every MoE builder allocates
(`sim.workload.memory.layer_tensors`, MPipeMoE Sec. II-B), per (rank, micro-batch, layer),
under the one rule of `sim.strategies.activations`. Attention's and the shared experts' kept
activations stay the nodes' own buffers (`Op.kept`), as in the model of many blocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from sim.core.graph import Task, TaskGraph
from sim.strategies.activations import place
from sim.strategies.deepep.volumes import volumes
from sim.workload.memory import layer_tensors
from sim.workload.moe import MoELayer

# Where Megatron's steps differ from the shared names: the router (the attention node's last
# step) hands the dispatch its permuted rows; the combined rows go straight into the residual
# (the unpermute is not modelled); the backward starts at the combine's gradient and hands
# dT_I to the router's input gradient
ROLES = {
    "T_I": (("gate",), ("dispatch",)),
    "T_O": (("combine",), ("combine",)),
    "dT_O": (("combine_grad",), ("combine_grad",)),
    "dT_I": (("dispatch_grad",), ("gate_grad",)),
}
# The layer's backward returns with the later of the router's input gradient and the experts'
# weight gradients, which a schedule may defer past it (DualPipe's zero-bubble W chunks)
RELEASE = ("gate_grad", "fc1_wgrad")


def moe_tensors(
    layer: MoELayer, dispatcher: str, rows_to: np.ndarray, fwd_row: float, gpus_per_node: int
) -> list[dict[str, float]]:
    """Per rank, the bytes of the layer's tensors: the rows it dispatches from (the permuted
    (token, expert) rows for `alltoall`, its T tokens for `flex` and `allgather`), the rows
    it receives (`flex`: one per (token, GPU), in the dispatch dtype; `allgather`: every
    rank's tokens) and the (token, expert) rows its experts compute."""
    T, M, H, e, P = layer.tokens, layer.model_dim, layer.hidden_dim, layer.elem, layer.world
    rows = rows_to.sum(axis=0)
    got = volumes(layer, gpus_per_node).gpu_tokens.sum(axis=0) if dispatcher == "flex" else None
    out = []
    for p in range(P):
        m = int(round(rows[p]))
        if dispatcher == "alltoall":
            kw = {"received_rows": float(rows[p])}
            sent = float(rows_to[p].sum())
        elif got is not None:
            kw = {"received_rows": float(got[p]), "dispatch_row": fwd_row}
            sent = float(T)
        else:
            kw, sent = {"received_rows": float(P * T)}, float(T)
        out.append(layer_tensors(sent, m, M, H, e, **kw))
    return out


def place_moe(g: TaskGraph, tensors: list[dict[str, float]], passes: Iterable[str]) -> None:
    """Allocs and frees of the MoE part of every (rank, micro-batch, layer) of `g`: its
    tasks share the id prefix r{rank}/{chunk/}mb{mb}/L{layer}, which (less the rank) names
    its buffers as the nodes name theirs."""
    groups: dict[str, list[Task]] = defaultdict(list)
    for t in g:
        groups[t.id.rsplit("/", 2)[0]].append(t)
    passes = tuple(passes)
    for key, tasks in groups.items():
        if any(t.tags.get("step") == "dispatch" for t in tasks):
            rank = tasks[0].rank % len(tensors)  # its EP rank (DualPipe: stages apart)
            prefix = key.split("/", 1)[1] + "/"
            place(tasks, tensors[rank], passes, ROLES, RELEASE, prefix=prefix)
