"""A run config's cluster for a given number of ranks, and the strategy parameters its
selectors choose there: what the executor runs a config's `auto` parameters with.

The executor's world is its processes (`--nprocs`), not the config's GPUs; its `auto`
parameters are chosen on the config's cluster (topology, nodes, fabric, costs and calibration)
for a layer of that many ranks, as `moesim simulate` would choose them on that cluster. A
cluster with fewer GPUs than ranks is grown to whole nodes that hold them (and says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.strategies import Cluster, resolve_auto
from sim.strategies.resolved import Resolved

if TYPE_CHECKING:
    from sim.config import RunConfig


@dataclass(frozen=True)
class Resolution:
    """The strategy's resolved parameters on `world` ranks, the cluster they were chosen on
    (None where no parameter was auto), and notes for the user."""

    resolved: Resolved
    cluster: Cluster | None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        return self.resolved.describe() + self.notes


def cluster_for(cfg: RunConfig, world: int) -> tuple[Cluster, list[str]]:
    """The config's cluster, with at least `world` GPUs; notes say where it was grown."""
    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology

    topo = cfg.load_topology()
    notes = []
    if topo.world_size < world:
        nodes = -(-world // topo.gpus_per_node)
        notes.append(
            f"cluster: {topo.name} with {nodes} nodes (the config's {topo.nodes} hold "
            f"{topo.world_size} GPUs, fewer than the {world} ranks run)"
        )
        topo = Topology.load(cfg.topology, nodes=nodes, fabric=cfg.fabric)
    return Cluster(topo, CostModel.build(topo, cfg.costs)), notes


def resolve_for(cfg: RunConfig, world: int) -> Resolution:
    """The config's strategy parameters for its layer on `world` ranks, `auto` ones chosen
    by the strategy's own selector (`sim.strategies.resolve_auto`) on the config's cluster."""
    from sim.strategies import resolve_params

    wl = cfg.workload_for(world)
    full = resolve_params(cfg.strategy, wl.params)
    cluster: Cluster | None = None
    notes: list[str] = []
    if any(isinstance(v, str) and v == "auto" for v in full.values()):
        cluster, notes = cluster_for(cfg, world)
    return Resolution(
        resolve_auto(cfg.strategy, wl.layer, full, cfg.passes, cluster), cluster, notes
    )
