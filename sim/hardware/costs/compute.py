"""Compute cost models: PipeMoE's alpha + beta*work per op kind (Eq. 13) and a roofline
(whose GEMMs follow sim.hardware.costs.gemm where the GPU describes its GEMM model)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.hardware.costs.gemm import DTYPE_BYTES, GemmModel, gemm_layout

__all__ = ["DTYPE_BYTES", "AlphaBetaCompute", "ComputeModel", "RooflineCompute"]


class ComputeModel(Protocol):
    def duration(self, task: Task) -> float: ...


@dataclass
class RooflineCompute:
    """t = launch + max(flops / (peak[dtype] * eff), bytes / (mem_bw * eff)); a GEMM with a
    shape on a GPU with a GEMM model (`gpu.gemm`) takes that model's time instead.

    `costs.roofline: {gemm_model: false}` keeps the plain roofline for GEMMs too.
    """

    peak_flops: dict[str, float]
    mem_bw: float
    launch_s: float = 0.0
    flops_efficiency: float = 1.0
    mem_efficiency: float = 1.0
    gemm: GemmModel | None = None

    @classmethod
    def from_gpu(
        cls, gpu: dict[str, Any], override: dict[str, Any] | None = None
    ) -> RooflineCompute:
        override = dict(override or {})
        use_gemm = override.pop("gemm_model", True)
        if not isinstance(use_gemm, bool):
            raise ConfigError(
                f"costs.roofline.gemm_model: expected true or false, got {use_gemm!r}"
            )
        roof = {**(gpu.get("roofline") or {}), **override}
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
            GemmModel.from_gpu(gpu) if use_gemm else None,
        )

    def _gemm_args(self, task: Task) -> tuple[str, int, int, int, int, str] | None:
        """(dtype, batch, m, n, k, layout) of a GEMM the GEMM model costs; None for other
        kernels or without a GEMM model."""
        s = task.shape
        if self.gemm is None or task.kind != "gemm" or not s or not {"m", "n", "k"} <= s.keys():
            return None
        try:
            layout = gemm_layout(s)
        except ValueError as e:
            raise ConfigError(f"task {task.id!r}: {e}") from None
        return (str(task.tags.get("dtype", "bf16")), *shape_key(s), layout)

    def waves(self, task: Task) -> int | None:
        """Waves of a GEMM's tiles over the SMs (the GEMM model's choice); None where no
        model here knows them (other kernels, no GEMM model, a GEMM without tokens)."""
        args = self._gemm_args(task)
        if args is None or min(args[1:5]) < 1:
            return None
        return self.gemm.best(*args).waves  # type: ignore[union-attr]

    def duration(self, task: Task) -> float:
        dtype = task.tags.get("dtype", "bf16")
        args = self._gemm_args(task)
        if args is not None:
            if min(args[1:5]) < 1:
                return 0.0  # a chunk without tokens: the library returns without a kernel
            return self.gemm.seconds(*args)  # type: ignore[union-attr]
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

    A kind's parameters are one fit for every dtype (`params`: kind -> (alpha, beta), what
    copies and memory-bound kernels have) or one per dtype (`by_dtype`: kind -> dtype ->
    (alpha, beta), what a calibration gives GEMMs). Kinds, or dtypes, without fitted
    parameters fall back to the roofline (PipeMoE fitted GEMMs only); a calibrated kind
    missing the graph's dtype says so once (a CalibrationWarning).
    GEMM shapes measured exactly (`shapes`, (batch, m, n, k, dtype, layout) -> seconds, from a
    calibration that profiled the graph's own GEMMs) take their measured time: on CPUs in
    particular, two GEMMs of equal m*n*k but different shapes differ by tens of percent.
    A shape measured without a dtype stands for every dtype.
    """

    params: dict[str, tuple[float, float]]
    fallback: ComputeModel | None = None
    used_fallback: set[str] = field(default_factory=set)
    shapes: dict[tuple[int, int, int, int, str | None, str], float] = field(default_factory=dict)
    by_dtype: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    @classmethod
    def from_params(
        cls,
        raw: dict[str, Any],
        fallback: ComputeModel | None,
        shapes: list[dict[str, Any]] | None = None,
    ) -> AlphaBetaCompute:
        params: dict[str, tuple[float, float]] = {}
        by_dtype: dict[str, dict[str, tuple[float, float]]] = {}
        for kind, p in raw.items():
            if isinstance(p, dict) and p and "alpha" not in p and "beta" not in p:
                by_dtype[kind] = {
                    str(dt): _alpha_beta(f, f"alpha_beta.{kind}.{dt}") for dt, f in p.items()
                }
                for dt in by_dtype[kind]:
                    if dt not in DTYPE_BYTES:
                        raise ConfigError(
                            f"alpha_beta.{kind}.{dt}: unknown dtype (known: {sorted(DTYPE_BYTES)})"
                        )
            else:
                params[kind] = _alpha_beta(p, f"alpha_beta.{kind}")
        return cls(params, fallback, shapes=gemm_shape_table(shapes or []), by_dtype=by_dtype)

    def fit_for(self, kind: str, dtype: str | None) -> tuple[float, float] | None:
        """(alpha, beta) of `kind` for `dtype`, or None when neither it nor every dtype has one."""
        per = self.by_dtype.get(kind)
        if per is not None and dtype is not None and dtype in per:
            return per[dtype]
        return self.params.get(kind)

    def duration(self, task: Task) -> float:
        dtype = task.tags.get("dtype")
        if self.shapes and task.kind == "gemm" and task.shape:
            b, m, n, k = shape_key(task.shape)
            layout = str(task.shape.get("layout", "nn"))
            t = self.shapes.get((b, m, n, k, dtype, layout))
            if t is None:
                t = self.shapes.get((b, m, n, k, None, layout))
            if t is not None:
                return t
        p = self.fit_for(task.kind, dtype)
        if p is None:
            if self.fallback is None:
                raise ConfigError(
                    f"alpha_beta: no parameters for kind {task.kind!r}"
                    + (f" in {dtype}" if dtype else "")
                )
            if task.kind in self.by_dtype and f"{task.kind}/{dtype}" not in self.used_fallback:
                # imported here: its module builds the calibration file's schema
                from sim.hardware.costs.calibration_file import CalibrationWarning

                warnings.warn(
                    CalibrationWarning(
                        f"alpha_beta.{task.kind} has fits for {sorted(self.by_dtype[task.kind])} "
                        f"but not for {dtype!r} (a calibration from another device or dtype?): "
                        f"{dtype} {task.kind} tasks use the topology's model instead"
                    ),
                    stacklevel=2,
                )
                self.used_fallback.add(f"{task.kind}/{dtype}")
            self.used_fallback.add(task.kind)
            return self.fallback.duration(task)
        return p[0] + p[1] * task.work()


def _alpha_beta(p: Any, where: str) -> tuple[float, float]:
    try:
        a, b = float(p["alpha"]), float(p["beta"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: needs numeric 'alpha' and 'beta'") from None
    if not (a >= 0 and b >= 0) or not math.isfinite(a + b):
        raise ConfigError(f"{where}: alpha and beta must be finite and >= 0")
    return a, b


SHAPE_FIELDS = ("batch", "m", "n", "k")


def shape_key(shape: dict[str, Any]) -> tuple[int, int, int, int]:
    return (int(shape.get("batch", 1)), int(shape["m"]), int(shape["n"]), int(shape["k"]))


def gemm_shape_table(
    rows: list[dict[str, Any]],
) -> dict[tuple[int, int, int, int, str | None, str], float]:
    """`gemm_shapes` entries ({batch, m, n, k, seconds}, optionally dtype and layout) as a
    lookup table keyed by (batch, m, n, k, dtype or None, layout)."""
    out = {}
    for i, r in enumerate(rows):
        try:
            key = shape_key(r)
            t = float(r["seconds"])
            dtype = r.get("dtype")
            layout = gemm_layout(r)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(
                f"gemm_shapes[{i}]: expected batch, m, n, k and seconds (and optionally dtype "
                f"and layout), got {r!r}"
            ) from None
        if min(key) < 1 or not t > 0 or (dtype is not None and dtype not in DTYPE_BYTES):
            raise ConfigError(
                f"gemm_shapes[{i}]: sizes must be >= 1, seconds > 0 and dtype known, got {r!r}"
            )
        out[(*key, None if dtype is None else str(dtype), layout)] = t
    return out
