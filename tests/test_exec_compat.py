"""exec.runtime.compat: with the newer torch API taken away, the fallbacks give the same
results (CI runs the pinned wheel, which has the new API; older torch versions take these
paths for real)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

from exec.runtime import compat  # noqa: E402


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo group in this process: enough to call every collective for real."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _gather_and_scatter() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    gathered = torch.empty(3, 2)
    compat.all_gather_single(gathered, x, async_op=True).wait()
    reduced = torch.empty(3, 2)
    compat.reduce_scatter_single(reduced, x * 2, async_op=True).wait()
    return gathered, reduced


def test_collective_fallbacks_give_the_same_result(one_rank, monkeypatch):
    new = _gather_and_scatter()
    for name in ("all_gather_single", "reduce_scatter_single"):
        monkeypatch.delattr(dist, name, raising=False)  # torch 2.11 has neither
    assert not hasattr(dist, "all_gather_single")
    old = _gather_and_scatter()
    for a, b in zip(new, old):
        assert torch.equal(a, b)
    assert torch.equal(old[0], torch.arange(6, dtype=torch.float32).reshape(3, 2))


def test_tf32_switch_uses_one_api_only(monkeypatch):
    """torch >= 2.9 raises when the legacy allow_tf32 flag and fp32_precision are mixed: the
    shim sets the new one where it exists and the legacy one only where it does not."""
    new = types.SimpleNamespace(fp32_precision="none")
    monkeypatch.setattr(torch.backends.cuda, "matmul", new)
    compat.set_tf32_matmul(True)
    assert new.fp32_precision == "tf32" and not hasattr(new, "allow_tf32")
    compat.set_tf32_matmul(False)
    assert new.fp32_precision == "ieee"
    legacy = types.SimpleNamespace(allow_tf32=False)
    monkeypatch.setattr(torch.backends.cuda, "matmul", legacy)
    compat.set_tf32_matmul(True)
    assert legacy.allow_tf32 is True and not hasattr(legacy, "fp32_precision")


def test_nccl_version_is_a_string_or_none():
    v = compat.nccl_version()
    assert v is None or (isinstance(v, str) and v[0].isdigit())
