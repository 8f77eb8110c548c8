"""Ranks sharing one CPU host (sim.hardware.costs.host) and gloo's all-to-all on it
(sim.hardware.costs.gloo): the degenerate cases in closed form, the warning, and nothing
changed on a GPU topology."""

from __future__ import annotations

import pytest

from sim.core.errors import TopologyError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.calibration import Calibration
from sim.hardware.costs.host import HostCompute, HostUse, SharedCpu, calibrated_use
from sim.hardware.topology import Topology

GEMM = {"alpha": 1e-4, "beta": 1e-9}
COPY = {"alpha": 1e-5, "beta": 2e-10}
A2A = {"alpha": 4e-5, "beta": 1e-9}  # measured at 2 ranks
BW = Topology.load("localhost-cpu").gpu["mem_bw"]  # one thread's streaming rate, alone


def calibration(tmp_path, ranks=2, threads=1, cores=2, **meta) -> str:
    cal = Calibration(
        compute={"gemm": {"fp32": dict(GEMM)}, "elementwise": dict(COPY)},
        collectives={"all_to_all": [{"ranks": ranks, **A2A}]},
        meta={
            "backend": "gloo",
            "device_type": "cpu",
            "nprocs": ranks,
            "cores": cores,
            "threads_per_rank": threads,
            "stand_ins": {"bf16": "fp32"},
            **meta,
        },
    )
    return str(cal.save(tmp_path / f"cal{ranks}x{threads}on{cores}.yaml"))


def model(nodes, cal=None, topology="localhost-cpu", **host) -> CostModel:
    spec: dict = {"shared_cpu": host} if host else {}
    if cal:
        spec["calibration"] = cal
    return CostModel.build(Topology.load(topology, nodes=nodes), spec)


def gemm(rank=0, tid="g"):
    shape = {"m": 100, "n": 100, "k": 100}
    return Task(tid, rank, "compute", "gemm", flops=2e6, shape=shape, tags={"dtype": "fp32"})


def elementwise(rank=0):
    return Task("e", rank, "compute", "elementwise", bytes=1e6, tags={"dtype": "fp32"})


CALIBRATED_GEMM = GEMM["alpha"] + GEMM["beta"] * 1e6
CALIBRATED_COPY = COPY["alpha"] + COPY["beta"] * 1e6


# -- the share of the cores --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ranks", "cores"),
    [(2, 2), (4, 4), (8, 8)],
)
def test_one_rank_per_core_is_no_slowdown(tmp_path, ranks, cores):
    """Calibrated at 2 ranks of 1 thread on 2 cores (a core each); any run with a core per
    rank costs what was calibrated: compute, memory-bound (on a host whose memory serves
    every core at once), and the 2-rank all-to-all."""
    c = model(ranks, calibration(tmp_path), cores=cores, threads_per_rank=1, mem_bw=cores * BW)
    assert c.compute.duration(gemm()) == pytest.approx(CALIBRATED_GEMM, rel=1e-12)
    assert c.compute.duration(elementwise()) == pytest.approx(CALIBRATED_COPY, rel=1e-12)
    host = c.sources["host"]
    assert host["compute_factor"] == host["memory_factor"] == host["collective_factor"] == 1.0
    assert host["warning"] is None
    if ranks == 2:
        assert c.collective.params("all_to_all", 2) == pytest.approx((A2A["alpha"], A2A["beta"]))


def test_four_ranks_on_two_cores_compute_twice_the_two_rank_calibration(tmp_path):
    """4 ranks of 1 thread on 2 cores: half a core each, against a calibration at 2 ranks on
    the same 2 cores (a core each): every kernel 2x, in the engine too."""
    cal = calibration(tmp_path)
    c = model(4, cal, cores=2)  # threads auto: max(1, 2 // 4) = 1, as the executor sets
    assert c.compute.duration(gemm()) == pytest.approx(2 * CALIBRATED_GEMM, rel=1e-12)
    assert c.compute.duration(elementwise()) == pytest.approx(2 * CALIBRATED_COPY, rel=1e-12)
    g = TaskGraph(4)
    for r in range(4):
        g.add(gemm(r, f"g{r}"))
    assert simulate(g, Topology.load("localhost-cpu", nodes=4), c).makespan == pytest.approx(
        2 * CALIBRATED_GEMM, rel=1e-9
    )
    # the calibration's own host again: as calibrated
    assert model(2, cal, cores=2).compute.duration(gemm()) == pytest.approx(CALIBRATED_GEMM)


def test_threads_per_rank_are_the_rank_share():
    """A rank's share is min(threads, cores / ranks): 1 rank of 2 threads on 2 cores has
    twice the share of a rank of 2 ranks x 1 on them; 2 x 2 on 2 cores, no more than 2 x 1."""
    assert HostUse(1, 2, 2).cores_per_rank == 2.0
    assert HostUse(2, 1, 2).cores_per_rank == 1.0
    assert HostUse(2, 2, 2).cores_per_rank == 1.0 and HostUse(2, 2, 2).oversubscribed
    assert HostUse(4, 1, 2).cores_per_rank == 0.5


def test_memory_bandwidth_shared_by_the_running_ranks(tmp_path):
    """16 cores, the host's memory serving 2 threads' worth (mem_bw = 2 x thread_mem_bw):
    calibrated at 2 ranks of 1 thread (each streams alone: BW), run at 8 ranks of 1 thread
    (8 running threads share 2 x BW: BW / 4 each): memory-bound kernels 4x, GEMMs as
    calibrated (a core each)."""
    cal = calibration(tmp_path, ranks=2, threads=1, cores=16)
    c = model(8, cal, cores=16, threads_per_rank=1, mem_bw=2 * BW)
    assert c.compute.duration(gemm()) == pytest.approx(CALIBRATED_GEMM, rel=1e-12)
    assert c.compute.duration(elementwise()) == pytest.approx(4 * CALIBRATED_COPY, rel=1e-12)
    # oversubscribed as well: 16 ranks on 8 cores, half a core each, running 8 threads
    c = model(16, cal, cores=8, threads_per_rank=1, mem_bw=2 * BW)
    # ref: 1 core x min(BW, 2BW/2) = BW; run: 0.5 x min(BW, 2BW/8) = BW/8
    assert c.compute.duration(elementwise()) == pytest.approx(8 * CALIBRATED_COPY, rel=1e-12)
    assert c.compute.duration(gemm()) == pytest.approx(2 * CALIBRATED_GEMM, rel=1e-12)


def test_without_a_calibration_the_topology_figures_are_one_core_per_rank():
    """localhost-cpu's peak_flops and mem_bw are one core's: 2 ranks on 2 cores are as the
    preset says; 4 ranks on them take twice as long (the preset's default run, 2 ranks)."""
    g = gemm()
    base = CostModel.build(Topology.load("localhost-cpu", nodes=2), {"shared_cpu": False})
    at2, at4 = model(2, cores=2), model(4, cores=2)
    assert at2.compute.duration(g) == pytest.approx(base.compute.duration(g), rel=1e-12)
    assert at4.compute.duration(g) == pytest.approx(2 * base.compute.duration(g), rel=1e-12)


def test_the_calibration_records_its_host():
    """nprocs, cores and threads per rank from the meta; older files: meta.load.cores or the
    CPU count, and the threads the executor would have given; a GPU calibration: none."""
    assert calibrated_use({"nprocs": 2, "cores": 2, "threads_per_rank": 1}) == HostUse(2, 1, 2)
    assert calibrated_use({"nprocs": 2, "load": {"cores": 4}}) == HostUse(2, 2, 4)
    assert calibrated_use({"nprocs": 4, "cpus": 2}) == HostUse(4, 1, 2)
    assert calibrated_use({"nprocs": 2, "cores": 2, "device_type": "cuda"}) is None
    assert calibrated_use({"cores": 2}) is None


def test_a_calibration_without_its_host_is_not_scaled(tmp_path):
    cal = Calibration(compute={"gemm": {"fp32": dict(GEMM)}}, meta={"device_type": "cpu"})
    path = str(cal.save(tmp_path / "bare.yaml"))
    c = model(4, path, cores=2)
    assert c.compute.duration(gemm()) == pytest.approx(CALIBRATED_GEMM, rel=1e-12)
    assert "not recorded" in c.sources["host"]["reference"]


# -- gloo's all-to-all -------------------------------------------------------------------------
def gloo_steps(n, nbytes, alpha0, beta0, n0=2, copy=2.0 / BW):
    """gloo::alltoall step by step: the local copy of the own chunk, then each of the n - 1
    peers' start-up (its wait) and chunk through the rank's transport, at the per-peer costs
    a fit at n0 ranks fixes."""
    a = alpha0 / (n0 - 1)
    w = (beta0 - copy / n0) * n0 / (n0 - 1)
    chunk = nbytes / n
    return chunk * copy + sum(a + chunk * w for _ in range(1, n))


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_gloo_all_to_all_is_its_steps(tmp_path, n):
    """A 2-rank fit carried to n ranks as gloo runs it equals the sum of its steps, on a host
    with a core per rank (no sharing); at 2 ranks it is the measured fit."""
    c = model(n, calibration(tmp_path), cores=n, threads_per_rank=1)
    for nbytes in (0.0, 4096.0, 2.0**22):
        a, b = c.collective.params("all_to_all", n)
        assert a + b * nbytes == pytest.approx(
            gloo_steps(n, nbytes, A2A["alpha"], A2A["beta"]), rel=1e-12
        )
    assert c.collective.params("all_to_allv", n) == c.collective.params("all_to_all", n)
    if n == 2:
        assert c.collective.params("all_to_all", 2) == pytest.approx((A2A["alpha"], A2A["beta"]))


@pytest.mark.parametrize(("n", "bytes_"), [(3, 1.0), (4, 1.2), (8, 2.4)])
def test_gloo_all_to_all_in_the_engine_on_shared_cores(tmp_path, n, bytes_):
    """n ranks on 2 cores against a calibration at 2 ranks on them: the per-peer start-ups as
    gloo's steps give them; the bytes slow once the ranks' transfers (0.6 of a core each: the
    preset's comm_cores) want more than the 2 cores: x max(1, 0.3 n). As the engine runs it."""
    c = model(n, calibration(tmp_path), cores=2)
    nbytes = 2.0**20
    g = TaskGraph(n)
    group = list(range(n))
    for r in group:
        g.add(Task(f"a{r}", r, "comm", "all_to_all", bytes=nbytes, group=group, coll="x"))
    res = simulate(g, Topology.load("localhost-cpu", nodes=n), c)
    alpha = (n - 1) * A2A["alpha"]
    want = alpha + bytes_ * (gloo_steps(n, nbytes, A2A["alpha"], A2A["beta"]) - alpha)
    assert res.makespan == pytest.approx(want, rel=1e-9)


def test_fit_mode_keeps_the_nearest_fit(tmp_path):
    c = model(4, calibration(tmp_path), cores=4, threads_per_rank=1, all_to_all="fit")
    assert c.collective.params("all_to_all", 4) == pytest.approx((A2A["alpha"], A2A["beta"]))


# -- the warning, and nothing changed elsewhere --------------------------------------------------
def test_the_warning_when_ranks_times_threads_exceed_the_cores(tmp_path):
    cal = calibration(tmp_path)
    assert SharedCpu.build(Topology.load("localhost-cpu", nodes=2), {"cores": 2}).warning() is None
    c = model(4, cal, cores=2)
    w = c.sources["host"]["warning"]
    assert w.startswith("4 ranks x 1 threads per rank = 4 threads on 2 cores")
    assert "kernels and dispatch gaps modelled 2.00x" in w
    assert model(2, cal, cores=2, threads_per_rank=2).sources["host"]["warning"] is not None
    from sim.analysis.summary import format_summary, summarize
    from sim.analysis.trace import to_frame

    g = TaskGraph(4)
    for r in range(4):
        g.add(gemm(r, f"g{r}"))
    res = simulate(g, Topology.load("localhost-cpu", nodes=4), c)
    text = format_summary(summarize(res, to_frame(res)))
    assert "shared host" in text and "WARNING: 4 ranks x 1 threads" in text


def test_the_executor_warning_names_the_model(monkeypatch):
    from exec.runtime import launch

    monkeypatch.setattr(launch, "host_cores", lambda: 2)
    msg = launch.oversubscription(4, 1)
    assert msg is not None and "4 threads on 2 cores" in msg and "shared_cpu" in msg
    assert launch.oversubscription(2, 1) is None


@pytest.mark.parametrize("topology", ["dgx-a100", "dgx-h100", "pipemoe-2080ti"])
def test_gpu_topologies_have_no_host_model(topology):
    c = CostModel.build(Topology.load(topology, nodes=2), {})
    assert not isinstance(c.compute.inner, HostCompute)
    assert "host" not in c.sources and "host" not in c.cost_sources()
    assert c.collective.adjust is None


def test_the_model_can_be_turned_off(tmp_path):
    c = model(4, calibration(tmp_path))
    off = CostModel.build(
        Topology.load("localhost-cpu", nodes=4),
        {"calibration": calibration(tmp_path), "shared_cpu": False},
    )
    assert "host" in c.sources and "host" not in off.sources
    assert off.compute.duration(gemm()) == pytest.approx(CALIBRATED_GEMM, rel=1e-12)
    assert off.collective.params("all_to_all", 4) == pytest.approx((A2A["alpha"], A2A["beta"]))


def test_the_preset_and_the_schema(tmp_path):
    spec = Topology.load("localhost-cpu").spec["shared_cpu"]
    assert spec["cores"] >= 1 and spec["all_to_all"] == "gloo"
    bad = {**Topology.load("localhost-cpu").spec, "shared_cpu": {"cores": 0}}
    with pytest.raises(TopologyError, match="shared_cpu.cores"):
        Topology(bad)


def test_validate_simulates_the_host_it_measures_on():
    """`validate` gives the simulator this machine's cores and the executor's threads per
    rank on a CPU topology, and nothing on a GPU topology."""
    from exec.measure.validation import measured_host
    from exec.runtime.launch import host_cores, rank_threads

    got = measured_host(Topology.load("localhost-cpu", nodes=4), 4)
    assert got == {"shared_cpu": {"cores": host_cores(), "threads_per_rank": rank_threads(4)}}
    assert measured_host(Topology.load("dgx-a100", nodes=1), 4) == {}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_the_simulator_counts_cores_and_threads_as_the_executor_sets_them(n):
    """sim.hardware.costs.host keeps its own copy (the executor's ranks must not import the
    cost models at start-up): the two must agree."""
    from exec.runtime.launch import host_cores, rank_threads
    from sim.hardware.costs.host import auto_threads, this_host_cores

    assert this_host_cores() == host_cores()
    assert auto_threads(this_host_cores(), n) == rank_threads(n)
