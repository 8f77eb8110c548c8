"""`exec --moe` runs what users configure: the config's routing drives the real gate (token
counts, capacity drops and all-to-allv splits equal the simulator's) and `auto` parameters
are the simulator's choices on the config's cluster; every strategy still equals sequential."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.moe import MoESpec  # noqa: E402
from exec.layers.run import MoERun, Variant, run_moe  # noqa: E402
from exec.layers.split_check import compare  # noqa: E402
from sim.workload.gate_plan import plan  # noqa: E402
from sim.workload.moe import MoELayer  # noqa: E402
from tests.test_exec_moe import exec_moe_json  # noqa: E402

# Zipf(0.8) over 4 experts, C = 12 of 32 tokens x 2 choices: hot experts drop choices, the
# others keep 7-11, so every exchange has unequal per-peer splits; a top-k gate can make it.
LAYER = MoELayer(
    batch=1,
    seq_len=32,
    model_dim=16,
    hidden_dim=24,
    experts=4,
    world=2,
    top_k=2,
    capacity_factor=0.75,
    dtype="fp32",
    routing={"kind": "zipf", "s": 0.8, "seed": 1},
)
SPEC = MoESpec.from_layer(LAYER, seed=0)
VARIANTS = [
    Variant("sequential"),
    Variant("pipelined", {"degree": 3, "order": "two_streams"}),
    Variant("pipelined", {"degree": 2, "order": "alternating"}),
    Variant("pipemoe", {"degree": 2}),
    Variant("tutel", {"degree": 2}),
    Variant("ted", {"tp": 1}),
    Variant("mpipemoe", {"degree": 3, "reuse": "S4"}),  # re-dispatch of all-to-allv chunks
    Variant("mpipemoe", {"degree": 2, "reuse": "S1"}),
    Variant("fastermoe", {"group_size": 1, "shadow": [1]}),
    Variant("fastermoe", {"group_size": 2, "shadow": "none"}),
    Variant("deepep", {"gpus_per_node": 1}),  # 2 "nodes": the forwarders' two stages
    Variant("lancet", {}),
]


# The default run covers each exchange path once (one all-to-allv, chunks on two streams,
# MPipeMoE's re-dispatch, FasterMoE's steps with a shadowed expert); -m slow runs them all.
FAST = [VARIANTS[i] for i in (0, 1, 6, 8)]


@pytest.fixture(scope="module")
def run() -> MoERun:
    return run_moe(SPEC, FAST, nprocs=2, backend="gloo", timeout_s=30, backward=True)


@pytest.fixture(scope="module")
def run_all() -> MoERun:
    return run_moe(SPEC, VARIANTS, nprocs=2, backend="gloo", timeout_s=30, backward=True)


def test_the_gate_keeps_the_simulators_counts_and_drops(run):
    assert SPEC.demand is not None and plan(LAYER).exact
    for p, r in enumerate(run.ranks):
        seq = r["variants"]["sequential"]
        kept = np.bincount(seq["expert"][seq["slot"] >= 0], minlength=4)
        assert kept.tolist() == LAYER.tokens_matrix[p].tolist()
        assert (seq["slot"] < 0).any()  # capacity dropped some choices for real
        assert all(len(set(row)) == 2 for row in seq["expert"].tolist())


def _check_variant(run: MoERun, v: Variant) -> None:
    if v.name != "sequential":
        for r in run.ranks:
            np.testing.assert_array_equal(
                r["variants"][v.label]["slot"], r["variants"]["sequential"]["slot"]
            )
        rel = run.max_rel_diff(v.label)
        assert rel["y"] <= 1e-5 and max(rel.values()) <= 1e-4, rel
    report = compare(run.ranks, v.label, LAYER, plan(LAYER), v.name, v.params, ("fwd", "bwd"))
    if v.name == "deepep":  # dropless: its graph keeps what this layer's gate drops, and the
        # report says so (its volumes on a dropless layer: tests/test_exec_deepep.py)
        assert report["dropless_graph_vs_drops"] and report["dropped_choices"] > 0, report
        return
    assert report["kept_equal_simulator"] and report["matches"], report
    if v.name == "tutel":  # the padded [E, C, M] buffer, routing or not: equal all-to-alls
        assert report["splits_checked"] == 0 and report["dropped_choices"] > 0
        assert not any(r["variants"][v.label]["splits"] for r in run.ranks)
        return
    assert report["splits_checked"] >= 4 and report["dropped_choices"] > 0
    sent = [
        n
        for r in run.ranks
        for k, s in r["variants"][v.label]["splits"].items()
        for n in s
        if k.startswith("fwd/dispatch")
    ]
    assert len(set(sent)) > 1  # unequal all-to-allv splits


@pytest.mark.parametrize("v", FAST, ids=lambda v: v.label)
def test_strategies_equal_sequential_and_send_the_graphs_splits(run, v):
    _check_variant(run, v)


@pytest.mark.slow
def test_every_strategy_equals_sequential_and_sends_the_graphs_splits(run_all):
    from exec.layers.registry import STRATEGIES

    assert set(STRATEGIES) <= {v.name for v in VARIANTS}
    for v in VARIANTS:
        _check_variant(run_all, v)


@pytest.mark.slow  # a CLI run of real processes; the pieces are tested above and below
def test_cli_resolves_auto_on_the_configs_cluster_and_checks_routing(tmp_path, capsys):
    from sim.config import RunConfig
    from sim.hardware.costs import CostModel
    from sim.strategies import Cluster, build

    cfg = {
        "topology": "pipemoe-2080ti",
        "nodes": 1,
        "model": {
            "batch": 1,
            "seq_len": 32,
            "model_dim": 16,
            "hidden_dim": 24,
            "experts_per_gpu": 2,
            "top_k": 2,
            "capacity_factor": 0.75,
            "dtype": "fp32",
            "routing": {"kind": "zipf", "s": 0.8, "seed": 1},
        },
        "strategy": {"name": "mpipemoe"},  # degree and reuse: auto
        "costs": {"compute": "alpha_beta", "network": "collective"},
        "passes": ["fwd", "bwd"],
    }
    path = tmp_path / "moe.yaml"
    report = exec_moe_json(cfg, path, capsys)
    # the simulator's own choice for this layer on 2 ranks of the config's cluster
    rc_ = RunConfig.load(path)
    topo = rc_.load_topology()
    cluster = Cluster(topo, CostModel.build(topo, rc_.costs))
    g = build("mpipemoe", rc_.layer(2), {}, ("fwd", "bwd"), cluster)
    chunks = {t.tags["chunk"] for t in g if t.tags.get("step") == "dispatch"}
    assert report["resolved"]["auto"] == {
        "degree": len(chunks),
        "reuse": g.meta["selector"]["reuse"],
    }
    assert report["equal"] is True and report["routing"]["matches"] is True
    assert report["routing"]["kept"] == LAYER.tokens_matrix.tolist()


def test_exec_graphs_are_built_with_the_choices_it_prints(tmp_path):
    """`moesim exec CONFIG` (no --moe): the graph is built on the config's cluster, and the
    summary names what each auto parameter became."""
    from exec import api
    from exec.cli import _format

    cfg = {
        "topology": "pipemoe-2080ti",
        "model": {
            "batch": 1,
            "seq_len": 64,
            "model_dim": 16,
            "hidden_dim": 24,
            "experts_per_gpu": 2,
            "top_k": 2,
        },
        "strategy": {"name": "pipemoe"},
        "costs": {"compute": "alpha_beta", "network": "collective"},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    graph, _, res = api.load_graph(path, 2)
    assert res is not None and res.cluster is not None
    assert res.resolved.chosen == {"degree": graph.meta["degree"]}
    assert graph.meta["selector"] == res.resolved.info
    summary = {"tasks": len(graph), "ranks": 2, "backend": "gloo", "device": "cpu"}
    summary |= {"makespan_s": 1e-3, "clock_bound_us": 1.0, "busy_s": {}, "exposed_comm_s": 0.0}
    text = _format(summary, res)
    assert f"degree: auto -> {graph.meta['degree']} (selector: theorem1, case " in text


def test_fastermoe_shadow_auto_is_the_simulators_greedy_choice(tmp_path):
    from exec import api

    cfg = {
        "topology": "dgx-a100",
        "nodes": 1,
        "model": {
            "batch": 4,
            "seq_len": 1024,
            "model_dim": 256,
            "hidden_dim": 256,
            "experts_per_gpu": 1,
            "top_k": 1,
            "capacity_factor": 8.0,
            "routing": {"kind": "zipf", "s": 1.5, "seed": 0},
        },
        "strategy": {"name": "fastermoe", "group_size": 2},
    }
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(cfg))
    graph, _, res = api.load_graph(path, 8)
    assert res.resolved.chosen == {"shadow": graph.meta["shadow"]} and graph.meta["shadow"]
    assert res.resolved.params["shadow"] == graph.meta["shadow"]
    assert res.describe()[0].startswith(f"shadow: auto -> {graph.meta['shadow']}".replace("'", ""))


def test_a_routing_no_gate_can_make_is_reported(capsys):
    """Zipf(1.5) over 4 experts with k = 2: a hot expert drawn more often than there are
    tokens; the report lists the counts the gate could not reproduce."""
    from exec.cli import _print_routing

    layer = MoELayer(
        batch=1,
        seq_len=32,
        model_dim=16,
        hidden_dim=24,
        experts=4,
        world=2,
        top_k=2,
        capacity_factor=0.75,
        routing={"kind": "zipf", "s": 1.5, "seed": 1},
    )
    g = plan(layer)
    assert not g.exact and (layer.routed_matrix > layer.tokens).any()
    assert (g.kept != layer.tokens_matrix).sum() == len(g.differences()) > 0
    _print_routing(
        {
            "kind": "zipf",
            "kept_equal_simulator": False,
            "dropped_choices": 40,
            "realisable": g.exact,
            "not_realised": g.differences(),
            "splits_checked": 8,
            "splits_differ": ["rank 0 fwd/dispatch/1: real {0: 8, 1: 9}, simulator {0: 8, 1: 3}"],
            "splits_missing": [],
        }
    )
    out = capsys.readouterr().out
    assert "DIFFERENT from the simulator's" in out and "no top-k routing" in out
    assert g.differences()[0] in out and "8 checked, 1 DIFFERENT" in out


def test_dropless_log_normal_routing_runs_for_real_and_records_a_replayable_map(tmp_path, capsys):
    """The real gate follows a log-normal dropless routing (nothing dropped, the simulator's
    splits sent), and `--record-routing` writes the choices as a map `replay` reads back."""
    from sim.cli import main
    from sim.config import RunConfig

    cfg = {
        "topology": "dgx-a100",
        "model": {
            "batch": 1,
            "seq_len": 64,
            "model_dim": 16,
            "hidden_dim": 24,
            "experts_per_gpu": 2,
            "top_k": 2,
            "dtype": "fp32",
            "dropless": True,
            "routing": {"kind": "lognormal", "gpu": {"max_mean": 1.5}, "seed": 4},
        },
        "strategy": {"name": "pipelined", "degree": 2, "order": "two_streams"},
        "costs": {"compute": "alpha_beta", "network": "collective"},
        "passes": ["fwd", "bwd"],
    }
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rmap = tmp_path / "routing.npz"
    args = ["exec", str(path), "--nprocs", "2", "--moe", "--json", "--record-routing", str(rmap)]
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert report["dropped_choices"] == 0 and report["equal"]
    assert report["routing"]["kept_equal_simulator"] and report["routing"]["matches"]
    layer = RunConfig.load(path).layer(2)
    cfg["model"]["routing"] = {"kind": "replay", "file": str(rmap)}
    path.write_text(yaml.safe_dump(cfg))
    replayed = RunConfig.load(path).layer(2)
    assert (replayed.routed_matrix == layer.routed_matrix).all()
