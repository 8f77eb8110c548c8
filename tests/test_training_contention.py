"""Compute beside overlapped collectives (`sim.training.contention`): the closed form, FSDP's
passes, the distributed optimizer's tasks in the step's graph, TP overlap, the presets'
`coll_sms` fields."""

from __future__ import annotations

from typing import Any

import pytest

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.resources import Resources
from sim.hardware.topology import Topology
from sim.training.contention import (
    RING_HBM,
    Contention,
    TpSms,
    build,
    lost,
    phase_seconds,
    received,
    stretch,
)
from sim.training.layout import Layout
from sim.training.pipeline import Phase, StagePrograms, _emit_chains, _Emitter, step_graph
from sim.training.recipe import Recipe


@pytest.mark.parametrize("c,t", [(1.0, 0.5), (0.5, 1.0), (1.0, 1.0), (0.0, 2.0), (3.0, 0.0)])
def test_full_speed_is_the_longer_of_compute_and_collective(c: float, t: float) -> None:
    assert phase_seconds(c, t, 1.0) == max(c, t)
    assert lost(c, t, 1.0) == 0.0


def test_closed_form_below_full_speed() -> None:
    """C / s <= T: the collective's time; else C + T (1 - s)."""
    assert phase_seconds(0.6, 1.0, 0.75) == pytest.approx(1.0)  # 0.6 / 0.75 = 0.8 <= 1
    assert phase_seconds(2.0, 1.0, 0.75) == pytest.approx(2.0 + 0.25)
    assert phase_seconds(0.75, 1.0, 0.75) == pytest.approx(1.0)  # the boundary: C / s = T
    # continuous across the boundary, and never below max(C, T)
    for c in (0.5, 0.74, 0.76, 0.9, 1.0, 1.5):
        assert phase_seconds(c, 1.0, 0.75) >= max(c, 1.0)


def test_one_layer_pass_stretched_as_the_closed_form() -> None:
    one = [Phase("compute", 2.0, "layer", 0)]
    assert stretch(one, 1.0, 1.0) == one  # s = 1: max(C, T) = C, today's pass
    assert sum(p.seconds for p in stretch(one, 3.0, 1.0)) == pytest.approx(3.0)
    assert sum(p.seconds for p in stretch(one, 1.0, 0.75)) == pytest.approx(2.25)
    assert sum(p.seconds for p in stretch(one, 3.0, 0.75)) == pytest.approx(3.0)
    # a communication phase in the pass is not slowed: only the compute loses
    mixed = [Phase("compute", 1.0, "a", 0), Phase("comm", 0.5, "x", 0), Phase("compute", 1.0, "b")]
    out = stretch(mixed, 1.0, 0.75)
    assert out[1].seconds == 0.5
    assert sum(p.seconds for p in out) == pytest.approx(2.5 + 0.25)


class _Fixed:
    """A collective timer that answers `t` seconds for every collective."""

    simulations = 0

    def __init__(self, t: float) -> None:
        self.t = t

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return self.t if nbytes > 0 else 0.0

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        return self.t

    def place(self, rank: int) -> int:
        return rank


def _fsdp_model(t: float, contention: Contention | None) -> Any:
    from sim.training.kernels import GpuKernels
    from sim.training.ops import PRECISIONS
    from sim.training.step import StepModel
    from sim.workload.architectures import architecture

    topo = Topology.load("dgx-h100", nodes=1)
    lay = Layout(gpus=8, fsdp=8, gbs=16, seq=4096)
    m = StepModel(
        architecture("llama3-8b"),
        lay,
        PRECISIONS["BF16"],
        Recipe(grad_reduce_bytes=2),
        GpuKernels.from_gpu(topo.gpu, "t"),
        _Fixed(t),
    )
    m.contention = contention
    return m


def _passes(m: Any) -> list[float]:
    progs, _ = m.stage_programs()
    return [sum(p.seconds for p in ps) for ps in progs[0].fwd + progs[0].bwd]


def test_fsdp_pass_is_the_closed_form_with_a_stub_timer() -> None:
    """Each pass: compute C (no collectives) beside the layers' gathers (forward) and gathers
    and reduce-scatters (backward), T = t per collective, at s = (S - k) / S."""
    t = 2e-3
    bare = _passes(_fsdp_model(0.0, None))
    m0 = _fsdp_model(t, None)
    works = m0.chunk_work()[0][0]
    n = len(works)  # every layer work gathers its weights once a pass (all have weights)
    today = _passes(m0)
    assert today == pytest.approx([max(bare[0], n * t), max(bare[1], 2 * n * t)])
    res = Resources(sms=132, mem_bw=3.35e12, coll_sms=33)  # ideal SMs, no memory term
    s = res.sm_speed(33)
    assert s == pytest.approx(0.75)
    got = _passes(_fsdp_model(t, Contention(res)))
    assert got == pytest.approx(
        [phase_seconds(bare[0], n * t, s), phase_seconds(bare[1], 2 * n * t, s)]
    )
    assert got[0] > today[0] and got[1] > today[1]


def test_no_sms_changes_nothing() -> None:
    """k = 0 (and no memory term): today's passes, to the bit; a preset naming no SMs for
    the collectives builds no contention at all."""
    t = 2e-3
    today = _passes(_fsdp_model(t, None))
    assert _passes(_fsdp_model(t, Contention(Resources(sms=132, mem_bw=3.35e12)))) == today
    topo = Topology.load("dgx-h100", nodes=1)
    lay = Layout(gpus=8, fsdp=8, gbs=16, seq=4096)
    res = dict(topo.gpu["resources"], coll_sms=0, coll_sms_net=0)

    class _Topo:
        gpu = {**topo.gpu, "resources": res}
        gpus_per_node = 8

    assert build(Recipe(), lay, _Topo(), lambda r: r) is None
    assert build(Recipe(), lay, topo, lambda r: r) is not None


def test_ring_memory_share_on_h100_is_above_the_knee() -> None:
    """An 8-GPU ring all-gather at ~370 GB/s received moves ~3 bytes of HBM per byte: about
    a third of an H100's HBM, well past the fitted knee (0.063)."""
    res = Resources.build(Topology.load("dgx-h100", nodes=1).gpu, None)
    shard = 64e6
    sec = received("all_gather", shard, 8) / 370e9
    u = res.mem_share(RING_HBM * received("all_gather", shard, 8), sec)
    assert u == pytest.approx(3 * 370e9 / 3.35e12)
    assert u > res.mem_knee and res.mem_factor(u) < 0.9


def test_dp_collectives_hold_sms_and_slow_the_compute_beside_them() -> None:
    """The distributed optimizer's gather of chunk 1 runs beside chunk 0's forward: that
    forward takes the closed form at the engine's speed for the task's SMs and HBM share."""
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, {"network": "collective"})
    tf, tb, T, k, u = 1e-3, 2e-3, 0.6e-3, 24, 0.3
    ph = lambda x: [Phase("compute", x, "all")]  # noqa: E731

    def step(hold: tuple[int, float]) -> float:
        prog = StagePrograms(
            [ph(tf), ph(tf)],
            [ph(tb), ph(tb)],
            gather=[[(0, 0.0, 0, 0.0)], [(1, T, *hold)]],
            reduce=[[], []],
        )
        g = step_graph([prog], [0], topo.world_size, 1, 2, 0.0, overlap=False)
        return simulate(g, topo, costs).makespan

    s = costs.resources.speed(k, u)
    assert step((0, 0.0)) == pytest.approx(2 * tf + 2 * tb)  # no hold: the gather is free
    assert step((k, u)) == pytest.approx(phase_seconds(tf, T, s) + tf + 2 * tb)
    assert step((k, 0.0)) == pytest.approx(
        phase_seconds(tf, T, costs.resources.sm_speed(k)) + tf + 2 * tb
    )


def test_ep_collective_slows_the_merged_partner_only_while_it_runs() -> None:
    """A merged pair (EP overlap): the forward's all-to-all (T seconds, its kernel on k SMs,
    `Phase.hold`) runs beside the backward's compute b, which takes the closed form
    b + T (1 - s) (b / s > T) at the engine's speed s for k SMs; without SMs held the
    all-to-all hides in b; a longer b loses no more."""
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, {"network": "collective"})
    c1, T, c2, k = 0.2e-3, 0.5e-3, 0.3e-3, 32

    def pair(b: float, hold: tuple[int, float]) -> float:
        g = TaskGraph(topo.world_size)
        fwd = [
            Phase("compute", c1, "before"),
            Phase("comm", T, "dispatch", kind="all_to_all", hold=hold),
            Phase("compute", c2, "after"),
        ]
        chains = [["F", 1, 0, fwd, []], ["B", 0, 0, [Phase("compute", b, "bwd")], []]]
        _emit_chains(_Emitter(g, 0, 0), chains, {}, 0, 1)
        return simulate(g, topo, costs).makespan

    s = costs.resources.sm_speed(k)
    for b in (2e-3, 8e-3):
        assert pair(b, (0, 0.0)) == pytest.approx(c1 + b + c2)
        assert pair(b, (k, 0.0)) == pytest.approx(c1 + phase_seconds(b, T, s) + c2)
        assert pair(b, (k, 0.0)) - pair(b, (0, 0.0)) == pytest.approx(T * (1 - s))


def test_tp_overlap_loss_per_userbuffers_method() -> None:
    res = Resources(sms=132, mem_bw=3.35e12, coll_sms=24)
    con = Contention(res, tp=TpSms(4, 24, 2, 4, 0))
    # forward all-gather: ring exchange over the copy engine, no SMs, no memory term here
    assert con.tp_loss("all_gather", True, False, 1.0, 0.1, 0.0) == 0.0
    # backward of a column-parallel layer: a bulk all-gather on 4 SMs beside the dgrad and a
    # bulk reduce-scatter on 24 beside the wgrad, half the hidden time each
    want = 0.05 * (1 - res.sm_speed(4)) + 0.05 * (1 - res.sm_speed(24))
    assert con.tp_loss("all_gather", True, True, 1.0, 0.1, 0.0) == pytest.approx(want)
    # a row-parallel reduce-scatter forward: the fprop overlap's SMs (TE's default 16)
    te = Contention(res)
    assert te.tp_loss("reduce_scatter", False, False, 1.0, 0.1, 0.0) == pytest.approx(
        0.1 * (1 - res.sm_speed(16))
    )


def test_nccl_ub_with_nvls_takes_four_and_five_sms_in_a_node() -> None:
    res = Resources(sms=132, coll_sms=24, coll_sms_net=16)
    assert Contention(res).coll("all_gather", "dpcp") == (24, RING_HBM)
    ub = Contention(res, {"dpcp": False}, nvls_ub=True)
    assert ub.coll("all_gather", "dpcp")[0] == 4 and ub.coll("reduce_scatter", "dpcp")[0] == 5
    assert Contention(res, {"dpcp": True}, nvls_ub=True).coll("all_gather", "dpcp")[0] == 16
    rec = Recipe(notes={"other": {"nccl_ub": True, "NCCL_NVLS_ENABLE": 1}})
    topo = Topology.load("dgx-h100", nodes=1)
    got = build(rec, Layout(gpus=8, fsdp=8, gbs=16, seq=4096), topo, lambda r: r)
    assert got is not None and got.nvls_ub and got.spans["dpcp"] is False


def test_presets_name_the_collectives_sms() -> None:
    want = {"dgx-h100": (24, 16), "dgx-b200": (32, 16), "gb200-nvl72": (32, 16), "h800": (16, 16)}
    for name, (k, k_net) in want.items():
        res = Resources.build(Topology.load(name, nodes=1).gpu, None)
        assert (res.coll_sms, res.coll_sms_net) == (k, k_net), name


@pytest.mark.parametrize("v", [-1, 1.5, True, "24", 2000])
@pytest.mark.parametrize("key", ["coll_sms", "coll_sms_net"])
def test_coll_sms_refuses_what_is_not_a_count_of_sms(key: str, v: object) -> None:
    with pytest.raises(ConfigError, match=key):
        Resources.build({"sms": 132}, {key: v})
    from pydantic import ValidationError

    from sim.hardware.costs_schema import ResourceParams

    with pytest.raises(ValidationError):
        ResourceParams.model_validate({key: v})


class _Recording(_Fixed):
    """`_Fixed`, keeping the bytes of every collective it is asked for."""

    def __init__(self, t: float) -> None:
        super().__init__(t)
        self.asked: list[tuple[str, str, float]] = []

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        self.asked.append((kind, dim, nbytes))
        return super().seconds(kind, dim, nbytes, algo)


def test_fsdp_gathers_fp8_weights_a_byte_each() -> None:
    """With `fp8_param_gather` Megatron-FSDP all-gathers the weights in FP8: half the bytes
    of the bf16 gather, as the distributed optimizer's (`dp_hold`); reduce-scatters keep the
    gradients' dtype."""
    from dataclasses import replace

    def gathered(fp8: bool) -> tuple[set[float], set[float]]:
        m = _fsdp_model(1e-3, None)
        m.r = replace(m.r, fp8_param_gather=fp8)
        rec = _Recording(1e-3)
        m.comm = rec
        m.stage_programs()
        ag = {b for k, _, b in rec.asked if k == "all_gather"}
        rs = {b for k, _, b in rec.asked if k == "reduce_scatter"}
        return ag, rs

    (ag16, rs16), (ag8, rs8) = gathered(False), gathered(True)
    assert ag16 and sorted(ag8) == pytest.approx(sorted(b / 2 for b in ag16))
    assert rs8 == rs16
