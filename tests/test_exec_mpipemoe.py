"""MPipeMoE in the real layer: every memory-reuse strategy gives sequential's outputs and
gradients, and each keeps (or restores) T_DI and T_M the way Table II says."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():  # pragma: no cover - exotic torch builds
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.layers.moe import MoESpec, make_expert  # noqa: E402
from exec.layers.mpipemoe import _Expert, check  # noqa: E402
from exec.layers.run import Variant, run_moe  # noqa: E402
from sim.core.errors import ConfigError  # noqa: E402

# top-1, C = ceil(1.5 * 40 / 4) = 15 slots: degrees 2 and 4 give micro-batches of unequal size
SPEC = MoESpec(
    tokens=40,
    model_dim=8,
    hidden_dim=32,
    experts=4,
    world=2,
    top_k=1,
    capacity_factor=1.5,
    seed=3,
)
VARIANTS = [
    Variant("sequential"),
    Variant("mpipemoe", {"degree": 4, "reuse": "none"}),
    Variant("mpipemoe", {"degree": 4, "reuse": "S1"}),
    Variant("mpipemoe", {"degree": 2, "reuse": "S2"}),
    Variant("mpipemoe", {"degree": 15, "reuse": "S3"}),
]


def test_every_reuse_strategy_equals_sequential():
    run = run_moe(SPEC, VARIANTS, nprocs=2, backend="gloo", timeout_s=30, backward=True)
    for v in VARIANTS[1:]:
        for r in run.ranks:
            seq, got = r["variants"]["sequential"], r["variants"][v.label]
            np.testing.assert_allclose(got["y"], seq["y"], rtol=1e-5, atol=1e-6)
            for name, g in seq["grads"].items():
                assert np.abs(g).max() > 0, name
                np.testing.assert_allclose(got["grads"][name], g, rtol=1e-4, atol=1e-5)
        assert max(run.max_rel_diff(v.label).values()) < 1e-5, v.label


class _Loopback:
    """One rank's exchange: the all-to-all of a single member returns its input."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def exchange(self, x: torch.Tensor, stream: str, what: str) -> torch.Tensor:
        self.calls.append(what)
        return x.clone()


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # cuda: pinned d2h / h2d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reuse", ["none", "S1", "S2", "S3", "S4"])
def test_the_expert_node_keeps_and_restores_per_table_2(reuse, device):
    spec = MoESpec(tokens=12, model_dim=4, hidden_dim=16, experts=2, world=1, top_k=1)
    comms = _Loopback()
    moe = SimpleNamespace(  # DistMoE.exchange of one rank: the padded chunk comes back
        spec=spec,
        act=torch.nn.functional.gelu,
        comms=comms,
        exchange=lambda x, lo, back, stream, what, key: comms.exchange(x, stream, what),
    )
    ex = [make_expert(spec, e) for e in range(2)]

    def param(name: str, bias: bool = False) -> torch.Tensor:
        t = torch.stack([e[name] for e in ex])
        return (t.unsqueeze(1) if bias else t).to(device).requires_grad_()

    w1, b1, w2, b2 = param("w1"), param("b1", True), param("w2"), param("b2", True)
    x = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0)).to(device)
    x.requires_grad_()
    y = _Expert.apply(x, w1, b1, w2, b2, moe, reuse, x.detach(), "chunk")
    node = y.grad_fn
    di, m = {
        "none": ("keep", "keep"),
        "S1": ("off", "off"),
        "S2": ("comm", "off"),
        "S3": ("off", "re"),
        "S4": ("comm", "re"),
    }[reuse]
    assert (node.di is None) == (di == "comm") and (node.source is None) == (di != "comm")
    assert (node.m is None) == (m == "re")
    h = torch.baddbmm(b1, x, w1)
    if m != "re":  # kept, or a copy of its own (in host memory on GPUs)
        assert torch.equal(node.m.restore(), h.detach())
        assert node.m.data.device.type == ("cpu" if m == "off" else device)
    if di != "comm":
        assert torch.equal(node.di.restore(), x.detach())
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(device)
    grads = torch.autograd.grad(y, (x, w1, b1, w2, b2), dy)
    assert moe.comms.calls == (["chunk (re-dispatch)"] if di == "comm" else [])
    ref = torch.baddbmm(b2, torch.nn.functional.gelu(torch.baddbmm(b1, x, w1)), w2)
    want = torch.autograd.grad(ref, (x, w1, b1, w2, b2), dy)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_the_real_layer_needs_fixed_choices():
    with pytest.raises(ConfigError, match="strategy.degree"):
        check({"degree": "auto", "reuse": "S1"}, 8)
    with pytest.raises(ConfigError, match="strategy.degree"):
        check({"degree": 9, "reuse": "S1"}, 8)
    with pytest.raises(ConfigError, match="strategy.reuse"):
        check({"degree": 2, "reuse": "auto"}, 8)
    assert check({"degree": 2, "reuse": "S4"}, 8) == (2, "S4")
