"""DualPipe / DualPipeV (sim.strategies.dualpipe): the closed form of the published bubble
under alpha-beta costs, the memory table, the schedule's structure and bad parameters."""

from __future__ import annotations

import math

import pytest

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import build
from sim.strategies.dualpipe.schedule import Pipeline, activation_peak, table
from sim.workload.moe import MoELayer

ZERO = {"alpha": 0.0, "beta": 0.0}
KINDS = ("layernorm", "softmax", "elementwise", "attention", "gate", "encode", "decode")


def free_comm_costs(topo: Topology, alpha_g: float, beta_g: float) -> CostModel:
    """GEMMs alpha + beta * m*n*k; every other kernel and all communication free (the
    formula's assumption: comm fully hidden)."""
    return CostModel.build(
        topo,
        {
            "compute": "alpha_beta",
            "network": "collective",
            "alpha_beta": {"gemm": {"alpha": alpha_g, "beta": beta_g}} | {k: ZERO for k in KINDS},
            "collectives": {"all_to_all": ZERO, "all_gather": ZERO, "send": ZERO},
        },
    )


LAYER = MoELayer(batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=2, world=1, top_k=2)


@pytest.mark.parametrize("variant", ["dualpipe", "dualpipev"])
@pytest.mark.parametrize("pp,extra", [(2, 0), (4, 2), (6, 0), (8, 4)])
def test_bubble_equals_the_published_formula(variant, pp, extra):
    """With free comm and only GEMMs costing, a forward chunk, its input-gradient part and
    its weight part take the same time (each a GEMM per weight: qkv, proj, fc1, fc2), which
    is the zero-bubble analysis' assumption; then every device idles exactly
    (PP/2-1)(F&B + B - 3W), F&B = F + B."""
    micro = (2 * pp if variant == "dualpipe" else pp) + extra
    params = {"variant": variant, "pp": pp, "micro": micro, "layers": 2, "shared": 0}
    g = build("dualpipe", LAYER, params, ("fwd", "bwd"))
    topo = Topology.load("flat-switch", nodes=g.world_size)
    ab = (3e-6, 2e-12)
    res = simulate(g, topo, free_comm_costs(topo, *ab))
    dur = res.end - res.start
    tasks = list(g)
    per_chunk = {"fwd": 0.0, "dX": 0.0, "dW": 0.0}
    for i, t in enumerate(tasks):
        if t.rank == 0 and t.stream.startswith("compute"):
            key = t.tags.get("role", "fwd")
            per_chunk[key] += dur[i]
    n = 2 * Pipeline(variant, pp, micro).per_phase  # chunks of each kind per device
    F, Bi, W = (per_chunk[k] / n for k in ("fwd", "dX", "dW"))
    assert math.isclose(F, Bi, rel_tol=1e-12) and W > 0
    B = Bi + W
    expect = table(pp, F, B, W, F + B)[variant]["bubble"]
    for rank in range(g.world_size):
        busy = sum(
            dur[i] for i, t in enumerate(tasks) if t.rank == rank and t.stream.startswith("compute")
        )
        assert math.isclose(res.makespan - busy, expect, rel_tol=1e-9, abs_tol=1e-12), (
            rank,
            res.makespan - busy,
            expect,
        )


@pytest.mark.parametrize("variant", ["dualpipe", "dualpipev"])
@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_memory_matches_the_table(variant, pp):
    """2x parameters (two chunks per device) and PP+1 micro-batches' activations."""
    pipe = Pipeline(variant, pp, 2 * pp + 2)
    peaks = {activation_peak(pipe.ops(d)) for d in range(pipe.devices)}
    row = table(pp, 1, 2, 1, 3)[variant]
    assert peaks == {row["activations"]} == {pp + 1}
    assert pipe.devices == row["devices"]
    g = build(
        "dualpipe", LAYER, {"variant": variant, "pp": min(pp, 4), "layers": 1}, ("fwd", "bwd")
    )
    assert g.meta["memory"]["param_chunks"] == row["params"] == 2


@pytest.mark.parametrize("variant", ["dualpipe", "dualpipev"])
def test_simulated_activation_peak_is_within_the_tables_chunks(variant):
    """The engine's buffers (what each chunk's operators keep for their backward, freed by
    its weight gradients) peak on every device at no more than the table's PP+1 micro-batch
    chunks and above PP-1 of them (a chunk's buffers come and go layer by layer)."""
    pp = 4
    layer = MoELayer(
        batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=2, top_k=2
    )
    g = build(
        "dualpipe", layer, {"variant": variant, "pp": pp, "layers": 1, "shared": 0}, ("fwd", "bwd")
    )
    topo = Topology.load("dgx-h100", nodes=1)
    res = simulate(g, topo, CostModel.build(topo, {}))
    chunk: dict[str, float] = {}  # one (micro-batch, chunk)'s buffers on rank 0
    for t in g:
        if t.rank == 0:
            for name, nbytes in t.allocs.items():
                key = name.rsplit("/L", 1)[0]
                chunk[key] = chunk.get(key, 0.0) + nbytes
    one = max(chunk.values())
    for dev in range(g.meta["devices"]):
        assert pp - 1 < res.mem_peak[dev * 2] / one <= pp + 1


@pytest.mark.parametrize("variant", ["dualpipe", "dualpipev"])
def test_every_chunk_runs_once_and_stages_talk_by_p2p(variant):
    pp, micro = 4, 8
    layer = MoELayer(batch=1, seq_len=32, model_dim=64, hidden_dim=128, experts=4, world=2, top_k=2)
    g = build(
        "dualpipe",
        layer,
        {"variant": variant, "pp": pp, "micro": micro, "layers": 1},
        ("fwd", "bwd"),
    )
    pipe = Pipeline(variant, pp, micro)
    assert g.world_size == pipe.devices * 2
    attn = [t for t in g if t.tags.get("node") == "attn" and t.tags.get("step") == "qkv"]
    # each (micro-batch, stage) forward once on each EP rank of the stage's device
    assert len(attn) == micro * pp * 2
    sends = [t for t in g if t.kind == "send"]
    recvs = [t for t in g if t.kind == "recv"]
    assert sends and len(sends) == len(recvs)
    assert all(t.peer // 2 != t.rank // 2 and t.peer % 2 == t.rank % 2 for t in sends)
    a2a = [t for t in g if t.kind == "all_to_allv"]
    assert all(set(t.group) == {t.rank - t.rank % 2, t.rank - t.rank % 2 + 1} for t in a2a)


@pytest.mark.parametrize(
    "params,field",
    [
        ({"variant": "zb"}, "strategy.variant"),
        ({"pp": 3}, "strategy.pp"),
        ({"pp": 4, "micro": 6}, "strategy.micro"),
        ({"pp": 4, "micro": 9}, "strategy.micro"),
    ],
)
def test_bad_parameters_are_one_line_errors(params, field):
    with pytest.raises(ConfigError, match=field):
        build("dualpipe", LAYER, params, ("fwd", "bwd"))
