"""TED and Tutel P1 / P2 in the real layer: outputs and every gradient equal the unsliced
layer's (a single-process reference, and for TED also `sequential` on the same EP groups).

Four gloo processes: TED needs TP groups and EP groups of 2; Tutel's sliced experts need
fewer experts than ranks (E = 2 and E = 1 on 4 ranks: 2 and 4 slices per expert)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.layouts import (  # noqa: E402
    Case,
    diff_from_reference,
    expected_expert_grads,
    reference,
    run_layouts,
)
from exec.layers.moe import DistMoE, MoESpec  # noqa: E402
from exec.layers.ted import ted  # noqa: E402
from sim.core.errors import ConfigError  # noqa: E402

# Capacities: E4 -> C = ceil(2 * 0.65 * 16 / 4) = 6; E2 -> 11 (odd: TP and P1 pad it to a
# multiple of 2 or 4); E1 (top-1) -> 11. Every layer drops tokens.
SIZES = dict(tokens=16, model_dim=8, hidden_dim=12, world=4, capacity_factor=0.65)
E4 = MoESpec(experts=4, top_k=2, **SIZES)
E2 = MoESpec(experts=2, top_k=2, **SIZES)
E1 = MoESpec(experts=1, top_k=1, **SIZES)
CASES = [
    Case(E4, "ted", {"tp": 2}),  # EP groups of 2 ranks with 2 experts each
    Case(E2, "ted", {"tp": 2}),
    Case(E2, "ted", {"tp": 4}),  # one TP group of 4; EP groups of 1
    Case(E2, "tutel", {"parallel": "p1"}),
    Case(E2, "tutel", {"parallel": "p2", "degree": 2, "algo": "2dh"}),
    Case(E2, "tutel", {"parallel": "auto"}),
    Case(E1, "tutel", {"parallel": "p1", "degree": 3}),  # 4 slices, C/4 = 3 slots each
    Case(E1, "tutel", {"parallel": "p2"}),
]
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_layouts(CASES, nprocs=4, backend="gloo", timeout_s=60)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_outputs_and_gradients_equal_the_unsliced_layer(ranks, case):
    ref = reference(case.spec, sets=4 // case.tp)
    for r in ranks:
        got = r["cases"][case.label]
        s = got["set"]
        assert s == r["rank"] // case.tp
        np.testing.assert_allclose(got["y"], ref["y"][s], rtol=RTOL, atol=ATOL)
        for name in ("x", "gate"):
            np.testing.assert_allclose(got["grads"][name], ref[name][s], rtol=RTOL, atol=ATOL)
            # (one expert: the gate's softmax is constant, its gradient zero)
            assert np.abs(got["grads"][name]).max() > 0 or (name, case.spec.experts) == ("gate", 1)
        if case.name == "tutel":
            for name, g in expected_expert_grads(case.spec, ref, r["rank"]).items():
                assert np.abs(g).max() > 0, name
                np.testing.assert_allclose(got["grads"][name], g, rtol=RTOL, atol=ATOL)
    if case.name == "ted":
        _check_ted_expert_grads(ranks, case, ref)
    rel = diff_from_reference(case, ranks)  # what `moesim exec --moe` reports
    assert max(rel.values()) < 1e-4 and "grad_w1" in rel


def _check_ted_expert_grads(ranks: list[dict], case: Case, ref: dict) -> None:
    """The tp ranks of TP group j hold the same experts, each with the gradient of its
    capacity slice: their sum is the whole gradient, which `sequential` on the same EP-group
    layer computes at once."""
    tp, ep = case.tp, 4 // case.tp
    El = case.spec.experts // ep
    for j in range(ep):
        group = [ranks[j * tp + i]["cases"] for i in range(tp)]
        for name in ("w1", "b1", "w2", "b2"):
            total = sum(g[case.label]["grads"][name] for g in group)
            whole = np.stack([ref["experts"][j * El + q][name] for q in range(El)])
            np.testing.assert_allclose(total, whole.reshape(total.shape), rtol=RTOL, atol=ATOL)
            for g in group:
                seq = g[f"{case.label}/sequential"]
                np.testing.assert_allclose(seq["grads"][name], total, rtol=RTOL, atol=ATOL)
                np.testing.assert_allclose(
                    seq["y"], g[case.label]["y"], rtol=RTOL, atol=ATOL
                )  # sequential on the EP group == TED
            # each slice alone is not the whole gradient: the test could see a missing drop
            assert not np.allclose(group[0][case.label]["grads"][name], total)


def test_reference_matches_the_shared_single_process_reference():
    from tests.test_exec_moe import _reference

    for spec in (E4, E2):
        ref = reference(spec, sets=4)
        from exec.layers.moe import make_tokens

        y, _ = _reference(spec, [make_tokens(spec, s).numpy() for s in range(4)])
        np.testing.assert_allclose(np.stack(ref["y"]), y, rtol=RTOL, atol=ATOL)


def test_layouts_refuse_layers_they_cannot_run():
    with pytest.raises(ConfigError, match="strategy.tp"):
        ted(object(), torch.zeros(4, 2, 3), {"tp": 2})  # not a layer built for TP groups
    with pytest.raises(ConfigError, match="moe.experts"):
        DistMoE(E2, 0, None, torch.device("cpu"))  # whole experts only


# Two ranks (a launch of four costs twice the CPU): one TP group of 2 holding all 4 experts,
# and one expert sliced in two (top-1: E = 1). The layouts on 4 ranks, EP and TP groups
# together and 2 or 4 slices per expert, are the CASES above.
@pytest.mark.parametrize(
    "strategy, experts, top_k",
    [({"name": "ted", "tp": 2}, 4, 2), ({"name": "tutel", "parallel": "p2", "degree": 2}, 1, 1)],
)
def test_cli_exec_moe_runs_layouts_against_the_reference(
    tmp_path, capsys, strategy, experts, top_k
):
    """`moesim exec CONFIG --moe` on a TP or sliced layout compares with the unsliced
    single-process reference (exit 0 when equal)."""
    import json

    import yaml

    from sim.cli import main

    cfg = tmp_path / "c.yaml"
    model = {"batch": 1, "seq_len": 16, "model_dim": 8, "hidden_dim": 12, "experts": experts}
    model |= {"top_k": top_k, "capacity_factor": 0.65, "dtype": "fp32"}
    spec = {"topology": "localhost-cpu", "model": model, "strategy": strategy}
    cfg.write_text(yaml.safe_dump(spec | {"passes": ["fwd", "bwd"]}))
    assert main(["exec", str(cfg), "--nprocs", "2", "--moe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["equal"] and out["strategy"].startswith(f"E{experts}:{strategy['name']}")
    assert {"y", "grad_x", "grad_gate", "grad_w1", "grad_b2"} <= set(out["max_rel_diff"])
