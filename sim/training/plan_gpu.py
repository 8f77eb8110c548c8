"""The GPU a plan's candidates run on (`sim.training.plan`): its kernels and the request's
precision, checked before any candidate is built, and a candidate's MFU on it."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.training.plan_space import Request


def precision_probe(req: Request, preset: str, gpu: dict[str, Any], base: Any) -> tuple[Any, Any]:
    """The GPU's kernels and the request's precision, refused in one line where the
    precision is unknown or the GPU has no GEMMs of it (before any candidate is built: else
    every one of them is dropped as invalid, which names nothing)."""
    from sim.training.kernels import GpuKernels
    from sim.training.precision import PRECISIONS, precision_of

    name = req.precision.upper()
    if name not in PRECISIONS:
        raise ConfigError(
            f"{req.where}: precision: unknown {req.precision!r} (known: {', '.join(PRECISIONS)})"
        )
    kernels = GpuKernels.from_gpu(gpu, f"{req.where}: {preset}")
    prec = precision_of(name, base)
    try:
        kernels.rate(prec.gemm)
    except ConfigError as e:
        raise ConfigError(f"{req.where}: precision {name}: {e}") from None
    return kernels, prec


def mfu(r: dict[str, Any], probe: tuple[Any, Any]) -> float:
    """Model FLOPs per second per GPU over the dense peak of the run's GEMM dtype;
    `probe`: the GPU's kernels and the run's precision."""
    gpu, prec = probe
    peak = gpu.peak.get(prec.gemm) or gpu.peak["bf16"]
    return float(r["predicted_tflops_per_gpu"]) * 1e12 / peak
