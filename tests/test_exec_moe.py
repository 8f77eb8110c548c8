"""The real MoE layer: every strategy gives the sequential layer's numbers, and capacity
dropping matches a plain single-process reference of the same gating."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.errors import ExecError  # noqa: E402
from exec.layers.moe import MoESpec, make_expert, make_gate, route  # noqa: E402
from exec.layers.run import MoERun, Variant, run_moe  # noqa: E402
from sim.core.errors import ConfigError  # noqa: E402

# C = ceil(k f T / E) = ceil(2 * 0.75 * 32 / 4) = 12: 64 choices per rank compete for 48
# slots, so tokens are dropped; C = 12 splits into 1, 2 and 4 chunks.
SPEC = MoESpec(
    tokens=32, model_dim=16, hidden_dim=24, experts=4, world=2, top_k=2, capacity_factor=0.75
)
ORDERS = ("tutel", "alternating", "two_streams")
DEGREES = (1, 2, 4)
VARIANTS = (
    [Variant("sequential")]
    + [Variant("pipelined", {"degree": r, "order": o}) for r in DEGREES for o in ORDERS]
    + [Variant("pipemoe", {"degree": 3})]  # PipeMoE at a degree its selector could pick
    + [Variant("tutel", {"degree": 4, "algo": "2dh"})]
    + [Variant("tutel", {"degree": 2, "parallel": "p2"})]  # E >= W: P2 is plain EP here
    + [Variant("ted", {"tp": 1})]  # no TP group here; tp > 1: tests/test_exec_layouts.py
    + [Variant("mpipemoe", {"degree": 3, "reuse": "S4"})]  # re-dispatch + recompute in backward
    + [Variant("fastermoe", {"group_size": 1, "shadow": [1]})]  # 2 steps, expert 1 shadowed
    + [Variant("lancet", {"degree": 2})]  # alone: Tutel chunks (block: test_exec_lancet)
    + [Variant("deepep", {"gpus_per_node": 1})]  # 2 nodes of 1: dedup across them; 2x2 in
)  # tests/test_exec_deepep.py


@pytest.fixture(scope="module")
def run() -> MoERun:
    return run_moe(SPEC, VARIANTS, nprocs=2, backend="gloo", timeout_s=30, backward=True)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("degree", DEGREES)
def test_pipelined_equals_sequential(run, degree, order):
    label = Variant("pipelined", {"degree": degree, "order": order}).label
    for r in run.ranks:
        seq, pip = r["variants"]["sequential"], r["variants"][label]
        np.testing.assert_array_equal(pip["slot"], seq["slot"])
        np.testing.assert_allclose(pip["y"], seq["y"], rtol=1e-5, atol=1e-6)
        assert set(pip["grads"]) == {"x", "gate", "w1", "b1", "w2", "b2"}
        for name, g in seq["grads"].items():
            assert np.abs(g).max() > 0, name  # the gradient reaches every parameter
            np.testing.assert_allclose(pip["grads"][name], g, rtol=1e-4, atol=1e-5)
    assert max(run.max_abs_diff(label).values()) < 1e-4
    assert max(run.max_rel_diff(label).values()) < 1e-5


def test_every_strategy_equals_sequential(run):
    """Every strategy with a real-layer implementation is in VARIANTS and matches."""
    from exec.layers.registry import STRATEGIES

    tested = {v.name for v in VARIANTS}
    assert set(STRATEGIES) <= tested, f"add a variant for {set(STRATEGIES) - tested}"
    for v in VARIANTS[1:]:
        assert max(run.max_rel_diff(v.label).values()) < 1e-5, v.label


def _reference(spec: MoESpec, xs: list[np.ndarray]) -> tuple[np.ndarray, list[list[list]]]:
    """The layer without buffers or communication: per rank, hand out capacity slots in
    GShard priority (all first choices in token order, then second choices), and add each
    kept choice's expert output, weighted by its gate probability, to its token."""
    gate = make_gate(spec)
    experts = [
        {k: v.double() for k, v in make_expert(spec, e).items()} for e in range(spec.experts)
    ]
    ys, kept_all = [], []
    for x in xs:
        xt = torch.from_numpy(x)
        probs = torch.softmax(xt @ gate, dim=-1)  # the gate itself, as the layer computes it
        top = [sorted(range(spec.experts), key=lambda e: -float(p[e]))[: spec.top_k] for p in probs]
        used = [0] * spec.experts
        kept = [[False] * spec.top_k for _ in range(spec.tokens)]
        y = np.zeros((spec.tokens, spec.model_dim))
        for choice in range(spec.top_k):
            for t in range(spec.tokens):
                e = top[t][choice]
                if used[e] < spec.capacity:
                    used[e] += 1
                    kept[t][choice] = True
                    w = experts[e]
                    h = torch.nn.functional.gelu(xt[t].double() @ w["w1"] + w["b1"])
                    out = h @ w["w2"] + w["b2"]
                    y[t] += float(probs[t, e]) * out.numpy()
        ys.append(y)
        kept_all.append(kept)
    return np.stack(ys), kept_all


def test_capacity_dropping_matches_single_process_reference(run):
    xs = [r["x"] for r in run.ranks]
    y_ref, kept_ref = _reference(SPEC, xs)
    for p, r in enumerate(run.ranks):
        seq = r["variants"]["sequential"]
        assert (seq["slot"] >= 0).tolist() == kept_ref[p]
    dropped = sum(int((r["variants"]["sequential"]["slot"] < 0).sum()) for r in run.ranks)
    total = 2 * SPEC.tokens * SPEC.top_k
    assert 0 < dropped < total  # the check covers both kept and dropped choices
    assert total - dropped <= 2 * SPEC.experts * SPEC.capacity
    np.testing.assert_allclose(run.output("sequential"), y_ref, rtol=1e-4, atol=1e-5)


def test_route_gives_slots_in_gshard_priority():
    # token 0 prefers experts (0, 1), token 1 (1, 0), token 2 (0, 1); one slot per expert.
    # First choices are served first, in token order: token 0 takes expert 0's slot, token 1
    # expert 1's; token 2's first choice and every second choice find their expert full
    # (token order alone would have given token 0 both slots and dropped token 1 entirely).
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    gate = torch.tensor([[3.0, 2.0, 0.0], [2.0, 3.0, 0.0]])
    r = route(x, gate, top_k=2, capacity=1)
    assert r.expert.tolist() == [[0, 1], [1, 0], [0, 1]]
    assert r.slot.tolist() == [[0, -1], [0, -1], [-1, -1]]
    probs = torch.softmax(torch.tensor([3.0, 2.0, 0.0]), 0)
    assert torch.allclose(r.weight[0], probs[:2]) and torch.allclose(r.weight[1], probs[:2])
    # with room for everyone, slots count up per expert in choice-major order
    r = route(x, gate, top_k=2, capacity=3)
    assert r.slot.tolist() == [[0, 1], [0, 2], [1, 2]]


def test_layer_size_and_strategy_errors():
    with pytest.raises(ConfigError, match="experts"):
        MoESpec(tokens=4, model_dim=2, hidden_dim=2, experts=3, world=2)
    with pytest.raises(ExecError, match="for 2 ranks but 3"):
        run_moe(SPEC, VARIANTS[:1], nprocs=3)
    with pytest.raises(ConfigError, match="unknown parameter"):
        from exec.layers.registry import resolve_strategy

        resolve_strategy("pipelined", {"chunks": 2})


def exec_moe_json(cfg: dict, path, capsys) -> dict:
    """`moesim exec PATH --nprocs 2 --moe --json` on the config written to `path`: its report."""
    from sim.cli import main

    path.write_text(yaml.safe_dump(cfg))
    rc = main(["exec", str(path), "--nprocs", "2", "--moe", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_cli_moe_reports_equal_outputs(tmp_path, capsys):
    cfg = {
        "topology": "dgx-a100",
        "model": {
            "batch": 1,
            "seq_len": 32,
            "model_dim": 16,
            "hidden_dim": 32,
            "experts_per_gpu": 2,
            "top_k": 2,
            "capacity_factor": 1.0,
        },
        "strategy": {"name": "pipelined", "degree": 4, "order": "alternating"},
        "passes": ["fwd", "bwd"],
    }
    report = exec_moe_json(cfg, tmp_path / "moe.yaml", capsys)
    assert report["equal"] is True and report["capacity"] == 16
    assert report["strategy"] == "pipelined(degree=4,order=alternating)"
    assert set(report["max_abs_diff"]) >= {"y", "grad_w1", "grad_x"}
    assert report["max_rel_diff"]["y"] <= 1e-5


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 CUDA GPUs for NCCL",
)
def test_nccl_pipelined_equals_sequential():  # pragma: no cover - GPU machines only
    variants = [Variant("sequential"), Variant("pipelined", {"degree": 4, "order": "two_streams"})]
    res = run_moe(SPEC, variants, nprocs=2, backend="nccl", timeout_s=60, backward=True)
    diff = res.max_abs_diff(variants[1].label)
    assert diff["y"] < 1e-5 and max(diff.values()) < 1e-4
