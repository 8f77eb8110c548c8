"""The per-connection cost bounded by the connections served at once (issue 26, part 1).

A link class's `conn_inflight` (K) caps the messages whose connection term a message pays:
conn_cost * min(F, K) for F messages sharing the link in a step. Below K the closed form is
the unbounded one exactly; far above it the time grows linearly in the peers, F * (msg + K *
conn), the rounds of K peers NCCL runs a grouped send/recv in.
"""

from __future__ import annotations

import pytest

from sim.analysis import collbench
from sim.core.errors import TopologyError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from tests.configs import switch_ports

BW, MSG, CONN = 10e9, 2e-6, 1e-8


def _ports(n: int, inflight: int | None) -> Topology:
    """n GPUs, one port each on one switch: the per-message costs alone decide small sizes."""
    port: dict = {"bw": BW, "msg_cost": MSG, "conn_cost": CONN}
    if inflight is not None:
        port["conn_inflight"] = inflight
    return Topology(switch_ports(n, port))


def _linear(topo: Topology, n: int, S: float, fidelity: str) -> float:
    g = collbench.graph_for("all_to_all", "linear", n, int(S))
    costs = CostModel.build(topo, {"fidelity": fidelity, "alpha": 0.0})
    return simulate(g, topo, costs).makespan


def _closed_form(n: int, S: float, K: float) -> float:
    """Each port carries F = n - 1 messages of S/n, each occupying it msg + conn * min(F, K)."""
    F = n - 1
    return F * S / (n * BW) + F * MSG + F * CONN * min(F, K)


@pytest.mark.parametrize("fidelity", ["bundled", "flow"])
@pytest.mark.parametrize("inflight", [None, 0, 5, 6, 100])
def test_below_the_bound_the_unbounded_form_holds_exactly(fidelity, inflight):
    """F = 5 messages per port: any bound of 5 or more (and 0 or none: no bound) leaves
    t = F S / (n bw) + F msg + conn F^2, the formula without a bound."""
    n, S = 6, 6e4
    got = _linear(_ports(n, inflight), n, S, fidelity)
    assert got == pytest.approx(_closed_form(n, S, float("inf")), rel=1e-12)


@pytest.mark.parametrize("fidelity", ["bundled", "flow"])
@pytest.mark.parametrize("n, K", [(6, 2), (17, 4), (33, 1)])
def test_above_the_bound_each_message_pays_k_connections(fidelity, n, K):
    """F = n - 1 > K: each message pays conn * K, the whole step F (msg + K conn) besides the
    payload."""
    S = 6e4
    got = _linear(_ports(n, K), n, S, fidelity)
    assert got == pytest.approx(_closed_form(n, S, K), rel=1e-12)


def test_far_above_the_bound_time_is_linear_in_the_peers():
    """Past K the per-peer slope is constant, msg + K conn (plus the payload's share): two
    steps of peers cost the same; without a bound the slope keeps growing by 2 conn per peer."""
    K, S_per_peer = 4, 1e3

    def t(n: int, inflight: int | None) -> float:
        return _linear(_ports(n, inflight), n, S_per_peer * n, "bundled")

    slope = MSG + K * CONN + S_per_peer / BW
    assert t(17, K) - t(9, K) == pytest.approx(8 * slope, rel=1e-9)
    assert t(33, K) - t(17, K) == pytest.approx(16 * slope, rel=1e-9)
    unbounded = (t(33, None) - t(17, None)) / 16
    assert unbounded > slope and unbounded == pytest.approx(
        MSG + S_per_peer / BW + CONN * (32**2 - 16**2) / 16, rel=1e-9
    )


def test_2dh_gain_stays_near_the_gpus_per_node_past_the_bound():
    """dgx-a100 (K = 256 from NCCL 2.10's rounds) at 2,048 GPUs, 1 MiB: the linear algorithm's
    2,040 remote peers per NIC pay 256 connections each, as 2DH's 255 nearly do, so 2DH gains
    about its message aggregation (8 GPUs per node) and no longer the unbounded 34x."""
    topo = Topology.load("dgx-a100", nodes=256)
    assert topo.link_classes["hdr"].conn_inflight == 256
    costs = CostModel.build(topo, {})
    t = {
        a: simulate(collbench.graph_for("all_to_all", a, 2048, 2**20), topo, costs).makespan
        for a in ("linear", "2dh")
    }
    assert 6 < t["linear"] / t["2dh"] < 10


@pytest.mark.parametrize("bad", [-1, 1.5, "many"])
def test_conn_inflight_is_a_count(bad):
    spec = {
        "name": "bad",
        "gpus_per_node": 1,
        "gpu": {"peak_flops": {"bf16": 1e14}, "mem_bw": 1e12, "memory_bytes": 80e9},
        "node": {"devices": {}, "links": [], "nic_of_gpu": ["gpu0"]},
        "fabric": {"type": "switch", "class": "port", "attach": ["gpu0"]},
        "link_classes": {"port": {"bw": BW, "conn_inflight": bad}},
    }
    with pytest.raises(TopologyError, match="conn_inflight"):
        Topology(spec)
