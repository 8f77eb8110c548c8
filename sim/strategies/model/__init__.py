"""Models of many transformer blocks around the MoE layers that the strategies build."""

from __future__ import annotations

from sim.strategies.model.builder import build_model, grad_bytes

__all__ = ["build_model", "grad_bytes"]
