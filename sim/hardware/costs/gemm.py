"""A GPU GEMM model: output tiles in waves over the SMs, against the bytes the GEMM must move.

A (batched) GEMM out[b, m, n] = A[b, m, k] @ B[b, k, n] runs as b * ceil(m/Tm) * ceil(n/Tn)
output tiles of Tm x Tn, spread over the SMs in waves; a wave lasts as long as one tile, so a
GEMM of 133 tiles on 132 SMs takes two waves (wave quantisation). One tile reduces over k in
steps of `k_step`, plus a fixed cost worth `tile_overhead_k` more of k (filling the pipeline,
writing the tile out: the tile efficiency k / (k + tile_overhead_k)), at the SM's share of the
dtype's peak times `efficiency[dtype]`. Where the tiles do not fill the SMs the reduction may be
split over s CTAs (split-K: s times the tiles, k / s each, fp32 partial sums written and read
back, `split_k_s` for the reduction kernel). The GEMM also has to read A and B and write out
once: the memory time, at `read_efficiency` and `write_efficiency` of the memory bandwidth.
Per (tile shape, split) the time is the larger of the two; the library is taken to pick the
fastest candidate (cuBLAS' heuristics aim at that), and `launch_s` is added once.

Operands whose leading dimension is not a multiple of 16 bytes leave the TMA / tensor-core
kernels (cuBLAS falls back to kernels with narrow loads): their compute runs at
`unaligned_efficiency` of the aligned rate. Which leading dimension an operand has depends on
how it is stored: the shape's `layout` (LAYOUTS) says, per operand, "n" (as written: A [m, k],
B [k, n]) or "t" (stored transposed, A [k, m], B [n, k], used through a transposed view, as
autograd computes dgrad dy W^T ("nt") and wgrad x^T dy ("tn")). Without a layout a shape means
"nn", what a GEMM on materialised operands is.

The parameters are data (the topology's `gpu.gemm` section, with their sources); `dgx-h100`'s
were fitted to the H100 measurements in ../shared/reference/measurements/h100-sxm-2026-11-23/
with some of them held out (benchmarks/gpu_model_h100.py reports both errors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError

LAYOUTS = ("nn", "nt", "tn", "tt")
# bytes per element; fp8 covers FP8 and MXFP8, fp4 NVFP4 (4 bits: half a byte; its block
# scales, one FP8 per 16 elements, are left out like fp8's)
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp4": 0.5}
PARTIAL_BYTES = 4  # split-K partial sums are fp32


def gemm_layout(shape: dict[str, Any]) -> str:
    """The operand layout of a GEMM shape ("nn" when it names none)."""
    layout = shape.get("layout", "nn")
    if layout not in LAYOUTS:
        raise ValueError(f"GEMM layout {layout!r} is not one of {LAYOUTS}")
    return str(layout)


def leading_dims(m: int, n: int, k: int, layout: str) -> tuple[int, int, int]:
    """Leading dimensions (elements) of A, B and out as stored, row-major."""
    lda = k if layout[0] == "n" else m
    ldb = n if layout[1] == "n" else k
    return lda, ldb, n


def _tiles(raw: Any) -> dict[str, tuple[tuple[int, int], ...]]:
    def shapes(v: Any) -> tuple[tuple[int, int], ...]:
        return tuple((int(a), int(b)) for a, b in v)

    if isinstance(raw, dict):
        return {str(k): shapes(v) for k, v in raw.items()}
    return {"default": shapes(raw)}


@dataclass(frozen=True)
class Candidate:
    """One way to run a GEMM: a tile shape and a split of k."""

    tile: tuple[int, int]
    split: int
    waves: int
    compute_s: float
    memory_s: float
    seconds: float  # launch included


@dataclass
class GemmModel:
    """A GPU GEMM's time: output tiles in waves over the SMs, against its bytes."""

    sms: int
    peak_flops: dict[str, float]
    mem_bw: float
    efficiency: dict[str, float]
    tiles: dict[str, tuple[tuple[int, int], ...]]  # dtype (or "default") -> tile shapes
    k_step: int
    tile_overhead_k: float
    launch_s: float
    read_efficiency: float
    write_efficiency: float
    split_k: tuple[int, ...] = (1,)
    split_k_s: float = 0.0
    split_k_min_depth: int = 512
    unaligned_efficiency: float = 1.0
    alignment_bytes: int = 16
    _cache: dict[tuple, Candidate] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_gpu(cls, gpu: dict[str, Any]) -> GemmModel | None:
        """The model of a topology's `gpu` section, or None when it has no `gemm` part."""
        raw = gpu.get("gemm")
        if raw is None:
            return None
        where = "gpu.gemm"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping of model parameters")
        known = {
            "sms",
            "efficiency",
            "tiles",
            "k_step",
            "tile_overhead_k",
            "launch_s",
            "read_efficiency",
            "write_efficiency",
            "split_k",
            "split_k_s",
            "split_k_min_depth",
            "unaligned_efficiency",
            "alignment_bytes",
        }
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
        try:
            model = cls(
                sms=int(raw["sms"]),
                peak_flops={str(k): float(v) for k, v in (gpu.get("peak_flops") or {}).items()},
                mem_bw=float(gpu["mem_bw"]),
                efficiency={str(k): float(v) for k, v in dict(raw["efficiency"]).items()},
                tiles=_tiles(raw["tiles"]),
                k_step=int(raw.get("k_step", 64)),
                tile_overhead_k=float(raw.get("tile_overhead_k", 0.0)),
                launch_s=float(raw.get("launch_s", 0.0)),
                read_efficiency=float(raw["read_efficiency"]),
                write_efficiency=float(raw["write_efficiency"]),
                split_k=tuple(int(s) for s in raw.get("split_k", (1,))),
                split_k_s=float(raw.get("split_k_s", 0.0)),
                split_k_min_depth=int(raw.get("split_k_min_depth", 512)),
                unaligned_efficiency=float(raw.get("unaligned_efficiency", 1.0)),
                alignment_bytes=int(raw.get("alignment_bytes", 16)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"{where}: needs sms, efficiency (per dtype), tiles ([[Tm, Tn], ...]), "
                f"read_efficiency and write_efficiency as numbers ({e!r})"
            ) from None
        model.check(where)
        return model

    def check(self, where: str) -> None:
        positive = {
            "sms": self.sms,
            "k_step": self.k_step,
            "mem_bw": self.mem_bw,
            "alignment_bytes": self.alignment_bytes,
        }
        for name, v in positive.items():
            if not v > 0:
                raise ConfigError(f"{where}.{name}: must be > 0, got {v!r}")
        shares = {
            "read_efficiency": self.read_efficiency,
            "write_efficiency": self.write_efficiency,
            "unaligned_efficiency": self.unaligned_efficiency,
            **{f"efficiency.{k}": v for k, v in self.efficiency.items()},
        }
        for name, v in shares.items():
            if not 0 < v <= 1:
                raise ConfigError(f"{where}.{name}: a share of peak, in (0, 1]; got {v!r}")
        if "default" not in self.tiles or any(
            not ts or min(min(t) for t in ts) < 1 for ts in self.tiles.values()
        ):
            raise ConfigError(
                f"{where}.tiles: expected [[Tm, Tn], ...] of positive sizes, or a mapping of "
                f"dtypes (and 'default') to such lists"
            )
        if not self.split_k or min(self.split_k) < 1 or 1 not in self.split_k:
            raise ConfigError(f"{where}.split_k: positive splits, 1 among them")
        for name in ("tile_overhead_k", "launch_s", "split_k_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}.{name}: must be >= 0")

    # -- the model ----------------------------------------------------------------------------
    def seconds(self, dtype: str, batch: int, m: int, n: int, k: int, layout: str = "nn") -> float:
        return self.best(dtype, batch, m, n, k, layout).seconds

    def best(self, dtype: str, batch: int, m: int, n: int, k: int, layout: str = "nn") -> Candidate:
        """The fastest candidate (tile shape, split) for this GEMM, with its parts."""
        key = (dtype, batch, m, n, k, layout)
        hit = self._cache.get(key)
        if hit is None:
            hit = min(self.candidates(dtype, batch, m, n, k, layout), key=lambda c: c.seconds)
            self._cache[key] = hit
        return hit

    def candidates(
        self, dtype: str, batch: int, m: int, n: int, k: int, layout: str = "nn"
    ) -> list[Candidate]:
        peak = self.peak_flops.get(dtype)
        eff = self.efficiency.get(dtype)
        if peak is None or eff is None or dtype not in DTYPE_BYTES:
            have = sorted(set(self.peak_flops) & set(self.efficiency))
            raise ConfigError(
                f"gpu.gemm: no {dtype!r} GEMM rate (peak_flops and gemm.efficiency have "
                f"{have}); add one to the topology or change model.dtype"
            )
        if min(batch, m, n, k) < 1:
            raise ConfigError(f"GEMM of shape batch={batch} m={m} n={n} k={k}: sizes must be >= 1")
        elem = DTYPE_BYTES[dtype]
        if not self.aligned(elem, m, n, k, layout):
            eff *= self.unaligned_efficiency
        sm_rate = peak / self.sms * eff
        read = elem * batch * (m * k + k * n)
        write = elem * batch * m * n
        rbw = self.mem_bw * self.read_efficiency
        wbw = self.mem_bw * self.write_efficiency
        out = []
        for tm, tn in self.tiles.get(dtype, self.tiles["default"]):
            tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
            for s in self.split_k:
                # split only to fill idle SMs, and never into slivers of k
                if s > 1 and (tiles * (s - 1) >= self.sms or k / s < self.split_k_min_depth):
                    continue
                depth = math.ceil(k / s / self.k_step) * self.k_step
                waves = math.ceil(tiles * s / self.sms)
                compute = waves * 2.0 * tm * tn * (depth + self.tile_overhead_k) / sm_rate
                partial = 0.0 if s == 1 else PARTIAL_BYTES * batch * m * n * s
                memory = (read + partial) / rbw + (write + partial) / wbw
                extra = self.split_k_s if s > 1 else 0.0
                total = self.launch_s + extra + max(compute, memory)
                out.append(Candidate((tm, tn), s, waves, compute, memory, total))
        return out

    def aligned(self, elem: float, m: int, n: int, k: int, layout: str) -> bool:
        return all(ld * elem % self.alignment_bytes == 0 for ld in leading_dims(m, n, k, layout))
