"""Routing as it is in practice (sim.workload.routing): dropless layers, log-normal loads with
a target imbalance, NVIDIA's W0-W7 workloads and recorded router maps.

Dropless: the all-to-allv bytes and expert GEMM rows equal the loads; a skewed layer is never
faster than a balanced one of the same tokens (the hot GPU sets the pace), for every strategy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies import Cluster, build
from sim.workload.moe import MoELayer
from sim.workload.routing import imbalance, lognormal, replay
from sim.workload.routing.loads import gini, max_mean, profile, solve_sigma, split
from tests.test_launch_order import CASES

# -- loads ---------------------------------------------------------------------------------


def test_imbalance_measures_closed_forms():
    assert max_mean(np.array([1, 1, 1, 1])) == 1 and gini(np.array([2, 2, 2])) == 0
    assert max_mean(np.array([0, 0, 0, 4])) == 4
    assert gini(np.array([0, 0, 0, 4])) == pytest.approx(3 / 4)  # (n-1)/n: all on one
    assert gini(np.array([1, 3])) == pytest.approx(0.25)  # |1-3| * 2 / (2 * 2^2 * 2)


@pytest.mark.parametrize("n", [5, 8, 256])
@pytest.mark.parametrize("measure,target", [("max_mean", 1.3), ("max_mean", 4.01), ("gini", 0.2)])
def test_a_log_normal_profile_hits_its_target(n, measure, target):
    p = profile(n, solve_sigma(n, measure, target, "x"))
    got = max_mean(p) if measure == "max_mean" else gini(p)
    assert got == pytest.approx(target, rel=1e-9) and p.mean() == pytest.approx(1.0)


def test_an_unreachable_target_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"model.routing.gpu.max_mean: 9.0 is not reachable"):
        solve_sigma(8, "max_mean", 9.0, "model.routing.gpu.max_mean")


def test_split_adds_up_caps_and_follows_the_weights():
    c = split(100, np.array([0.7, 0.1, 0.1, 0.1]), cap=40)
    assert c.sum() == 100 and c.max() == 40 and sorted(c[1:].tolist()) == [20, 20, 20]
    assert split(7, np.ones(3), cap=7).tolist() == [3, 2, 2]


# -- log-normal routing --------------------------------------------------------------------


def _routed(routing, world=32, experts=256, tokens=4096, top_k=8):
    return lognormal.routed({"kind": "lognormal", **routing}, world, experts, tokens, top_k)


@pytest.mark.parametrize("target", [1.3, 2.0, 4.0])
def test_per_gpu_max_mean_within_2_percent(target):
    m = _routed({"gpu": {"max_mean": target}, "seed": 3})
    per_gpu = m.sum(axis=0).reshape(32, 8).sum(axis=1)
    assert max_mean(per_gpu) == pytest.approx(target, rel=0.02)
    assert (m.sum(axis=1) == 8 * 4096).all() and m.max() <= 4096


def test_per_expert_gini_within_2_percent():
    for target in (0.105, 0.38):
        m = _routed({"expert": {"gini": target}})
        assert gini(m.sum(axis=0)) == pytest.approx(target, rel=0.02)


def test_balanced_nodes_with_imbalanced_gpus_inside_them():
    """deepseek-ai/DeepEP issue #343's case: nodes equal, GPUs of a node not."""
    m = _routed({"node": {"max_mean": 1.0}, "gpu": {"max_mean": 2.5}, "gpus_per_node": 8})
    per_gpu = m.sum(axis=0).reshape(32, 8).sum(axis=1)
    per_node = per_gpu.reshape(4, 8).sum(axis=1)
    assert max_mean(per_node) == pytest.approx(1.0, abs=1e-3)
    for node in per_gpu.reshape(4, 8):
        assert max_mean(node) == pytest.approx(2.5, rel=0.02)


def test_steps_and_drift():
    hot = lambda m: int(np.argmax(m[0]))  # noqa: E731
    base = {"expert": {"max_mean": 3.0}, "seed": 1}
    fixed = [_routed(base | {"step": s, "drift": 0.0}) for s in range(3)]
    assert all((f == fixed[0]).all() for f in fixed)
    fresh = [hot(_routed(base | {"step": s})) for s in range(6)]
    assert len(set(fresh)) > 1  # a seed per step moves the hot expert
    # a slow drift keeps the order closer to step 0's than fresh draws do
    rank = lambda m: np.argsort(np.argsort(m[0]))  # noqa: E731
    r0 = rank(_routed(base | {"step": 0, "drift": 0.1}))
    near = np.corrcoef(r0, rank(_routed(base | {"step": 2, "drift": 0.1})))[0, 1]
    far = np.corrcoef(r0, rank(_routed(base | {"step": 2, "drift": 1.0})))[0, 1]
    assert near > 0.7 > far


def test_too_few_tokens_for_the_target_is_an_error():
    with pytest.raises(ConfigError, match="model.routing.expert.gini: 0.3 cannot be realised"):
        _routed({"expert": {"gini": 0.3}}, world=2, experts=256, tokens=2, top_k=1)


# -- W0-W7 ---------------------------------------------------------------------------------


def test_imbalance_workloads_follow_their_rules():
    E, k, T = 8, 2, 128
    ch = {w: imbalance.choices(w, E, k, T, seed=1234, step=0) for w in imbalance.WORKLOADS}
    for w, c in ch.items():
        assert c.shape == (T, k) and all(len(set(r)) == k for r in c.tolist()), w
    assert np.bincount(ch["W0"].ravel(), minlength=E).tolist() == [32] * 8
    assert set(ch["W5"].ravel().tolist()) <= {4, 5, 6, 7}
    hot = ch["W1"][np.arange(T) % 4 != 0]
    assert set(hot.ravel().tolist()) == {0, 1}  # hw = max(k, E // 4) = 2
    assert set(ch["W3"][np.arange(T) % 4 != 0].ravel().tolist()) <= {0, 2, 4, 6}
    w6 = imbalance.choices("W6", E, k, T, seed=1234, step=3)  # moved by hw after 3 steps
    assert set(w6[np.arange(T) % 4 != 0].ravel().tolist()) == {2, 3}
    steady = imbalance.choices("W7", E, k, T, seed=1234, step=2)
    burst = imbalance.choices("W7", E, k, T, seed=1234, step=3)
    assert max_mean(np.bincount(burst.ravel())) > 2 > max_mean(np.bincount(steady.ravel()))
    again = imbalance.choices("W1", E, k, T, seed=1234, step=0)
    assert (again == ch["W1"]).all()  # deterministic in (workload, seed, step)


# -- router maps ---------------------------------------------------------------------------


def test_a_router_map_round_trips_and_replays(tmp_path):
    counts = np.stack([_routed({"gpu": {"max_mean": 1.5}, "step": s}) for s in range(2)])
    path = tmp_path / "map.npz"
    replay.write(path, counts[:, None], top_k=8, tokens=4096)
    spec = {"kind": "replay", "file": str(path), "step": 1}
    layer = MoELayer(1, 4096, 64, 64, 256, 32, top_k=8, routing=spec, dropless=True)
    assert (layer.routed_matrix == counts[1]).all()
    choices = np.stack([imbalance.choices("W2", 8, 2, 16, 0, 0)] * 4)[None, None]
    np.savez(tmp_path / "ch.npz", choices=choices)
    m = replay.load(tmp_path / "ch.npz")
    assert m["top_k"] == 2 and m["tokens"] == 16 and m["counts"].shape == (1, 1, 4, 8)


@pytest.mark.parametrize(
    "arrays,match",
    [
        ({"counts": np.ones((1, 1, 2, 4), dtype=np.int64)}, "rank 0 made 4 choices"),
        ({"counts": np.ones((2, 4), dtype=np.int64)}, "must be an integer array"),
        ({"counts": np.ones((1, 1, 2, 4)), "choices": np.ones((1, 1, 2, 2, 2))}, "exactly one"),
        ({"choices": np.zeros((1, 1, 2, 4, 2), dtype=np.int64)}, "picks one expert twice"),
        ({"counts": np.full((1, 1, 2, 4), -1)}, "negative entries"),
        ({"counts": np.ones((1, 1, 3, 4), dtype=np.int64) * 4}, "the map is 3 ranks x 4"),
    ],
)
def test_bad_router_maps_get_one_line_errors(tmp_path, arrays, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=match) as e:
        MoELayer(1, 8, 16, 16, 4, 2, top_k=2, routing={"kind": "replay", "file": str(path)})
    assert "\n" not in str(e.value)


def test_a_step_beyond_the_map_is_named(tmp_path):
    path = tmp_path / "m.npz"
    replay.write(path, np.full((1, 1, 2, 4), 4))
    with pytest.raises(ConfigError, match=r"model.routing.step: expected 0..0"):
        MoELayer(
            1, 8, 16, 16, 4, 2, top_k=2, routing={"kind": "replay", "file": str(path), "step": 1}
        )


# -- dropless ------------------------------------------------------------------------------

TOPO = Topology.load("dgx-h100", nodes=2)
SKEW = {"kind": "lognormal", "gpu": {"max_mean": 2.5}, "seed": 2}
EVEN = {"kind": "lognormal", "gpu": {"max_mean": 1.0}}


def _layer(base: MoELayer, routing: dict) -> MoELayer:
    f = {n: getattr(base, n) for n in ("batch", "seq_len", "model_dim", "hidden_dim")}
    return MoELayer(
        **f,
        experts=base.experts,
        world=base.world,
        top_k=base.top_k,
        routing=routing,
        dropless=True,
    )


def test_dropless_keeps_every_choice_and_exchanges_exactly_the_loads():
    layer = _layer(CASES[0][2], SKEW)
    assert (layer.tokens_matrix == layer.routed_matrix).all()
    assert layer.capacity == int(layer.routed_matrix.max())
    g = build("sequential", layer, {}, ("fwd",), Cluster(TOPO, CostModel.build(TOPO, {})))
    P, El, M = layer.world, layer.local_experts, layer.model_dim
    per_owner = layer.routed_matrix.reshape(P, P, El).sum(axis=2)  # [src, dst] rows
    for rank in range(P):
        tasks = [t for t in g if t.rank == rank]
        (disp,) = [t for t in tasks if t.kind == "all_to_allv" and t.tags["step"] == "dispatch"]
        assert disp.split == (per_owner[rank] * M * layer.elem).tolist()
        fc1 = [t for t in tasks if t.tags.get("step") == "fc1"]
        rows = sum(t.shape["m"] * t.shape["batch"] for t in fc1 if t.shape)
        assert rows == per_owner[:, rank].sum()
    assert g.meta["tokens_per_layer"]["dropped"] == 0


ONE_EACH = list({c[0]: c for c in reversed(CASES)}.values())  # each strategy's first case


@pytest.mark.parametrize(
    "case", ONE_EACH, ids=lambda c: c[0] + "-" + "-".join(map(str, c[1].values()))
)
def test_a_skewed_dropless_layer_is_never_faster_than_a_balanced_one(case):
    name, params, base, blocks = case
    costs = CostModel.build(TOPO, {})
    span = {}
    for label, routing in (("even", EVEN), ("skew", SKEW)):
        layer = _layer(base, routing)
        g = build(name, layer, params, ("fwd", "bwd"), Cluster(TOPO, costs), blocks=blocks)
        span[label] = simulate(g, TOPO, costs).makespan
        assert g.meta["tokens_per_layer"]["kept"] == g.meta["tokens_per_layer"]["routed"]
    assert span["skew"] >= span["even"] * (1 - 1e-9), span


def test_each_moe_block_of_a_model_routes_its_own_way():
    """A log-normal routing without `layer` gives every MoE block its own hot GPU; naming a
    layer routes every block alike."""
    from sim.workload.blocks import BlockModel

    base = CASES[0][2]
    blocks = BlockModel(n=4, heads=4, moe_every=1)
    costs = CostModel.build(TOPO, {})

    def hot_ranks(routing: dict) -> set[int]:
        g = build(
            "sequential", _layer(base, routing), {}, ("fwd",), Cluster(TOPO, costs), blocks=blocks
        )
        rows: dict[int, dict[int, int]] = {}
        for t in g:
            if t.tags.get("step") == "fc1" and t.shape:
                rows.setdefault(t.tags["layer"], {})[t.rank] = t.shape["m"] * t.shape["batch"]
        return {max(r, key=r.get) for r in rows.values()}

    assert len(hot_ranks(SKEW)) > 1
    assert len(hot_ranks(SKEW | {"layer": 2})) == 1


def test_the_imbalance_sweep_runs_w0_to_w7(tmp_path):
    """sim/configs/imbalance_sweep.yaml: the PR's workloads as `moesim sweep` inputs; the
    hot-set workloads are slower than the balanced one at EP 4, W0 balanced exactly."""
    import pandas as pd

    from sim.cli import main

    spec = Path(__file__).resolve().parents[1] / "sim" / "configs" / "imbalance_sweep.yaml"
    assert main(["sweep", str(spec), "--out", str(tmp_path / "w")]) == 0
    df = pd.read_csv(tmp_path / "w" / "results.csv")
    ep4 = df[df["param.parallel.ep"] == 4].set_index("param.model.routing.workload")
    span, load = ep4["makespan_s"], ep4["gpu_load_max_mean"]
    assert len(ep4) == 8 and span["W1"] > span["W0"] and span["W5"] > span["W0"]
    assert load["W0"] == 1.0 and load["W1"] > 3 and load["W5"] >= 2.0
