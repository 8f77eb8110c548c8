"""Part `validate_big`: the twin validated on a larger, GPU-bound bf16 MoE layer, beside the
layer set's (part `validate`), whose small GEMMs leave the host's launches to decide the
graphs. The H200's run 3 did this by hand (reports/gpu-h200-2026-11-27/run3/big/: MAPE 9.4%,
every graph simulated 5-13% too slow); this part repeats it each run.

The layer has Mixtral 8x7B's dimensions (model 4096, hidden 14336, top-2), 16,384 tokens, 2
experts on the one GPU: its GEMMs run for milliseconds. It gets its own calibration
(`moesim calibrate --shapes-from` this layer, its own strategies), not a share of the layer
set's: the calibration's GEMM fit and jitter are fitted over every GEMM it profiles, so one
calibration over both layers would change the layer set's from the one runs 1-3 recorded,
and a budget that drops this part would still pay for its shapes. Then `moesim validate` of
sequential and pipelined r=4 and r=8, fwd and fwd+bwd (the dry run: sequential alone), 3
runs each, on the one-GPU topology of part `validate`.

Writes twin/big/ (layer.yaml, calibration.yaml with its measurements CSV, calibration.csv,
calibrate.log), twin/validate_big/ (the validation's report and traces), twin/validate_big.log
and twin/validate_big.csv (one row per graph, as twin/validate.csv).
"""

from __future__ import annotations

from typing import Any

import yaml

from . import twin
from .common import Ctx, write_text
from .plan import BIG_STRATEGIES, BIG_STRATEGIES_DRY

LAYER_BIG = dict(batch=8, seq_len=2048, model_dim=4096, hidden_dim=14336, experts_per_gpu=2)
# tiny, and not the layer set's dry shapes: this part profiles and validates its own
LAYER_BIG_DRY = dict(batch=2, seq_len=32, model_dim=96, hidden_dim=192, experts_per_gpu=2)
HEADER = (
    "# validate_big's layer (benchmarks/gpu_suite_parts/twin_big.py): the dimensions of\n"
    "# Mixtral 8x7B, 16,384 tokens, 2 experts on the one GPU; GPU-bound, where the layer set\n"
    "# (twin/layer.yaml) is decided by the host's launches. The H200's run 3: run3/big/.\n"
)


def run(ctx: Ctx) -> dict[str, Any]:
    f = twin.files(ctx)
    if skip := twin.no_topology(ctx, f):
        return skip
    big = ctx.out / "twin" / "big"
    doc = twin.config(ctx, False, LAYER_BIG_DRY if ctx.dry else LAYER_BIG)
    layer = write_text(ctx, "twin/big/layer.yaml", HEADER + yaml.safe_dump(doc, sort_keys=False))
    cal, why = twin.calibrate(
        ctx,
        layer,
        big / "calibration.yaml",
        BIG_STRATEGIES,
        big / "calibrate.log",
        "twin/big/calibration.csv",
    )
    if cal is None:
        return {"status": "failed", "reason": why}
    ctx.shared["calibration_big"] = cal
    strategies = BIG_STRATEGIES_DRY if ctx.dry else BIG_STRATEGIES
    out = ctx.out / "twin" / "validate_big"
    res = twin.validate(ctx, layer, cal["path"], strategies, out, "validate_big")
    if res.get("status") == "ran":
        bf16 = next((r for r in cal["gemm"] if r["dtype"] == "bf16"), None)
        ctx.shared["validate_big"]["gemm_bf16_tflops"] = bf16["tflops"] if bf16 else None
    return res
