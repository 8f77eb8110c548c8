"""The table's precisions: the dtype a run's linear layers compute in, and what casting their
inputs to it costs (`sim.training.ops` charges the casts as memory-bound kernels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.training.recipe import Recipe


@dataclass(frozen=True)
class Precision:
    """How the linear layers compute: `gemm` dtype and the bytes a cast writes per element
    (both orientations) and reads besides the bf16 input (current scaling's amax pass)."""

    name: str
    gemm: str = "bf16"
    cast_write: float = 0.0
    cast_extra_read: float = 0.0
    # one scale per tensor (Transformer Engine's Float8Tensor): its column-wise use is a
    # transpose of the same bytes, which GPUs taking FP8 GEMMs of any layout do without
    per_tensor: bool = False
    scale_bytes: float = 0.0  # per element: the block scales one quantized copy carries

    @property
    def quantized(self) -> bool:
        return self.gemm != "bf16"

    @property
    def wire_bytes(self) -> float:
        """Bytes per element of one quantized copy, its scales included (what a quantized
        all-gather moves)."""
        return {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}[self.gemm] + self.scale_bytes

    def copies(self, any_layout: bool) -> int:
        """Quantized copies of a tensor: row- and column-wise data, or one for a per-tensor
        scaled FP8 tensor on a GPU whose FP8 GEMMs take any layout (`any_layout`: Transformer
        Engine's Float8Quantizer keeps no transpose where `nvte_is_non_tn_fp8_gemm_supported`,
        compute capability 10.x: transformer_engine/pytorch/csrc/quantizer.cpp
        `with_transpose`). MXFP8 and NVFP4 scale rows and columns apart: two on every GPU."""
        return 1 if self.per_tensor and any_layout else 2


# The table's precision names. "FP8" on Hopper and Blackwell before MXFP8 existed: per-tensor
# current scaling (the 25.09 tables print the other granularity in parentheses).
PRECISIONS: dict[str, Precision] = {
    "BF16": Precision("BF16"),
    "FP8-CS": Precision("FP8-CS", "fp8", 2.0, 2.0, per_tensor=True),
    "FP8": Precision("FP8", "fp8", 2.0, 2.0, per_tensor=True),
    "FP8-BLOCK": Precision("FP8-BLOCK", "fp8", 2.0 + 2.0 * 4 / 128, 0.0, scale_bytes=4 / 128),
    "MXFP8": Precision("MXFP8", "fp8", 2.0 + 2.0 / 32, 0.0, scale_bytes=1 / 32),  # E8M0 per 32
    "FP8-MX": Precision("FP8-MX", "fp8", 2.0 + 2.0 / 32, 0.0, scale_bytes=1 / 32),
    # an FP8 scale per 16 + the amax pass
    "NVFP4": Precision("NVFP4", "fp4", 2 * (0.5 + 1.0 / 16), 2.0, scale_bytes=1 / 16),
}


def precision_of(name: str, recipe: Recipe) -> Precision:
    """The precision a row's name and its recipe's FP8 recipe (the scaling) make."""
    by_recipe = {
        "blockwise": "FP8-BLOCK",
        "mxfp8": "MXFP8",
        "tensorwise": "FP8-CS",
        "nvfp4": "NVFP4",
        "delayed": "FP8-CS",
    }
    if name != "BF16" and recipe.fp8_recipe in by_recipe:
        return PRECISIONS[by_recipe[recipe.fp8_recipe]]
    return PRECISIONS[name]
