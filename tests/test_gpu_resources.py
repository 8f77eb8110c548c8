"""GPU-internal resources in the engine: reserved SMs, HBM share, copy engines, hardware queues.

Closed forms of `sim.hardware.costs.resources` in the engine, the hardware-queue order of
`sim.engine.queues`, and the one-line errors of `Task.sms` and `costs.resources`.
"""

from __future__ import annotations

import math

import pytest

from sim.core.errors import ConfigError, DeadlockError, GraphError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

TOPO = Topology.load("dgx-h100", nodes=1)
S = 132


def _run(tasks: list[Task], spec: dict | None = None, topo: Topology = TOPO):
    g = TaskGraph(1)
    for t in tasks:
        g.add(t)
    costs = CostModel.build(topo, spec or {})
    r = simulate(g, topo, costs)
    return {t.id: (float(r.start[i]), float(r.end[i])) for i, t in enumerate(g)}, costs


def _work(tid: str = "w", stream: str = "compute", flops: float = 1e12) -> Task:
    return Task(tid, 0, stream, "elementwise", flops=flops, tags={"dtype": "bf16"})


def _hold(k: int, nbytes: float = 0.0, kind: str = "elementwise") -> Task:
    """A kernel on its own stream holding k SMs, outlasting the work beside it."""
    flops = 0.0 if nbytes else 1e16
    return Task(
        "hold", 0, "compute.1", kind, flops=flops, bytes=nbytes, sms=k, tags={"dtype": "bf16"}
    )


def _alone(spec: dict | None = None) -> float:
    times, _ = _run([_work()], spec)
    return times["w"][1] - times["w"][0]


@pytest.mark.parametrize("k", [1, 24, 100])
def test_ideal_reservation_leaves_the_other_sms(k):
    """sm_share = 1: the work runs at (S-k)/S times the penalty, exactly."""
    spec = {"resources": {"sm_share": 1.0, "sm_penalty": 0.9}}
    alone = _alone(spec)
    times, _ = _run([_hold(k), _work()], spec)
    s, e = times["w"]
    assert e - s == pytest.approx(alone / ((S - k) / S * 0.9), rel=1e-9)


def test_fitted_sm_speed_is_its_closed_form():
    """The preset's Amdahl split: p / ((1 - b) + b S / (S - k))."""
    alone = _alone()
    times, costs = _run([_hold(24), _work()])
    p, b = costs.resources.sm_penalty, costs.resources.sm_share
    s, e = times["w"]
    assert e - s == pytest.approx(alone * ((1 - b) + b * S / (S - 24)) / p, rel=1e-9)


def test_reservation_ends_and_work_speeds_up():
    """The work runs slowed while the kernel holds its SMs, at full speed after."""
    spec = {"resources": {"sm_share": 1.0, "sm_penalty": 1.0}}
    alone = _alone(spec)
    hold = Task("hold", 0, "compute.1", "elementwise", flops=0.5e12, sms=66, tags={"dtype": "bf16"})
    times, _ = _run([hold, _work()], spec)
    h = times["hold"][1] - times["hold"][0]
    s, e = times["w"]
    # half speed while held: h seconds do h/2 of the work, the rest at full speed
    assert e - s == pytest.approx(h + (alone - h / 2), rel=1e-9)


def test_streaming_kernel_costs_bandwidth_beyond_the_knee():
    """A copy kernel on k SMs: SM-bound at k * sm_bw; the work loses its SMs and HBM share."""
    res = {"sm_share": 1.0, "sm_penalty": 1.0, "sm_bw": 1e11, "mem_knee": 0.1, "mem_slope": 0.5}
    spec = {"resources": res}
    alone = _alone(spec)
    k, nbytes = 20, 1e13
    times, costs = _run([_hold(k, nbytes, "d2d"), _work()], spec)
    h0, h1 = times["hold"]
    assert h1 - h0 == pytest.approx(nbytes / (k * 1e11), rel=1e-9)  # 2 TB/s, SM-bound
    u = 2e12 / costs.resources.mem_bw
    speed = (S - k) / S * (1 - 0.5 * (u - 0.1))
    s, e = times["w"]
    assert e - s == pytest.approx(alone / speed, rel=1e-9)


def test_host_copy_and_gemm_keep_their_alone_speed():
    """Copy engines take no SMs: a d2h beside a GEMM, both as fast as alone (finding 4)."""
    gemm = Task(
        "w",
        0,
        "compute",
        "gemm",
        flops=2e12,
        shape={"m": 8192, "n": 8192, "k": 8192},
        tags={"dtype": "bf16"},
    )
    d2h = Task("c", 0, "copy", "d2h", bytes=1e9)
    alone_g, _ = _run([gemm])
    alone_c, _ = _run([d2h])
    both, _ = _run([gemm, d2h])
    for tid, alone in (("w", alone_g), ("c", alone_c)):
        assert both[tid][1] - both[tid][0] == pytest.approx(alone[tid][1] - alone[tid][0])


def _queued() -> list[Task]:
    # issue order: a1, a2 (stream compute), b1 (stream compute.1, independent of both)
    return [_work("a1"), _work("a2"), _work("b1", "compute.1", 1e11)]


def test_one_hardware_queue_serialises_streams_in_issue_order():
    times, _ = _run(_queued(), {"resources": {"max_connections": 1}})
    # b1 waits behind a2 (head-of-line blocking), which waits for a1 to end and then keeps
    # the queue until its last wave of blocks is out: its end
    assert times["a2"][0] == pytest.approx(times["a1"][1])
    assert times["b1"][0] == pytest.approx(times["a2"][1])


def test_a_kernel_that_fits_one_wave_frees_its_queue_when_it_starts():
    """A kernel reserving its SMs (one block per SM) has every block out at once: the kernel
    of another stream behind it on the one queue starts beside it."""
    spec = {"resources": {"max_connections": 1}}
    hold = Task("h", 0, "compute.1", "elementwise", flops=1e13, sms=24, tags={"dtype": "bf16"})
    times, _ = _run([hold, _work("w")], spec)
    assert times["w"][0] == 0.0 and times["h"][1] > times["w"][0]


def test_default_queues_let_streams_run_concurrently():
    times, _ = _run(_queued())
    assert times["b1"][0] == 0.0


def test_a_gemm_of_one_wave_frees_its_queue_when_it_starts():
    """The GEMM model's waves: 128 x 128 output tiles of a 1024 x 1024 GEMM are 64 tiles, one
    wave on 132 SMs, so the next kernel on the one queue starts beside it; a GEMM of many
    waves keeps the queue to its end."""
    spec = {"resources": {"max_connections": 1}}

    def gemm(tid: str, m: int) -> Task:
        shape = {"batch": 1, "m": m, "n": 1024, "k": 8192}
        return Task(
            tid,
            0,
            "compute",
            "gemm",
            flops=2.0 * m * 1024 * 8192,
            shape=shape,
            tags={"dtype": "bf16"},
        )

    small, _ = _run([gemm("g", 1024), _work("w", "compute.1")], spec)
    assert small["w"][0] == 0.0 and small["g"][1] > 0
    big, _ = _run([gemm("g", 65536), _work("w", "compute.1")], spec)
    assert big["w"][0] == pytest.approx(big["g"][1])


def test_more_streams_than_queues_share_round_robin():
    """With 2 queues, streams 0, 1, 2 map to queues 0, 1, 0: stream 2 waits behind stream 0
    (until a2, issued before it on their shared queue, has ended)."""
    tasks = [_work("a1"), _work("a2"), _work("b1", "compute.1"), _work("c1", "compute.2")]
    times, _ = _run(tasks, {"resources": {"max_connections": 2}})
    assert times["b1"][0] == 0.0
    assert times["c1"][0] == pytest.approx(times["a2"][1])


def test_queue_deadlock_is_reported():
    """An issue order the host could not have (a task before the one it waits on) deadlocks on
    one queue, and the report says which queue head blocks it."""
    first = Task("x", 0, "compute.1", "elementwise", flops=1e9, deps=["y"], tags={"dtype": "bf16"})
    then = Task("z", 0, "compute", "elementwise", flops=1e9, tags={"dtype": "bf16"})
    dep = Task("y", 0, "compute", "elementwise", flops=1e9, deps=["z"], tags={"dtype": "bf16"})
    with pytest.raises(DeadlockError, match="hardware queue"):
        _run([first, then, dep], {"resources": {"max_connections": 1}})


def test_reserving_more_sms_than_the_gpu_has_is_an_error():
    with pytest.raises(ConfigError, match=r"task 'hold': reserves 133 SMs but the GPU .* has 132"):
        _run([_hold(133), _work()])


def test_reserving_sms_without_an_sm_count_is_an_error():
    topo = Topology.load("localhost-cpu")
    with pytest.raises(ConfigError, match="no SM count"):
        _run([_hold(1)], topo=topo)


@pytest.mark.parametrize(
    "resources, field",
    [
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": 33}, "max_connections"),
        ({"max_connections": 8.0}, "max_connections"),
        ({"sm_share": 0}, "sm_share"),
        ({"sm_penalty": 1.5}, "sm_penalty"),
        ({"sm_bw": math.inf}, "sm_bw"),
        ({"mem_knee": -0.1}, "mem_knee"),
        ({"mem_slope": math.nan}, "mem_slope"),
        ({"queues": 8}, "queues"),
    ],
)
def test_bad_resources_are_one_line_errors(resources, field):
    with pytest.raises(ConfigError, match=f"costs.resources.*{field}") as e:
        CostModel.build(TOPO, {"resources": resources})
    assert "\n" not in str(e.value)


def test_bad_resources_in_a_run_config_name_the_field():
    from pydantic import ValidationError

    from sim.config.run_schema import CostsSpec

    with pytest.raises(ValidationError, match="max_connections"):
        CostsSpec.model_validate({"resources": {"max_connections": 0}})


def _graph(task: dict) -> dict:
    return {"schema_version": 1, "world_size": 1, "tasks": [task]}


@pytest.mark.parametrize(
    "task, words",
    [
        (
            {"id": "c", "rank": 0, "stream": "copy", "kind": "d2h", "bytes": 8.0, "sms": 4},
            "copy engines hold no SMs",
        ),
        ({"id": "g", "rank": 0, "stream": "compute", "kind": "elementwise", "sms": -1}, "sms"),
        ({"id": "g", "rank": 0, "stream": "compute", "kind": "elementwise", "sms": 2.5}, "sms"),
        ({"id": "g", "rank": 0, "stream": "compute", "kind": "elementwise", "sms": True}, "sms"),
    ],
)
def test_bad_task_sms_is_a_one_line_error(task, words):
    with pytest.raises(GraphError, match=words) as e:
        TaskGraph.from_dict(_graph(task))
    assert "\n" not in str(e.value)


def test_task_sms_round_trips_and_defaults_away():
    t = Task("g", 0, "compute", "elementwise", sms=8)
    assert t.to_dict()["sms"] == 8
    assert "sms" not in Task("g", 0, "compute", "elementwise").to_dict()
    g = TaskGraph.from_dict(_graph(t.to_dict()))
    assert g.tasks["g"].sms == 8


def test_presets_name_their_sm_counts():
    for name, sms in (
        ("dgx-h100", 132),
        ("h800", 132),
        ("hgx-h200", 132),
        ("dgx-a100", 108),
        ("p3dn-v100", 80),
        ("gb200-nvl72", 148),
    ):
        assert CostModel.build(Topology.load(name, nodes=1), {}).resources.sms == sms


def _send_pair(nbytes: float) -> list[Task]:
    """Rank 0 sends to rank 1 on their comm streams: a kernel that outlasts nothing."""
    return [
        Task("s", 0, "comm", "send", bytes=nbytes, peer=1, group=[0, 1], coll="p"),
        Task("r", 1, "comm", "recv", bytes=nbytes, peer=0, group=[0, 1], coll="p"),
    ]


def _run2(tasks: list[Task], spec: dict):
    g = TaskGraph(2)
    for t in tasks:
        g.add(t)
    costs = CostModel.build(TOPO, spec)
    r = simulate(g, TOPO, costs)
    return {t.id: (float(r.start[i]), float(r.end[i])) for i, t in enumerate(g)}


def test_comm_sms_slow_the_compute_beside_a_communication_kernel():
    """costs.resources.comm_sms: a comm kernel naming no SMs holds that many; work beside it
    runs at (S-k)/S (ideal form) while it is resident and at full speed after."""
    spec = {"resources": {"sm_share": 1.0, "sm_penalty": 1.0, "comm_sms": 33}}
    alone = _run2([_work(flops=1e14)], spec)["w"]
    alone = alone[1] - alone[0]
    times = _run2([*_send_pair(8e9), _work(flops=1e14)], spec)
    c = times["s"][1] - times["s"][0]
    s, e = times["w"]
    assert c < alone  # the transfer ends first: a part at (S-k)/S, the rest at full speed
    done_while_held = c * (S - 33) / S
    assert e - s == pytest.approx(c + (alone - done_while_held), rel=1e-9)
    # by default (0) communication holds no SMs: the work runs alone
    d = _run2(
        [*_send_pair(8e9), _work(flops=1e14)], {"resources": {"sm_share": 1.0, "sm_penalty": 1.0}}
    )
    assert d["w"][1] - d["w"][0] == pytest.approx(alone, rel=1e-12)


def test_comm_sms_bad_values_are_one_line_errors():
    for v in (-1, 1.5, True, 2000):
        with pytest.raises(ConfigError, match=r"costs\.resources\.comm_sms"):
            CostModel.build(TOPO, {"resources": {"comm_sms": v}})
    g = TaskGraph(2)
    for t in _send_pair(1e6):
        g.add(t)
    costs = CostModel.build(TOPO, {"resources": {"comm_sms": 500}})
    with pytest.raises(ConfigError, match="reserves 500 SMs but the GPU"):
        simulate(g, TOPO, costs)


def _a2a(nbytes: float, sms: int) -> list[Task]:
    """An all-to-all of `nbytes` per rank over the 8 GPUs of a dgx-h100, each kernel holding
    `sms` SMs."""
    return [
        Task(
            f"a{r}",
            r,
            "comm",
            "all_to_all",
            bytes=nbytes,
            group=list(range(8)),
            coll="a2a",
            sms=sms,
        )
        for r in range(8)
    ]


@pytest.mark.parametrize("network", ["flow", "collective"])
def test_a_communication_kernel_sends_no_faster_than_its_sms(network):
    """costs.resources.comm_sm_bw: a kernel on k SMs takes at least bytes / (k x bw), the
    closed form once it binds; with SMs fast enough for the links, the links rule."""
    nbytes, k = 1e9, 4

    def span(resources: dict, sms: int = k) -> float:
        # at line rate: the preset's comm_sm_efficiency has its own test below
        res = {"comm_sm_efficiency": 1.0, **resources}
        g = TaskGraph(8)
        for t in _a2a(nbytes, sms):
            g.add(t)
        costs = CostModel.build(TOPO, {"network": network, "resources": res})
        r = simulate(g, TOPO, costs)
        return float(r.end.max() - r.start.min())

    links = span({"comm_sm_bw": 1e15})
    bound = span({"comm_sm_bw": 5e9})  # 4 SMs x 5 GB/s = 20 GB/s: far below NVLink
    assert bound == pytest.approx(nbytes / (k * 5e9), rel=1e-12) and bound > 10 * links
    assert span({"comm_sm_bw": 5e9}, sms=0) == pytest.approx(links, rel=1e-12)  # none reserved
    both = {"comm_sm_bw": 5e9, "comm_sms": 4}  # NCCL's SMs: taken from compute, not bounding
    assert span(both, sms=0) == pytest.approx(links, rel=1e-12)
    assert span({"comm_sm_bw": 1e12}) == pytest.approx(links, rel=1e-12)  # the links bind
    # the preset's 14 GB/s per SM (DeepEP's measured NVLink kernels): 4 SMs bind, 132 do not
    assert span({}) == pytest.approx(nbytes / (k * 14e9), rel=1e-12)
    assert span({}, sms=132) == pytest.approx(links, rel=1e-12)


@pytest.mark.parametrize("network", ["flow", "collective"])
def test_an_sm_holding_kernel_reaches_its_efficiency_of_the_links(network):
    """costs.resources.comm_sm_efficiency e: a kernel holding SMs of its own takes 1/e of the
    link time per byte. Flows: span(e) = latency + T / e, so halving e again doubles the
    increment; collective level: the whole duration scales. Kernels holding no SMs (NCCL's)
    and e = 1 are the line rate."""
    nbytes = 1e9

    def span(eff: float, sms: int = 24) -> float:
        g = TaskGraph(8)
        for t in _a2a(nbytes, sms):
            g.add(t)
        res = {"comm_sm_bw": 1e15, "comm_sm_efficiency": eff}  # SMs never bind here
        r = simulate(g, TOPO, CostModel.build(TOPO, {"network": network, "resources": res}))
        return float(r.end.max() - r.start.min())

    full, half, quarter = span(1.0), span(0.5), span(0.25)
    assert quarter - half == pytest.approx(2 * (half - full), rel=1e-9)
    assert half > 1.9 * full if network == "flow" else half == pytest.approx(2 * full, rel=1e-12)
    assert span(0.5, sms=0) == pytest.approx(full, rel=1e-12)
    assert CostModel.build(TOPO, {}).resources.comm_sm_efficiency == 0.865  # the preset's fit
    for v in (0, -0.5, 1.5, math.nan, "high", True):
        with pytest.raises(ConfigError, match=r"costs\.resources\.comm_sm_efficiency") as e:
            CostModel.build(TOPO, {"resources": {"comm_sm_efficiency": v}})
        assert "\n" not in str(e.value)


def test_comm_sm_bw_bad_values_are_one_line_errors():
    for v in (0, -1.0, math.inf, "fast", True):
        with pytest.raises(ConfigError, match=r"costs\.resources\.comm_sm_bw") as e:
            CostModel.build(TOPO, {"resources": {"comm_sm_bw": v}})
        assert "\n" not in str(e.value)


def test_a_kernel_receiving_more_than_it_sends_is_bounded_by_what_it_receives():
    """The same SMs send and receive: an all-to-allv where rank 0 receives 7x what it sends
    (a hot expert GPU) ends no sooner than its received bytes / (k x bw)."""
    k, bw, row = 4, 5e9, 1e8
    send = [[0.0] + [row] * 7] + [[7 * row] + [0.0] * 7 for _ in range(7)]  # [src][dst]
    g = TaskGraph(8)
    for r in range(8):
        g.add(
            Task(
                f"v{r}",
                r,
                "comm",
                "all_to_allv",
                bytes=sum(send[r]),
                split=send[r],
                recv_split=[send[s][r] for s in range(8)],
                group=list(range(8)),
                coll="a2av",
                sms=k,
            )
        )
    costs = CostModel.build(TOPO, {"resources": {"comm_sm_bw": bw, "comm_sm_efficiency": 1.0}})
    r = simulate(g, TOPO, costs)
    assert float(r.end[0] - r.start[0]) == pytest.approx(49 * row / (k * bw), rel=1e-9)
