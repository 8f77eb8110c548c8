"""Lancet's schedule on the real block (gloo, 2 ranks): partitioned operators with the
capacity passed on, irregular all-to-alls, weight gradients in the exchange windows; the
same output and gradients as the plain block and the single-process reference."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.block import BlockSpec, reference, run_block  # noqa: E402
from exec.layers.lancet import route_after  # noqa: E402
from exec.layers.moe import MoESpec, route  # noqa: E402

# 4 sequences of 8 tokens per rank, 4 experts top-1, f = 0.75: tokens are dropped, and the
# partitions route unevenly (capacity passing matters)
SPEC = BlockSpec(
    MoESpec(
        tokens=32,
        model_dim=16,
        hidden_dim=24,
        experts=4,
        world=2,
        top_k=1,
        capacity_factor=0.75,
        seed=5,
    ),
    batch=4,
    heads=2,
)
VARIANTS = [
    ("sequential", {}),
    ("lancet", {"partition": 2, "dw": "on"}),
    ("lancet", {"partition": 3, "dw": "off"}),
    ("lancet", {"partition": 4, "dw": "on", "gate": "batch_prioritized"}),
]


def test_capacity_passing_routes_like_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    z, gate = torch.randn(40, 8, generator=g), torch.randn(8, 4, generator=g)
    whole = route(z, gate, 1, 6)
    used = torch.zeros(4, dtype=torch.long)
    parts = [route_after(z[a:b], gate, 6, used) for a, b in [(0, 7), (7, 25), (25, 40)]]
    slot = torch.cat([p.slot for p in parts])
    assert torch.equal(slot, whole.slot) and (slot < 0).any()  # same slots, same drops


def test_lancet_block_equals_plain_block_and_reference():
    ranks = run_block(SPEC, VARIANTS, timeout_s=60)
    ref = reference(SPEC)
    for r in ranks:
        want = ref[r["rank"]]
        plain = r["variants"]["sequential[]"]
        for label, got in r["variants"].items():
            for key in ("y", "x"):
                np.testing.assert_allclose(
                    got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=f"{label} {key}"
                )
                np.testing.assert_allclose(got[key], plain[key], rtol=1e-5, atol=1e-6)
            assert set(got["grads"]) == set(want["grads"])
            for name, g in want["grads"].items():
                assert np.abs(g).max() > 0, name
                np.testing.assert_allclose(
                    got["grads"][name], g, rtol=1e-4, atol=1e-5, err_msg=f"{label} {name}"
                )
