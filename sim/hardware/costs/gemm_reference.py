"""Measured GEMM times to score a GPU's GEMM model (sim.hardware.costs.gemm) against.

Reads the two GEMM files of a measurement folder such as
../shared/reference/measurements/h100-sxm-2026-11-23/:

- `h100_micro.csv` (made by `h100_micro.py` beside it, on any CUDA GPU): bench
  `gemm_fwd|gemm_dgrad|gemm_wgrad:MODEL`, dtype, batch, m, n, k, ..., t_med_s. The three
  benches are the layouts autograd runs: forward "nn", dgrad "nt", wgrad "tn";
- `gemm_layout.txt` (from `gemm_layout.py`): the expert wgrad GEMM with its first operand
  materialised as [E, M, C] ("nn", leading dimension C) or as a transposed view ("tn"), and
  the forward GEMM, per (E, C, M, H).

Each row is tagged with the `group` it belongs to (the MoE model of h100_micro.csv, or
`layout` for gemm_layout.txt), whether its operands are `aligned` (leading dimensions a
multiple of 16 bytes), and `source`. HELD_OUT names the rows that no parameter of `dgx-h100`'s
model was fitted to.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.hardware.costs.gemm import DTYPE_BYTES, GemmModel, leading_dims

LAYOUT_OF_BENCH = {"fwd": "nn", "dgrad": "nt", "wgrad": "tn"}
HELD_OUT_GROUPS = ("gpt-moe-1.3b", "layout")  # not seen by any fitting of dgx-h100's gemm
_LINE = re.compile(
    r"E=(\d+) C=(\d+) M=(\d+) H=(\d+): materialised \S+ ([\d.]+) ms .*?"
    r"transposed view ([\d.]+) ms .*?fwd \S+ ([\d.]+) ms"
)


def load(folder: str | Path) -> pd.DataFrame:
    """Columns: group, source, bench, dtype, batch, m, n, k, layout, aligned, seconds."""
    folder = Path(folder)
    rows = []
    micro = pd.read_csv(folder / "h100_micro.csv")
    for r in micro[micro["bench"].str.startswith("gemm_")].itertuples():
        step, group = str(r.bench)[len("gemm_") :].split(":", 1)
        rows.append(
            {
                "group": group,
                "source": "h100_micro.csv",
                "bench": str(r.bench),
                "dtype": str(r.dtype),
                "batch": int(r.batch),
                "m": int(r.m),
                "n": int(r.n),
                "k": int(r.k),
                "layout": LAYOUT_OF_BENCH[step],
                "seconds": float(r.t_med_s),
            }
        )
    layout_txt = folder / "gemm_layout.txt"
    if layout_txt.is_file():
        for line in layout_txt.read_text().splitlines():
            hit = _LINE.search(line)
            if not hit:
                continue
            e, c, m, h = (int(v) for v in hit.groups()[:4])
            mat, view, fwd = (float(v) * 1e-3 for v in hit.groups()[4:])
            base = {"group": "layout", "source": "gemm_layout.txt", "dtype": "bf16", "batch": e}
            rows += [
                {
                    **base,
                    "bench": f"wgrad_materialised C={c}",
                    "m": m,
                    "n": h,
                    "k": c,
                    "layout": "nn",
                    "seconds": mat,
                },
                {
                    **base,
                    "bench": f"wgrad_view C={c}",
                    "m": m,
                    "n": h,
                    "k": c,
                    "layout": "tn",
                    "seconds": view,
                },
                {
                    **base,
                    "bench": f"fwd C={c}",
                    "m": c,
                    "n": h,
                    "k": m,
                    "layout": "nn",
                    "seconds": fwd,
                },
            ]
    df = pd.DataFrame(rows)
    df["aligned"] = [
        all(ld * DTYPE_BYTES[r.dtype] % 16 == 0 for ld in leading_dims(r.m, r.n, r.k, r.layout))
        for r in df.itertuples()
    ]
    df["held_out"] = df["group"].isin(HELD_OUT_GROUPS)
    return df


@dataclass
class Score:
    rows: int
    mape_pct: float
    worst_pct: float
    worst: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "mape_pct": self.mape_pct,
            "worst_pct": self.worst_pct,
            "worst": self.worst,
        }


def predict(model: GemmModel, df: pd.DataFrame) -> pd.DataFrame:
    """df with the model's `predicted` seconds and the relative `error` (predicted / measured
    - 1)."""
    pred = [model.seconds(r.dtype, r.batch, r.m, r.n, r.k, r.layout) for r in df.itertuples()]
    out = df.assign(predicted=pred)
    return out.assign(error=out["predicted"] / out["seconds"] - 1.0)


def score(scored: pd.DataFrame) -> Score:
    """MAPE and the worst row of rows that `predict` scored."""
    if scored.empty:
        return Score(0, math.nan, math.nan, "")
    err = scored["error"].abs()
    i = err.idxmax()
    r = scored.loc[i]
    name = (
        f"{r['bench']} {r['dtype']} b={r['batch']} m={r['m']} n={r['n']} k={r['k']} "
        f"({100 * r['error']:+.1f}%)"
    )
    return Score(len(scored), float(100 * err.mean()), float(100 * err.max()), name)
