"""The executor's GEMMs as training runs them: a transposed operand is a view of its stored
buffer, never a materialised copy (exec.runtime.ops; finding 2 of the H100 measurements: a
materialised operand with an unaligned leading dimension leaves the tensor cores)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")

from exec.errors import ExecError  # noqa: E402
from exec.runtime.ops import OpFactory, run_dtype  # noqa: E402
from sim.core.graph import Task, TaskGraph  # noqa: E402

B, M, N, K = 2, 12, 20, 9  # K odd: a materialised A^T would have an unaligned leading dim


def _op(layout: str | None):
    shape = {"batch": B, "m": M, "n": N, "k": K}
    if layout is not None:
        shape["layout"] = layout
    g = TaskGraph(1)
    g.add(Task("g", 0, "compute", "gemm", shape=shape, tags={"dtype": "bf16"}))
    return OpFactory(g, 0, torch.device("cpu"), None, {}).build(g.tasks["g"])  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", [None, "nn", "nt", "tn", "tt"])
def test_gemm_operands_are_views_in_their_layout(layout, monkeypatch):
    op = _op(layout)
    a, w, out = op.operands
    assert a.shape == (B, M, K) and w.shape == (B, K, N) and out.shape == (B, M, N)
    lay = layout or "nn"
    for operand, stored_t in ((a, lay[0] == "t"), (w, lay[1] == "t")):
        if stored_t:  # the transposed view of a contiguous [b, cols, rows] buffer
            assert operand._base is not None and not operand.is_contiguous()
            assert operand.stride(1) == 1 and operand.transpose(1, 2).is_contiguous()
        else:
            assert operand.is_contiguous()

    def no_copies(*_a, **_k):
        raise AssertionError("the GEMM materialised an operand")

    monkeypatch.setattr(torch.Tensor, "contiguous", no_copies)
    monkeypatch.setattr(torch.Tensor, "clone", no_copies)
    op.launch()
    monkeypatch.undo()
    want = torch.bmm(a.contiguous(), w.contiguous())
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)


def test_unknown_layout_is_a_clear_error():
    with pytest.raises(ExecError, match="layout 'ab'"):
        _op("ab")


def test_cpu_runs_every_dtype_as_fp32():
    assert _op("nn").operands[0].dtype == torch.float32
    assert run_dtype("bf16", "cpu") == "fp32" and run_dtype("bf16", "cuda") == "bf16"
    assert run_dtype("fp8", "cuda") == "bf16"
