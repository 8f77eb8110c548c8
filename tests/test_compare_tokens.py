"""Per-token metrics of graphs that span micro-batches, layers or pipeline stages, and the
clear errors of a pipeline strategy that does not fit the cluster or a data-parallel layout."""

from __future__ import annotations

import pytest

from sim.analysis.compare import step_tokens
from sim.core.errors import ConfigError
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.pipeline import simulate_layout
from sim.strategies import Cluster, build
from sim.workload.moe import MoELayer
from sim.workload.parallel import from_spec

TOPO = Topology.load("dgx-a100", nodes=1)
CLUSTER = Cluster(TOPO, CostModel.build(TOPO, {}))


def _layer(world: int) -> MoELayer:
    return MoELayer(
        batch=1, seq_len=256, model_dim=256, hidden_dim=512, experts=world * 2, world=world, top_k=2
    )


def test_one_layer_graph_counts_its_tokens_once():
    layer = _layer(8)
    g = build("sequential", layer, {}, ("fwd", "bwd"), CLUSTER)
    assert step_tokens(layer, g) == layer.tokens * 8


def test_megatron_counts_micro_batches_and_layers():
    layer = _layer(8)
    g = build("megatron_ep", layer, {"micro": 3, "layers": 2}, ("fwd", "bwd"), CLUSTER)
    assert step_tokens(layer, g) == layer.tokens * 8 * 3 * 2


def test_dualpipe_counts_one_ep_group_per_device_and_every_stage():
    layer = _layer(2)
    params = {"pp": 4, "micro": 8, "layers": 1}
    g = build("dualpipe", layer, params, ("fwd", "bwd"), CLUSTER)
    assert g.world_size == 4 * 2  # 4 devices x an EP group of 2
    assert step_tokens(layer, g) == layer.tokens * 2 * 8 * 4


def test_dualpipe_larger_than_the_cluster_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"strategy\.pp: dualpipe .* 32 ranks, but the cluster"):
        build("dualpipe", _layer(8), {"pp": 4}, ("fwd", "bwd"), CLUSTER)


def test_a_pipeline_under_data_parallel_replicas_is_refused():
    layer = _layer(2)
    g = build("dualpipe", layer, {"pp": 2, "micro": 4, "layers": 1}, ("fwd", "bwd"), CLUSTER)
    layout = from_spec({"ep": 2, "dp": 4}, 8, 8)
    with pytest.raises(ConfigError, match="built a graph of 4 ranks for replicas of 2"):
        simulate_layout(g, layout, TOPO, CLUSTER.costs)
