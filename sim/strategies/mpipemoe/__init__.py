"""MPipeMoE (paper 001): micro-batch pipelining with memory reuse.

The layer's tokens are split into n micro-batches (capacity chunks, as `pipelined`); the
dispatch (S) and combine (R) all-to-alls of the micro-batches alternate on one communication
stream (Fig. 4b: S1, S2, R1, S3, R2, ...), experts run on the compute stream, and the backward
mirrors it with micro-batches in reverse.

Memory (Sec. II-B, III-D; `sim.workload.memory` has the formulas) is tracked as allocations and
frees of named buffers, by the rule every MoE builder follows (`sim.strategies.activations`):
what the forward stashes (T_I, T_DI, T_M, T_DO, T_O) is allocated at its first write and
released when the layer's backward returns, the gradient buffers the backward writes (dT_O,
dT_DO, dT_M, dT_DI, dT_I) from their first write to their last read; the model states
(Eq. 1) are counted beside them as for every strategy (the summary's `model_state_bytes`,
`sim.workload.accounting`), not as a buffer of the graph, so that peaks compare across
strategies. Without reuse ("none") every micro-batch writes its own slice of
full-size tensors (Eq. 2-4, the "memory bubbles" of Fig. 6). With reuse the micro-batches
share ring buffers: one slot for T_M and dT_M, two for T_DI, T_DO, dT_DO and dT_DI (Eq. 5),
and the graph orders a micro-batch's write into a slot after the last read of the slot's
previous tenant (including its offload copy). The backward restores the overwritten T_DI and T_M
as Table II says (`mpipemoe_perf.RESTORE`):

- offload: d2h on the copy stream in the forward, h2d back before the backward reads it;
- comm.: T_DI dispatched again from T_I (an all-to-all on the communication stream);
- recompute: fc1 again from the restored T_DI.

Parameters: `degree` (n, or "auto"), `reuse` ("none", "S1".."S4" or "auto": the Eq. 10
selector), `candidates` (degrees the granularity search may pick), `algo` (all-to-all
algorithm). With "auto" the choice reads the cluster's cost model (`mpipemoe_perf`); the
online granularity search of Algorithm 1 over changing batch sizes, with simulated trials, is
`sim.search.mpipemoe`.
"""

from __future__ import annotations

from typing import Any

from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.mpipemoe.builder import NAME, build_graph
from sim.strategies.mpipemoe.selector import choose
from sim.strategies.resolved import Resolved
from sim.workload.moe import MoELayer

__all__ = ["NAME", "STRATEGY", "build", "resolve"]


def resolve(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> Resolved:
    """The parameters the graph is built with: `auto` degree and reuse on the cluster."""
    n, reuse, info = choose(layer, params, cluster)
    chosen = {k: v for k, v in (("degree", n), ("reuse", reuse)) if params[k] == "auto"}
    return Resolved({**params, "degree": n, "reuse": reuse}, chosen, info)


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    res = resolve(layer, params, passes, cluster)
    g = build_graph(layer, res.params["degree"], res.params["reuse"], passes, params["algo"])
    g.meta["selector"] = res.info
    return g


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:MPipeMoEParams",
    build=build,
    real_layer="mpipemoe",
    resolve=resolve,
)
