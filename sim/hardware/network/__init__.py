"""Flows on links: max-min fair bandwidth sharing, kept up to date as flows start and end.

bundles      BundleBatch: the unit the solver moves (flows known to share one rate)
layouts      bundles from flows: per-flow, and bundled uniform exchanges
maxmin       progressive filling, and the bottleneck test of a max-min allocation
table        the active bundles as slot columns, with link incidences indexed both ways
assigned     max-min rates from a guess of every bundle's bottleneck, checked
incremental  rates re-solved around each change (equal to a solve from scratch)
flows        FlowNetwork: what the engine drives (add, recompute, next finish, pop)
"""

from sim.hardware.network.bundles import BundleBatch
from sim.hardware.network.flows import FINISH_RTOL, FlowNetwork
from sim.hardware.network.layouts import bundled_uniform, pair_mask, per_flow, product_layout
from sim.hardware.network.maxmin import max_min_rates

__all__ = [
    "FINISH_RTOL",
    "BundleBatch",
    "FlowNetwork",
    "bundled_uniform",
    "max_min_rates",
    "pair_mask",
    "per_flow",
    "product_layout",
]
