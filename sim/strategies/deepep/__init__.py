"""DeepEP's normal kernels (DeepSeek's expert-parallel dispatch/combine library, V1) as a
layer strategy.

Forward per rank: gate -> layout (which ranks / nodes each token goes to) -> notify (a small
all-to-all of the counts, then a device-to-host copy the host waits on to size the receive
buffers: `Task.host_sync`, so the host launches nothing after it until it ends) -> dispatch
(all-to-allv, algorithm `deepep`: one RDMA transfer per (token, destination node) to the same-
local-rank forwarder, then NVLink to the expert GPUs; FP8 rows with per-128 scales) -> experts
(dropless: every (token, expert) pair) -> combine (the reverse, BF16, reduced at the
forwarder) -> decode. Backward: the combine's gradient goes out as a dispatch (BF16; the
layout is cached, no notify), the expert's dgrad + wgrad, the dispatch's gradient comes back
as a combine.

The data kernels reserve SMs: their tasks set `Task.sms` (default 24 of 132, as DeepEP V1's
tests use), held from launch to end, so a kernel beside them on the same GPU runs on the SMs
left (sim.hardware.costs.resources), and they send no faster than those SMs allow
(`costs.resources.comm_sm_bw` bytes/s per SM, 14 GB/s in the Hopper presets), at
`costs.resources.comm_sm_efficiency` of their links' rate (0.865 in the Hopper presets, fitted
to DeepEP's published H800 figures, benchmarks/deepep_h800.py). The notify kernel is a few
blocks and reserves none.
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.deepep.builder import build_deepep
from sim.workload.moe import MoELayer

NAME = "deepep"


def pair_weight(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], blocks: Any = None
) -> float:
    """Memory per rank pair in sim.strategies.PAIR_BYTES units (checked against
    limits.max_pairs): per pass a dispatch and a combine all-to-allv per rank, each with its
    send and receive splits (a Python float per peer) and the simulation's per-flow arrays,
    ~2 units a pair (peak RSS of the demo: 97 MB at 256 GPUs, 193 MB at 512)."""
    return 1 + 2 * 2 * max(1, len(passes))


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    G = params["gpus_per_node"]
    if G is None:
        G = cluster.topology.gpus_per_node if cluster is not None else layer.world
    if not isinstance(G, int) or isinstance(G, bool) or G < 1:
        raise ConfigError(f"strategy.gpus_per_node: expected a positive integer, got {G!r}")
    sms = params["sms"]
    if not isinstance(sms, int) or isinstance(sms, bool) or sms < 1:
        raise ConfigError(f"strategy.sms: expected a positive integer, got {sms!r}")
    return build_deepep(
        layer, passes, G, params["max_nodes"], params["dispatch_dtype"], sms, NAME, params["dedup"]
    )


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:DeepEPParams",
    build=build,
    real_layer="deepep",
    pair_weight=pair_weight,
    dropless=True,
)
