"""The step model's DeepEP (and HybridEP) collective moves the rows DeepEP's kernels move: one
per (token, GPU holding one of its experts), not one per (token, expert) as the all-to-all
dispatcher does, and on the SMs it holds no faster than their per-SM rate."""

from __future__ import annotations

from math import comb

import pytest

from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.training.comm import CommTimer
from sim.training.layout import Layout

TOKENS, HIDDEN, TOP_K, EXPERTS, EP = 4096, 7168, 8, 64, 8
COPIES = TOKENS * TOP_K * HIDDEN * 2.0  # bf16 rows, one per (token, expert)


def _timer(preset: str = "dgx-h100") -> CommTimer:
    topo = Topology.load(preset, nodes=1)
    return CommTimer(topo, CostModel.build(topo), Layout(gpus=EP, ep=EP, gbs=EP))


def test_each_token_goes_once_to_every_gpu_holding_one_of_its_experts():
    timer = _timer()
    tasks = timer.deepep_tasks(COPIES, TOP_K, EXPERTS, False, 24)
    # a GPU holds 8 of the 64 experts: a token misses it with C(56, 8) / C(64, 8)
    touch = 1.0 - comb(EXPERTS - EXPERTS // EP, TOP_K) / comb(EXPERTS, TOP_K)
    row = HIDDEN * 2.0
    for t in tasks:
        assert t.split == pytest.approx([TOKENS * touch * row] * EP)
        assert t.bytes == pytest.approx(TOKENS * touch * row * EP)
        assert t.tags["node_bytes"] == [0.0]  # one node: nothing over RDMA
    # fewer bytes than the all-to-all's copies (5.3 GPUs per token of 8 experts)
    assert tasks[0].bytes == pytest.approx(COPIES * touch * EP / TOP_K)
    assert tasks[0].bytes < 0.7 * COPIES


def test_one_expert_per_token_moves_every_copy():
    """top-1: a token's one copy is its one row, so DeepEP moves what the all-to-all moves."""
    tasks = _timer().deepep_tasks(COPIES / TOP_K, 1, EXPERTS, False, 24)
    assert sum(tasks[0].split) == pytest.approx(COPIES / TOP_K)


@pytest.mark.parametrize("preset,per_sm", [("dgx-h100", 14.0e9), ("dgx-b200", 19.0e9)])
def test_few_sms_bound_the_kernel_at_their_per_sm_rate(preset, per_sm):
    """On 4 SMs the kernel's SMs, not NVLink, pace it: its time is the rows it receives (its
    own included, as DeepEP's tests count them) over 4 x the preset's per-SM rate."""
    timer = _timer(preset)
    assert timer.topo.gpu["resources"]["comm_sm_bw"] == per_sm
    tasks = timer.deepep_tasks(COPIES, TOP_K, EXPERTS, False, 4)
    for combine in (False, True):
        seconds = timer.deepep(COPIES, TOP_K, EXPERTS, combine, 4)
        assert seconds == pytest.approx(tasks[0].bytes / (4 * per_sm), rel=1e-6)


def test_hybridep_is_paced_by_its_share_of_the_links_not_by_its_sms():
    """HybridEP (`flex_dispatch` with the GPU's `hybridep_link_share`): the same time on 16 or
    32 SMs, the links' time over the share; DeepEP on the same GPUs is paced by its SMs."""
    from sim.training.comm import flex_dispatch
    from sim.training.kernels import GpuKernels

    timer = _timer("gb200-nvl72")
    share = GpuKernels.from_gpu(timer.topo.gpu, "gb200").hybridep_link_share
    assert 0 < share < 1
    t16, t32 = (flex_dispatch(timer, COPIES, TOP_K, EXPERTS, False, sms, share) for sms in (16, 32))
    assert t16 == t32
    links = timer.deepep(COPIES, TOP_K, EXPERTS, False, 0)  # no SMs held: the links alone
    assert t16 == pytest.approx(links / share, rel=0.01)  # latency is not scaled
    deepep16, deepep32 = (flex_dispatch(timer, COPIES, TOP_K, EXPERTS, False, s) for s in (16, 32))
    assert deepep16 == pytest.approx(2 * deepep32, rel=1e-6)  # both SM-paced at 19 GB/s
