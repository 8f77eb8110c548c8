"""A tensor's gradient after a backward pass, typed as the tensor it then is."""

from __future__ import annotations

import torch


def grad_of(t: torch.Tensor) -> torch.Tensor:
    """`t.grad` once a backward pass has reached `t` (torch types it Optional: None before)."""
    g = t.grad
    assert g is not None, "no gradient: the backward pass did not reach this tensor"
    return g
