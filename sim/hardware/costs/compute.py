"""Compute cost models: PipeMoE's alpha + beta*work per op kind (Eq. 13) and a roofline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sim.core.errors import ConfigError
from sim.core.graph import Task

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


class ComputeModel(Protocol):
    def duration(self, task: Task) -> float: ...


@dataclass
class RooflineCompute:
    """t = launch + max(flops / (peak[dtype] * eff), bytes / (mem_bw * eff))."""

    peak_flops: dict[str, float]
    mem_bw: float
    launch_s: float = 0.0
    flops_efficiency: float = 1.0
    mem_efficiency: float = 1.0

    @classmethod
    def from_gpu(
        cls, gpu: dict[str, Any], override: dict[str, Any] | None = None
    ) -> RooflineCompute:
        roof = {**(gpu.get("roofline") or {}), **(override or {})}
        try:
            peak = {k: float(v) for k, v in (gpu.get("peak_flops") or {}).items()}
            mem_bw = float(gpu["mem_bw"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"gpu: peak_flops and mem_bw are required numbers ({e})") from None
        if not peak or min(peak.values()) <= 0 or mem_bw <= 0:
            raise ConfigError("gpu: peak_flops entries and mem_bw must be > 0")
        return cls(
            peak,
            mem_bw,
            float(roof.get("launch_s", 0.0)),
            float(roof.get("flops_efficiency", 1.0)),
            float(roof.get("mem_efficiency", 1.0)),
        )

    def duration(self, task: Task) -> float:
        dtype = task.tags.get("dtype", "bf16")
        peak = self.peak_flops.get(dtype)
        if peak is None:  # no silent fallback: tf32 at the fp32 rate would be 8x off
            raise ConfigError(
                f"task {task.id!r}: the GPU's peak_flops has no {dtype!r} entry "
                f"(it has {sorted(self.peak_flops)}); add one to the topology or change "
                f"model.dtype"
            )
        t_flops = task.flops / (peak * self.flops_efficiency)
        t_mem = task.bytes / (self.mem_bw * self.mem_efficiency)
        return self.launch_s + max(t_flops, t_mem)


@dataclass
class AlphaBetaCompute:
    """Per op kind, t = alpha + beta * work (work = m*n*k for GEMMs, bytes otherwise).

    Kinds without fitted parameters fall back to the roofline: PipeMoE fitted GEMMs only.
    GEMM shapes measured exactly (`shapes`, (batch, m, n, k) -> seconds, from a calibration
    that profiled the graph's own GEMMs) take their measured time: on CPUs in particular, two
    GEMMs of equal m*n*k but different shapes differ by tens of percent.
    """

    params: dict[str, tuple[float, float]]
    fallback: ComputeModel | None = None
    used_fallback: set[str] = field(default_factory=set)
    shapes: dict[tuple[int, int, int, int], float] = field(default_factory=dict)

    @classmethod
    def from_params(
        cls,
        raw: dict[str, Any],
        fallback: ComputeModel | None,
        shapes: list[dict[str, Any]] | None = None,
    ) -> AlphaBetaCompute:
        params = {}
        for kind, p in raw.items():
            try:
                params[kind] = (float(p["alpha"]), float(p["beta"]))
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"alpha_beta.{kind}: needs numeric 'alpha' and 'beta'") from None
            if params[kind][0] < 0 or params[kind][1] < 0:
                raise ConfigError(f"alpha_beta.{kind}: alpha and beta must be >= 0")
        return cls(params, fallback, shapes=gemm_shape_table(shapes or []))

    def duration(self, task: Task) -> float:
        if self.shapes and task.kind == "gemm" and task.shape:
            t = self.shapes.get(shape_key(task.shape))
            if t is not None:
                return t
        p = self.params.get(task.kind)
        if p is None:
            if self.fallback is None:
                raise ConfigError(f"alpha_beta: no parameters for kind {task.kind!r}")
            self.used_fallback.add(task.kind)
            return self.fallback.duration(task)
        return p[0] + p[1] * task.work()


SHAPE_FIELDS = ("batch", "m", "n", "k")


def shape_key(shape: dict[str, Any]) -> tuple[int, int, int, int]:
    return (int(shape.get("batch", 1)), int(shape["m"]), int(shape["n"]), int(shape["k"]))


def gemm_shape_table(rows: list[dict[str, Any]]) -> dict[tuple[int, int, int, int], float]:
    """`gemm_shapes` entries ({batch, m, n, k, seconds}) as a lookup table."""
    out = {}
    for i, r in enumerate(rows):
        try:
            key = shape_key(r)
            t = float(r["seconds"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(
                f"gemm_shapes[{i}]: expected batch, m, n, k and seconds, got {r!r}"
            ) from None
        if min(key) < 1 or not t > 0:
            raise ConfigError(f"gemm_shapes[{i}]: sizes must be >= 1 and seconds > 0, got {r!r}")
        out[key] = t
    return out
