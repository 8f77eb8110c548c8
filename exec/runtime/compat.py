"""Every torch API the executor uses that not all supported torch versions have (torch >= 2.4).

One module, so that a version difference is handled once and tested once
(tests/test_exec_compat.py removes the newer API and checks the fallback gives the same result):

- `all_gather_single` / `reduce_scatter_single` (torch.distributed, new in 2.12; torch 2.11,
  the version on the reference H100 machine, lacks them): fall back to
  `all_gather_into_tensor` / `reduce_scatter_tensor`, which take the same arguments and exist
  since torch 2.0.
- TF32 for float32 matmuls: torch >= 2.9 has `torch.backends.cuda.matmul.fp32_precision`
  ("tf32" / "ieee") and raises when it is mixed with the legacy `allow_tf32` flag, so only one
  of the two is ever touched: the new one where it exists.
- the NCCL version: `torch.cuda.nccl.version()` raises on a build without NCCL (the CPU wheel).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_gather_single(
    out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Gather every member's `inp` into `out` (members along dim 0)."""
    fn = getattr(dist, "all_gather_single", None)
    if fn is None:
        fn = dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def reduce_scatter_single(
    out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Sum `inp` over members; this member keeps its 1/world slice of dim 0 in `out`."""
    fn = getattr(dist, "reduce_scatter_single", None)
    if fn is None:
        fn = dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def set_tf32_matmul(enabled: bool) -> None:
    """Let float32 matmuls on CUDA use TF32 tensor cores (or not)."""
    m = torch.backends.cuda.matmul
    if _has_fp32_precision():
        m.fp32_precision = "tf32" if enabled else "ieee"
    else:
        m.allow_tf32 = enabled


def _has_fp32_precision() -> bool:
    # torch.backends.cuda.matmul answers unknown names with AttributeError, so hasattr works;
    # reading fp32_precision never raises (reading allow_tf32 after a mix does)
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def nccl_version() -> str | None:
    """'2.28.9', or None where this torch has no NCCL."""
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v)
    return str(v)
