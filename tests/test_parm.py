"""Parm in the simulator: its placement in the shared layout, the bytes of every collective
(the paper's volume analysis), closed forms with alpha-beta costs, SAA's overlap, the
selector, and the paper's claims on a few points of its grid (the full grid:
benchmarks/parm.py and the slow test in tests/test_parm_claims.py)."""

from __future__ import annotations

import math

import pytest

from sim import commands
from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.collectives import payload
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.strategies.parm.selector import choose, compute_time, group_fits, predict
from sim.strategies.parm.volumes import check, volumes
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout, from_spec

# -- placement (Parm Sec. II-B, Fig. 2) ---------------------------------------------------------


def test_fig2_layout_mp_group_is_the_esp_group():
    """Fig. 2: two nodes of two GPUs, 2-way EP, 2-way ESP, 2-way MP: the MP group and the ESP
    group are the two GPUs of a node; EP groups pair the nodes' same local GPUs."""
    lay = ParallelLayout(ep=2, esp=2, tp=2, gpus_per_node=2, tp_overlay=True)
    assert lay.mp == lay.world == 4
    assert lay.groups("tp") == lay.groups("esp") == [[0, 1], [2, 3]]
    assert lay.groups("ep") == [[0, 2], [1, 3]]
    assert lay.groups("moe") == [[0, 1, 2, 3]]
    assert lay.coords(3) == {"dp": 0, "ep": 1, "esp": 1, "tp": 1}


@pytest.mark.parametrize("tp,esp", [(2, 4), (4, 2), (4, 4), (1, 2), (8, 1)])
def test_overlaid_mp_groups_are_consecutive_blocks_over_ep_x_esp(tp, esp):
    """Table IV runs N_MP and N_ESP independently (4 and 4 on 8 GPUs): tp is laid over the
    ep x esp ranks, not a factor of them."""
    lay = ParallelLayout(ep=8 // esp, esp=esp, tp=tp, gpus_per_node=8, tp_overlay=True)
    assert lay.world == 8
    assert lay.groups("tp") == [list(range(i, i + tp)) for i in range(0, 8, tp)]
    assert lay.groups("esp") == [list(range(i, i + esp)) for i in range(0, 8, esp)]
    assert lay.groups("ep") == [list(range(s, 8, esp)) for s in range(esp)]
    for r in range(8):  # every rank is in exactly one group of each kind, itself included
        assert r in lay.tp_group(r) and r in lay.esp_group(r) and r in lay.ep_group(r)
        assert lay.rank(**lay.coords(r)) == r


def test_overlaid_layout_from_spec_and_replicas():
    lay = from_spec({"esp": 4, "tp": 4, "dp": 2}, 64, 4, tp_overlay=True)
    assert (lay.ep, lay.dp, lay.esp, lay.tp, lay.mp) == (8, 2, 4, 4, 32)
    assert lay.tp_group(37) == [36, 37, 38, 39] and lay.ep_group(37)[0] == 33
    assert lay.moe_group(37) == list(range(32, 64))
    with pytest.raises(ConfigError, match="parallel.tp"):
        ParallelLayout(ep=3, esp=1, tp=2, tp_overlay=True)  # MP groups of 2 over 3 ranks
    with pytest.raises(ConfigError, match="parallel: ep 3 x dp 1 x esp 2 = 6"):
        from_spec({"ep": 3, "dp": 1, "esp": 2}, 8, 8, tp_overlay=True)
    with pytest.raises(ConfigError, match="inside a node of 4"):
        from_spec({"esp": 8}, 32, 4, tp_overlay=True)


# -- volumes: the paper's analysis ---------------------------------------------------------------


def _layer(**kw) -> MoELayer:
    sizes = dict(batch=2, seq_len=64, model_dim=64, hidden_dim=128, experts=4, world=8, top_k=2)
    return MoELayer(**(sizes | {"capacity_factor": 1.2} | kw))


@pytest.mark.parametrize("tp,esp", [(2, 2), (4, 2), (2, 4), (4, 4)])
def test_every_collective_moves_the_papers_volume(tp, esp):
    l = _layer(experts=8 // esp)
    T, M, E, k, f, e = l.tokens, l.model_dim, l.experts, l.top_k, l.capacity_factor, l.elem
    C = math.ceil(k * f * T / E)
    C1 = math.ceil(k * f * (T // tp) / E)
    C2 = math.ceil(C / tp)
    deg = check(l, tp, esp)
    want = {
        "baseline": {
            "esp_gather": E * C * M * e,
            "dispatch": esp * E * C * M * e,
            "esp_reduce": esp * E * C * M * e,
            "esp_gather_grad": esp * E * C * M * e,
            "esp_split_grad": E * C * M * e,
        },
        "s1": {"dispatch": esp * E * C1 * M * e, "mp_gather": T * M * e / tp},
        "s2": {"dispatch": esp * E * C2 * M * e, "mp_gather": E * C2 * M * e},
    }
    for schedule, sizes in want.items():
        g = build(
            "parm", l, {"schedule": schedule, "tp": tp, "esp": esp, "saa": False}, ("fwd", "bwd")
        )
        comm = {(t.tags["phase"], t.tags["step"]): t for t in g if t.rank == 5 and t.is_comm}
        for step, nbytes in sizes.items():
            assert comm[("fwd" if not step.endswith("grad") else "bwd", step)].bytes == nbytes
        # the graph runs exactly the collectives the volume model lists, in order
        v = volumes(l, deg, schedule)
        for phase, listed in v.collectives().items():
            got = [
                (t.tags["step"], t.kind, t.bytes)
                for t in g
                if t.rank == 5 and t.is_comm and t.tags["phase"] == phase
            ]
            assert got == listed
    # PauseMP divides the expert work by N_MP (S2 exactly when N_MP divides C)
    work = {
        s: sum(
            t.flops
            for t in build("parm", l, {"schedule": s, "tp": tp, "esp": esp}, ("fwd",))
            if t.rank == 0 and t.kind == "gemm"
        )
        for s in ("baseline", "s1", "s2")
    }
    assert work["s1"] == pytest.approx(work["baseline"] * C1 / C)
    assert work["s2"] == pytest.approx(work["baseline"] * C2 / C)


def _ab_cluster(fits: dict) -> Cluster:
    topo = Topology.load("parm-4090")
    ab = {
        "gemm": {"alpha": 1e-5, "beta": 2e-14},
        "elementwise": {"alpha": 3e-6, "beta": 1e-12},
        "gate": {"alpha": 4e-6, "beta": 1e-12},
        "encode": {"alpha": 5e-6, "beta": 2e-12},
        "decode": {"alpha": 6e-6, "beta": 3e-12},
    }
    costs = {
        "compute": "alpha_beta",
        "alpha_beta": ab,
        "network": "collective",
        "collectives": fits,
    }
    return Cluster(topo, CostModel.build(topo, costs))


FITS = {
    "all_to_all": {"alpha": 3e-5, "beta": 2e-10},
    "all_to_allv": {"alpha": 3e-5, "beta": 2e-10},
    "all_gather": {"alpha": 1e-5, "beta": 5e-11},
    "all_reduce": {"alpha": 2e-5, "beta": 9e-11},
    "reduce_scatter": {"alpha": 1.5e-5, "beta": 6e-11},
}


@pytest.mark.parametrize("schedule", ["baseline", "s1", "s2"])
@pytest.mark.parametrize("tp,esp", [(2, 2), (4, 2), (2, 4), (1, 2), (2, 1)])
def test_without_overlap_the_makespan_is_the_sum_of_the_ops_closed_forms(schedule, tp, esp):
    """Closed form: alpha-beta compute and collectives, one chain per rank, every rank alike:
    the makespan is the sum of one rank's ops, each collective alpha + beta * its bytes from
    the paper's volumes (Volumes.collectives)."""
    cl = _ab_cluster(FITS)
    l = _layer(experts=8 // esp)
    g = build(
        "parm", l, {"schedule": schedule, "tp": tp, "esp": esp, "saa": False}, ("fwd", "bwd"), cl
    )
    res = simulate(g, cl.topology, cl.costs)
    v = volumes(l, check(l, tp, esp), schedule)
    comm = sum(
        FITS[kind]["alpha"] + FITS[kind]["beta"] * nbytes
        for ops in v.collectives().values()
        for _, kind, nbytes in ops
    )
    compute = sum(cl.costs.compute.duration(t) for t in g if t.rank == 3 and not t.is_comm)
    assert res.makespan == pytest.approx(comm + compute, rel=1e-12)


def test_saa_overlaps_the_all_gather_with_the_next_round():
    """SAA (S2): round j's all-to-all on `comm`, its local combine on the compute stream, its
    MP-AllGather on `comm.1`; the pipeline of the three follows its recurrence, and replaces
    the sequential all-to-all + combine + all-gather of S2 without SAA."""
    cl = _ab_cluster(FITS)
    l, tp, esp = _layer(experts=4), 2, 2
    p = {"schedule": "s2", "tp": tp, "esp": esp}
    seq = build("parm", l, p | {"saa": False}, ("fwd",), cl)
    saa = build("parm", l, p | {"saa": True}, ("fwd",), cl)
    t_seq = simulate(seq, cl.topology, cl.costs).makespan
    t_saa = simulate(saa, cl.topology, cl.costs).makespan
    mine = [t for t in saa if t.rank == 0]
    rounds = [t for t in mine if t.tags["step"] == "combine"]
    assert len(rounds) == 4 and {t.stream for t in rounds} == {"comm"}  # N_EP = 4 rounds
    assert {t.stream for t in mine if t.tags["step"] == "mp_gather"} == {"comm.1"}
    dur = cl.costs.compute.duration

    def ab(kind: str, t) -> float:
        return FITS[kind]["alpha"] + FITS[kind]["beta"] * payload(t)

    a = c = g = 0.0
    combines = [t for t in mine if t.tags["step"] == "local_combine"]
    gathers = [t for t in mine if t.tags["step"] == "mp_gather"]
    for r, cb, ag in zip(rounds, combines, gathers, strict=True):
        a += ab("all_to_allv", r)
        c = max(a, c) + dur(cb)
        g = max(c, g) + ab("all_gather", ag)
    one = [t for t in seq if t.rank == 0]
    sequential = sum(
        ab(t.kind, t) if t.is_comm else dur(t)
        for t in one
        if t.tags["step"] in ("combine", "local_combine", "mp_gather")
    )
    assert t_saa == pytest.approx(t_seq - sequential + g, rel=1e-12)


# -- the selector (Sec. V) -----------------------------------------------------------------------


def test_selector_fits_reproduce_collective_alpha_beta_and_pick_the_smaller_prediction():
    """With collective-level costs the fitted alpha-beta are the configured ones (the model
    is linear), and the choice is the smaller of Eq. 13 / 14 plus each schedule's compute."""
    cl = _ab_cluster(FITS)
    l = _layer(experts=4)
    deg = check(l, 2, 2)
    fits = group_fits(l, deg, cl, saa=False, algo=None)
    assert fits["a2a"].alpha == pytest.approx(3e-5) and fits["a2a"].beta == pytest.approx(2e-10)
    assert fits["ag"].alpha == pytest.approx(1e-5) and fits["ag"].beta == pytest.approx(5e-11)
    c = choose(l, deg, cl, saa=False, algo=None)
    v1, v2 = volumes(l, deg, "s1"), volumes(l, deg, "s2")
    t1, t2 = predict(v1, v2, fits, saa=False)
    # plus each schedule's computation on one rank (what the graph's compute tasks cost)
    g1 = build("parm", l, {"schedule": "s1", "tp": 2, "esp": 2}, ("fwd", "bwd"))
    g2 = build("parm", l, {"schedule": "s2", "tp": 2, "esp": 2, "saa": False}, ("fwd", "bwd"))
    for g, v in ((g1, v1), (g2, v2)):
        assert compute_time(l, v, cl, False, None) == pytest.approx(
            sum(cl.costs.compute.duration(t) for t in g if t.rank == 0 and not t.is_comm)
        )
    t1 += compute_time(l, v1, cl, False, None)
    t2 += compute_time(l, v2, cl, False, None)
    assert (c.t_s1, c.t_s2) == (t1, t2) and c.schedule == ("s1" if t1 <= t2 else "s2")
    g = build("parm", l, {"tp": 2, "esp": 2, "saa": False}, ("fwd",), cl)
    assert g.meta["selector"]["chosen"] == c.schedule == g.meta["schedule"]


def test_selector_follows_the_volumes_k_f_against_n_mp():
    """Eq. 11: S1's MP-AllGather moves T M / N_MP, S2's k f T M / N_MP, so a large k f favours
    S1; with SAA hiding S2's gather behind its all-to-all, S2 can win where k f is small."""
    cl = _ab_cluster(FITS | {"all_gather": {"alpha": 1e-5, "beta": 1e-9}})
    deg_l = _layer(experts=4, top_k=2, capacity_factor=2.4)
    assert choose(deg_l, check(deg_l, 2, 2), cl, saa=False, algo=None).schedule == "s1"
    small = _layer(experts=4, top_k=1, capacity_factor=0.25)
    assert choose(small, check(small, 2, 2), cl, saa=False, algo=None).schedule == "s2"


# -- the claims on a few points of the paper's grid ----------------------------------------------


POINTS = [  # (preset, nodes, B, L, M, H, f, tp, esp)
    ("parm-4090", 1, 4, 512, 1024, 2048, 1.2, 2, 2),
    ("parm-4090", 1, 2, 1024, 2048, 1024, 2.4, 4, 4),
    ("pipemoe-2080ti", 8, 2, 512, 1024, 1024, 1.2, 4, 2),
    ("parm-4090", 1, 2, 512, 1024, 1024, 1.2, 1, 2),  # Table III's N_MP = 1 (issue 26)
    ("parm-4090", 1, 2, 512, 1024, 1024, 2.4, 2, 1),  # and N_ESP = 1
]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: "-".join(map(str, p)))
def test_pausemp_schedules_never_lose_to_the_baseline(point):
    preset, nodes, B, L, M, H, f, tp, esp = point
    topo = Topology.load(preset, nodes=nodes)
    cl = Cluster(topo, CostModel.build(topo, {}))
    P = topo.world_size
    l = MoELayer(
        batch=B,
        seq_len=L,
        model_dim=M,
        hidden_dim=H,
        experts=P // esp,
        world=P,
        top_k=2,
        capacity_factor=f,
        dtype="fp16",
    )
    t = {}
    for s in ("baseline", "s1", "s2"):
        g = build("parm", l, {"schedule": s, "tp": tp, "esp": esp}, ("fwd", "bwd"), cl)
        t[s] = simulate(g, topo, cl.costs).makespan
    assert t["s1"] < t["baseline"] and t["s2"] < t["baseline"]


# -- the run config and bad input ----------------------------------------------------------------


def test_a_config_takes_parms_layout_from_parallel():
    raw = {
        "topology": "parm-4090",
        "parallel": {"esp": 4, "tp": 4},
        "model": {
            "batch": 1,
            "seq_len": 128,
            "model_dim": 64,
            "hidden_dim": 128,
            "experts": 2,
            "top_k": 2,
        },
        "strategy": {"name": "parm", "schedule": "s2"},
        "passes": ["fwd", "bwd"],
    }
    r = commands.simulate_config(RunConfig.from_dict(raw))
    assert r.graph.meta["parallel"] == {"ep": 2, "esp": 4, "tp": 4, "tp_overlay": True}
    assert r.summary["makespan_s"] > 0
    steps = {t.tags["step"] for t in r.graph}
    assert {"mp_split", "dump", "local_combine", "mp_gather"} <= steps
    bad = raw | {"strategy": {"name": "parm", "esp": 2}}
    with pytest.raises(ConfigError, match="parallel.esp: 4 disagrees with strategy.esp 2"):
        commands.simulate_config(RunConfig.from_dict(bad))


@pytest.mark.parametrize(
    "params,kw,needle",
    [
        ({"schedule": "s3"}, {}, "strategy.schedule"),
        ({"saa": "yes"}, {}, "strategy.saa"),
        ({"esp": 3}, {}, "strategy.esp"),
        ({"tp": 3}, {}, "strategy.tp"),
        ({"esp": 2}, {"experts": 2}, "model.experts"),  # EP groups of 4 hold 2 experts
        ({"esp": 2}, {"hidden_dim": 127, "experts": 4}, "model.hidden_dim"),
        ({"schedule": "auto"}, {}, "needs the cluster"),
    ],
)
def test_bad_parameters_name_the_field(params, kw, needle):
    with pytest.raises(ConfigError, match=needle):
        build("parm", _layer(**({"experts": 8} | kw)), params, ("fwd",))
