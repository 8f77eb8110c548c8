"""A collective's floor (`sim.training.comm_floor`, no simulation) never exceeds the time the
engine simulates for it (`sim.training.comm.CommTimer`): `moesim plan` prunes with it, so
a floor above the simulated time could drop the optimum."""

from __future__ import annotations

import pytest

from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.training.comm import CommTimer
from sim.training.comm_floor import FloorTimer
from sim.training.layout import Layout

# multi-node fabrics: one switch, rail-optimised leaves with spines (two 2-node units), and
# a 2:1 oversubscribed fat tree (two nodes a leaf), where groups share trunks
FABRICS = [
    ("dgx-h100", None),
    ("dgx-h100-superpod", {"nodes_per_unit": 2}),
    ("dgx-a100", {"type": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 2.0}),
]
# two layouts of 32 GPUs (4 nodes): every dimension of a step's collectives has a group
# of more than one GPU in one of them, EP inside a node and across nodes
LAYOUTS = [
    Layout(32, tp=2, cp=2, pp=2, ep=4, gbs=64, seq=8192),
    Layout(32, tp=1, pp=2, ep=16, gbs=64),
]
SIZES = (64e3, 4e6, 1.5e8)  # bytes per GPU: latency-bound to bandwidth-bound


def _cases(lay: Layout) -> list[tuple[str, str]]:
    out = [("all_to_all", "ep"), ("send", "pp")]
    for dim in ("tp", "dpcp", "edp"):
        out += [("all_gather", dim), ("reduce_scatter", dim), ("all_reduce", dim)]
    return out + ([("send", "cp")] if lay.cp > 1 else [])


@pytest.mark.parametrize("preset,fabric", FABRICS)
def test_the_floor_is_at_most_the_simulated_collective(preset, fabric):
    topo = Topology.load(preset, nodes=4, fabric=fabric)
    costs = CostModel.build(topo)
    checked = 0
    for lay in LAYOUTS:
        timer = CommTimer(topo, costs, lay)
        floor = FloorTimer(timer)
        for kind, dim in _cases(lay):
            if lay.size(dim) <= 1 and dim != "pp":
                continue
            for nbytes in SIZES:
                f, s = floor.seconds(kind, dim, nbytes), timer.seconds(kind, dim, nbytes)
                assert 0 < f <= s, (lay, kind, dim, nbytes, f, s)
                checked += 1
        for nbytes in SIZES:
            for combine in (False, True):
                for sms in (0, 24):
                    f = floor.deepep(nbytes, 8, 64, combine, sms)
                    s = timer.deepep(nbytes, 8, 64, combine, sms)
                    assert 0 < f <= s, (lay, "deepep", combine, sms, nbytes, f, s)
                    checked += 1
    assert checked >= 70
    assert FloorTimer.simulations == 0


def test_the_floor_is_tight_on_a_bandwidth_bound_all_to_all():
    """On one switch an EP all-to-all of large messages is paced by its busiest link, which
    the floor reads: it is the simulated time, to within the floor's slack, so the plan's
    bound with floors prunes as the bound with simulated collectives would."""
    topo = Topology.load("dgx-h100", nodes=4)
    timer = CommTimer(topo, CostModel.build(topo), LAYOUTS[1])
    f, s = (
        FloorTimer(timer).seconds("all_to_all", "ep", 1.5e8),
        timer.seconds("all_to_all", "ep", 1.5e8),
    )
    assert f == pytest.approx(s, rel=1e-4)


def test_a_cost_model_without_flows_gets_no_floor():
    topo = Topology.load("dgx-h100", nodes=4)
    timer = CommTimer(topo, CostModel.build(topo, {"network": "collective"}), LAYOUTS[1])
    assert FloorTimer(timer).seconds("all_to_all", "ep", 1e6) == 0.0
