"""Parm's schedules in the real layer (four gloo processes): S1, S2 and S2 with SAA give the
plain layer's outputs and gradients, and so does the baseline, whose expert gradients count
each token N_MP times (its duplicate work, Parm Sec. III-A)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.layouts import reference  # noqa: E402
from exec.layers.moe import MoESpec  # noqa: E402
from exec.layers.parm import run_parm  # noqa: E402
from exec.layers.shapes import expert_slices  # noqa: E402

RUNS = [
    ("baseline", "baseline", False),
    ("s1", "s1", False),
    ("s2", "s2", False),
    ("s2+saa", "s2", True),
]
# No drops (C = T: every expert can take every token), so S1's per-slice gating keeps what
# the plain layer keeps; a dropping layer checks the baseline and S2 (which gate on all T).
SIZES = dict(tokens=16, model_dim=8, hidden_dim=12, world=4, top_k=2)
CASES = [  # (tp, esp, spec, runs)
    (2, 2, MoESpec(experts=2, capacity_factor=1.0, **SIZES), RUNS),  # Fig. 2: MP = ESP
    (4, 2, MoESpec(experts=4, capacity_factor=2.0, **SIZES), RUNS),  # MP spans 2 ESP groups
    (2, 4, MoESpec(experts=2, capacity_factor=1.0, **SIZES), RUNS),  # ESP of 4, one EP index
    (
        2,
        2,
        MoESpec(experts=2, capacity_factor=0.4, **SIZES),
        [("drop/baseline", "baseline", False), ("drop/s2+saa", "s2", True)],
    ),
]
RTOL, ATOL = 1e-4, 1e-5


def _key(tp: int, esp: int, label: str) -> str:
    return f"tp{tp}/esp{esp}/{label}"


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    cases = [
        {
            "spec": spec,
            "tp": tp,
            "esp": esp,
            "runs": [(_key(tp, esp, lab), s, saa) for lab, s, saa in runs],
        }
        for tp, esp, spec, runs in CASES
    ]
    return run_parm(cases, nprocs=4, timeout_s=60)


@pytest.mark.parametrize(
    "case,run",
    [(c, r) for c in CASES for r in c[3]],
    ids=lambda v: str(v[0]) if len(v) == 3 else "",
)
def test_schedules_equal_the_plain_layer(ranks, case, run):
    tp, esp, spec, _ = case
    label, schedule, _saa = run
    ref = reference(spec, sets=4 // tp)
    mp = tp
    for r in ranks:
        got = r["cases"][_key(tp, esp, label)]
        s = got["set"]
        np.testing.assert_allclose(got["y"], ref["y"][s], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got["grads"]["x"], ref["x"][s], rtol=RTOL, atol=ATOL)
    # the gate is replicated: S1 gates a 1/N_MP slice per rank, so its MP group's gradients
    # add up to the plain one; the others gate every token on every rank
    for g0 in range(0, 4, mp):
        grads = [ranks[g0 + t]["cases"][_key(tp, esp, label)]["grads"]["gate"] for t in range(mp)]
        want = ref["gate"][g0 // mp]
        if schedule == "s1":
            np.testing.assert_allclose(sum(grads), want, rtol=RTOL, atol=ATOL)
        else:
            for g in grads:
                np.testing.assert_allclose(g, want, rtol=RTOL, atol=ATOL)
    # every expert slice's weight gradient: the plain layer's summed over the token sets
    # (the baseline computes each token N_MP times, and counts it N_MP times)
    times = mp if schedule == "baseline" else 1
    El = spec.experts // (4 // esp)
    for r in ranks:
        e, s_ = divmod(r["rank"], esp)
        hs, _ = expert_slices(spec, esp, s_)
        got = r["cases"][_key(tp, esp, label)]["grads"]
        for x in range(El):
            w = ref["experts"][e * El + x]
            want = {"w1": w["w1"][:, hs], "b1": w["b1"][hs], "w2": w["w2"][hs, :]}
            if s_ == 0:
                want["b2"] = w["b2"]
            else:
                assert "b2" not in got  # slice 0 adds the bias
            for name, g in want.items():
                assert np.abs(g).max() > 0
                np.testing.assert_allclose(got[name][x], times * g, rtol=RTOL, atol=ATOL)
