"""DualPipe / DualPipeV for real (`exec.layers.dualpipe`, gloo): 2 processes as 2 pipeline
devices run the simulator's op lists (forward / backward pairs, zero-bubble backward chunks
with their weight gradients deferred to W ops, point-to-point activations and gradients);
the outputs and weight gradients equal the sequential model's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.block import BlockSpec  # noqa: E402
from exec.layers.dualpipe import run_dualpipe, sequential  # noqa: E402
from exec.layers.moe import MoESpec  # noqa: E402
from sim.strategies import resolve_params  # noqa: E402

# a device's EP group is itself (world 1); 2 sequences of 8 tokens, 4 experts top-2, drops
SPEC = BlockSpec(
    MoESpec(
        tokens=16, model_dim=16, hidden_dim=24, experts=4, world=1, top_k=2, capacity_factor=0.75
    ),
    batch=2,
    heads=2,
)


def _check(params: dict, spec: BlockSpec = SPEC) -> None:
    ranks = run_dualpipe(spec, params, timeout_s=60)
    ref = sequential(spec, resolve_params("dualpipe", params))
    ys = {k: v for r in ranks for k, v in r["y"].items()}
    assert sorted(ys) == sorted(ref["y"])  # every micro-batch left its last stage once
    for k, y in ref["y"].items():
        np.testing.assert_allclose(ys[k], y, rtol=1e-5, atol=1e-6, err_msg=k)
    grads: dict[str, np.ndarray] = {}
    for r in ranks:  # DualPipe: a stage's two copies' gradients add up
        for k, g in r["grads"].items():
            grads[k] = grads.get(k, 0) + g
    assert sorted(grads) == sorted(ref["grads"])
    for k, g in ref["grads"].items():
        assert np.abs(g).max() > 0, k
        np.testing.assert_allclose(grads[k], g, rtol=1e-4, atol=1e-6, err_msg=k)
    for r in ranks:  # the schedule's parts all ran: pairs, zero-bubble B, W, p2p
        ops = r["ops"]
        assert ops["FB"] > 0 and ops["W"] == ops.get("Bzb", 0) > 0 and ops["sends"] > 0, ops


def test_dualpipev_equals_the_sequential_model():
    """4 stages on 2 devices (the V: stages 0 and 3 on device 0, 1 and 2 on device 1), the
    blocks with a shared expert beside the routed ones."""
    _check({"variant": "dualpipev", "pp": 4, "micro": 4}, replace(SPEC, shared=1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"variant": "dualpipe", "pp": 2, "micro": 6},
        {"variant": "dualpipev", "pp": 4, "micro": 6, "layers": 2},
    ],
)
def test_dualpipe_variants_equal_the_sequential_model(params):
    _check(params)
