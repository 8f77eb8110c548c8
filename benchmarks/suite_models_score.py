"""Scoring for `benchmarks/suite_models.py`: a recorded GPU-suite folder's kernel rows against
a topology preset's two GPU cost models.

1. The GEMM tile model (`gpu.gemm`, sim.hardware.costs.gemm), with the helpers
   `benchmarks/gpu_model_h100.py` scores it with (sim.hardware.costs.gemm_reference `predict`
   and `score`): every `kernels/gemm.csv` row, and the `kernels/grouped.csv` rows that are one
   batched GEMM (`bmm`, and the reference matmul) or E GEMMs back to back (`loop`). The suite's
   layouts are autograd's (benchmarks/gpu_suite_parts/gemm.py): fwd x @ w, dgrad dy @ w^T,
   wgrad x^T @ dy, operands as transposed views, with the row's shape already the GEMM's
   (m, n, k) in that layout; the model's names for them are gemm_reference.LAYOUT_OF_BENCH's
   ("nn", "nt", "tn").
2. The training step's kernel model (`gpu.kernels`, sim.training.kernels.GpuKernels): each row
   becomes the `Work` item sim.training.ops builds for that kernel (FLOPs, bytes, forward GEMM
   shape, experts) and is charged as sim.training.step charges a stretch of kernels that
   starts at a host sync (each timed call of the suite follows a synchronize): the longer of
   the kernels' GPU time (`GpuKernels.seconds` + `kernel_s` per kernel) and their launches at
   `launch_s`. Kernels are those the suite ran (1 per fused call, E for a loop, the eager
   count of a memory row's note). The training model does not tell layouts apart: dgrad and
   wgrad are each charged what the forward is (its backward is twice the forward).

Each row also gets the share of peak that would have made its charge exact (`implied`): the
figure to set beside the preset's one share per part.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from sim.core.errors import ConfigError
from sim.hardware.costs.gemm import GemmModel
from sim.hardware.costs.gemm_reference import LAYOUT_OF_BENCH, predict, score
from sim.training.kernels import GpuKernels
from sim.training.ops import ACT, DTYPE_BYTES, Work

FILES = ("gemm", "grouped", "attention", "memory", "fp8", "copy")
_KV = re.compile(r"([A-Za-z_]+)=(\d+)")
_KERNELS = re.compile(r"kernels: (\d+)")


# -- reading a suite folder -----------------------------------------------------------------
def read_env(folder: Path) -> dict[str, Any]:
    """env.json, else the summary.json's fields (both name the device and the preset)."""
    for name in ("env.json", "summary.json"):
        p = folder / name
        if p.is_file():
            return dict(json.loads(p.read_text()))
    return {}


def read_kernels(folder: Path) -> dict[str, pd.DataFrame]:
    """The `ok` rows of each kernels/<part>.csv there is, with the shape's fields as columns
    (m, n, k, E; B, L, heads, kv, d_qk, d_v; T, h, ...)."""
    out = {}
    for name in FILES:
        p = folder / "kernels" / f"{name}.csv"
        if not p.is_file():
            continue
        df = pd.read_csv(p)
        df = df[df["status"] == "ok"].reset_index(drop=True)
        dims = [dict((k, int(v)) for k, v in _KV.findall(str(s))) for s in df["shape"]]
        df = pd.concat([df, pd.DataFrame(dims, index=df.index)], axis=1)
        out[name] = df
    return out


def forward_dims(m: int, n: int, k: int, layout: str) -> tuple[int, int, int]:
    """The forward GEMM (x[m, k] @ w[k, n]) of a suite row whose shape is the GEMM autograd
    runs in `layout` (the inverse of gpu_suite_parts.plan.Gemm.dims)."""
    if layout == "dgrad":  # dy[m, n] @ w^T: shape (m, k, n)
        return m, k, n
    if layout == "wgrad":  # x^T @ dy: shape (k, n, m)
        return k, n, m
    return m, n, k


def _experts(r: Any) -> int:
    e = getattr(r, "E", None)
    return 1 if e is None or pd.isna(e) else int(e)


# -- 1. the GEMM tile model ------------------------------------------------------------------
def tile_rows(k: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The rows the tile model predicts, as gemm_reference.predict takes them, with `group`
    and `repeat` (GEMMs back to back: a loop's E)."""
    rows = []
    for r in k.get("gemm", pd.DataFrame()).itertuples():
        group = "square" if str(r.name).startswith("square") else "training shapes"
        rows.append((group, f"{r.name} {r.layout}", r, 1, 1))
    for r in k.get("grouped", pd.DataFrame()).itertuples():
        e = _experts(r)
        if r.impl == "matmul":  # the part's reference GEMM
            rows.append(("square", f"grouped part: {r.name} {r.layout}", r, 1, 1))
        elif r.impl in ("bmm", "loop", "grouped_mm"):
            batch, rep = (1, e) if r.impl == "loop" else (e, 1)
            rows.append((f"grouped {r.impl}", f"{r.name} {r.impl} {r.layout}", r, batch, rep))
    return pd.DataFrame(
        [
            {
                "group": g,
                "bench": bench,
                "dtype": str(r.dtype),
                "batch": batch,
                "m": int(r.m),
                "n": int(r.n),
                "k": int(r.k),
                "layout": LAYOUT_OF_BENCH[str(r.layout)],
                "seconds": float(r.median_s),
                "repeat": rep,
            }
            for g, bench, r, batch, rep in rows
        ],
        columns=[
            "group",
            "bench",
            "dtype",
            "batch",
            "m",
            "n",
            "k",
            "layout",
            "seconds",
            "repeat",
        ],
    )


TILE_GROUPS = ("square", "training shapes", "grouped bmm", "grouped loop", "grouped grouped_mm")


def score_tiles(model: GemmModel, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Each row predicted (a loop: `repeat` times one expert's GEMM, each with its launch) and
    the MAPE and worst row per group; dtypes the model has no efficiency for are left out."""
    have = rows["dtype"].isin(set(model.efficiency) & set(model.peak_flops))
    rows = rows[have]
    if rows.empty:
        return rows.assign(predicted=[], error=[]), {}
    scored = predict(model, rows)
    scored["predicted"] = scored["predicted"] * scored["repeat"]
    scored["error"] = scored["predicted"] / scored["seconds"] - 1.0
    scores = {g: score(scored[scored["group"] == g]).as_dict() for g in TILE_GROUPS}
    scores = {g: s for g, s in scores.items() if s["rows"]}
    scores["all"] = score(scored).as_dict()
    return scored, scores


# -- 2. the training step's kernel model -----------------------------------------------------
def _gemm_work(kind: str, dtype: str, m: int, n: int, k: int, e: int) -> Work:
    """A linear layer's GEMM as sim.training.ops._Builder.linear builds it (its cast aside)."""
    b = DTYPE_BYTES.get(dtype, 2.0)
    tokens = m * e
    nbytes = tokens * k * b + k * n * b * e + tokens * n * ACT
    return Work(kind, kind, 2.0 * tokens * k * n, nbytes, dtype, experts=e, shape=(m, n, k))


def _attention_work(r: Any) -> Work:
    """Fused causal attention as sim.training.ops builds `core_attn`."""
    T, heads, kv, d = r.B * r.L, r.heads, r.kv, r.d_qk + r.d_v
    flops = 2.0 * T * (r.L / 2) * heads * d
    io = ACT * T * (heads * d + kv * d)
    return Work("core_attn", "attention", flops, io, bwd=2.5, span=float(r.L), head_dim=int(r.d_qk))


def _charge(gpu: GpuKernels, w: Work, kernels: int, backward: bool) -> tuple[float, str]:
    """(seconds, what bounds them) as the step model charges `kernels` after a host sync."""
    core = gpu.seconds(w, backward)
    scale = w.bwd if backward else 1.0
    mem = w.bytes * scale / (gpu.mem_bw * gpu.memory_bound)
    t = gpu.stretch(core, kernels, kernels, synced=True)
    if t > gpu.stretch(core, kernels, kernels, synced=False):
        return t, "host"
    return t, "memory" if w.kind == "memory" or core <= mem else "compute"


def _implied(gpu: GpuKernels, w: Work, kernels: int, backward: bool, t: float) -> float:
    """The row's share (`_share_name`) that would make its GPU time exact, the rest of the
    charge kept (nan where the per-kernel floor alone reaches the measurement)."""
    scale = w.bwd if backward else 1.0
    left = t - kernels * gpu.kernel_s
    if left <= 0:
        return float("nan")
    if w.kind == "memory":
        return w.bytes * scale / (gpu.mem_bw * left)
    if w.kind == "attention":  # the preset's figure, at head dim 128 and its ref_len
        law = gpu.attention_shape
        shape = law.factor(w.span, w.head_dim, backward) if law else 1.0
        return w.flops * scale / (gpu.peak["bf16"] * shape * left)
    wave = gpu.wave_share(w)
    if w.shape is not None:  # the share at 8192 of K, as the preset's (gemm_k0)
        wave *= gpu.k_share(w.dtype, w.shape[2])
    if w.kind == "grouped_gemm":  # a share of the dtype's GEMM rate
        return w.flops * scale / (gpu.rate(w.dtype) * wave * left)
    gpu.rate(w.dtype)  # refuses a dtype the model has no GEMMs for
    peak = gpu.peak.get(w.dtype) or gpu.peak["bf16"] / 16  # GpuKernels.rate's fp32 rule
    return w.flops * scale / (peak * wave * left)


def _share_name(w: Work, backward: bool) -> str:
    """The `gpu.kernels` figure the row's time goes as 1 / of (fp32 GEMMs run at gemm.bf16
    of the fp32 peak: GpuKernels.rate)."""
    if w.kind == "memory":
        return "memory_bound"
    if w.kind == "attention":
        return "attention_bwd" if backward else "attention_fwd"
    if w.kind == "grouped_gemm":
        return "grouped_gemm"
    return "gemm.bf16" if w.dtype == "fp32" else f"gemm.{w.dtype}"


def _fastest(df: pd.DataFrame) -> pd.DataFrame:
    """The fastest row per case (name, shape, layout) over the impls / backends."""
    if df.empty:
        return df
    i = df.groupby(["name", "shape", "layout"], sort=False)["median_s"].idxmin()
    return df.loc[list(i)]


def kernel_cases(k: dict[str, pd.DataFrame]) -> list[tuple[str, Any, Work, int, bool]]:
    """(group, row, Work, kernels, backward) for every row the training model is scored on."""
    out: list[tuple[str, Any, Work, int, bool]] = []
    att = k.get("attention", pd.DataFrame())
    groups = [] if att.empty else [("attention (fastest)", _fastest(att))]
    for b in ("cudnn", "flash", "efficient") if not att.empty else ():
        groups.append((f"attention {b}", att[att["impl"] == b]))
    for g, df in groups:
        for r in df.itertuples() if not df.empty else []:
            out.append((g, r, _attention_work(r), 1, r.layout == "bwd"))
    grouped = k.get("grouped", pd.DataFrame())
    if not grouped.empty:
        experts_rows = grouped[grouped["impl"] != "matmul"]
        for r in _fastest(experts_rows).itertuples():
            e = _experts(r)
            m, n, kk = forward_dims(int(r.m), int(r.n), int(r.k), str(r.layout))
            w = _gemm_work("grouped_gemm", "bf16", m, n, kk, e)
            out.append(("grouped (best impl)", r, w, e if r.impl == "loop" else 1, False))
    for r in k.get("gemm", pd.DataFrame()).itertuples():
        m, n, kk = forward_dims(int(r.m), int(r.n), int(r.k), str(r.layout))
        out.append(("gemm (dense)", r, _gemm_work("gemm", str(r.dtype), m, n, kk, 1), 1, False))
    for r in k.get("fp8", pd.DataFrame()).itertuples():
        e = _experts(r)
        kind = "grouped_gemm" if e > 1 else "gemm"
        w = _gemm_work(kind, "fp8", int(r.m), int(r.n), int(r.k), e)
        out.append(("fp8 grouped" if e > 1 else "fp8", r, w, 1, False))
    for r in k.get("memory", pd.DataFrame()).itertuples():
        hit = _KERNELS.search(str(r.note))
        w = Work(str(r.name), "memory", bytes=float(r.bytes))
        out.append(("memory", r, w, int(hit.group(1)) if hit else 1, False))
    copy = k.get("copy", pd.DataFrame())
    for r in copy[copy["name"] == "d2d"].itertuples() if not copy.empty else []:
        out.append(("copy d2d", r, Work("d2d", "memory", bytes=float(r.bytes)), 1, False))
    return out


KERNEL_PARTS = (
    "attention (fastest)",
    "attention cudnn",
    "attention flash",
    "attention efficient",
    "grouped (best impl)",
    "gemm (dense)",
    "fp8",
    "fp8 grouped",
    "memory",
    "copy d2d",
)


def score_kernels(gpu: GpuKernels, k: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, list[str]]:
    """One row per scored kernel: measured, charged, error, bound, the share it uses and the
    share that would fit it; and the rows the model cannot charge (no rate for the dtype).
    The suite times short runs of each kernel: they are charged at the preset's short-run
    shares, without the sustained-power share a training step applies (`sustained`)."""
    gpu = dataclasses.replace(gpu, sustained=1.0)
    rows, skipped = [], []
    for group, r, w, kernels, bwd in kernel_cases(k):
        label = f"{group}: {r.name} {r.impl} {r.layout} {r.shape} {r.dtype}"
        try:
            charged, bound = _charge(gpu, w, kernels, bwd)
            implied = _implied(gpu, w, kernels, bwd, float(r.median_s))
            if bound == "host":  # its charge does not go as 1 / share
                implied = float("nan")
        except ConfigError:  # GpuKernels.rate: no share (or peak) for the dtype
            skipped.append(f"{label}: gpu.kernels.gemm has no {w.dtype} share")
            continue
        share = _share_name(w, bwd)
        rows.append(
            {
                "group": group,
                "name": str(r.name),
                "impl": str(r.impl),
                "layout": "" if pd.isna(r.layout) else str(r.layout),
                "shape": str(r.shape),
                "dtype": str(r.dtype),
                "kernels": kernels,
                "tokens": w.shape[0] if w.shape else float("nan"),  # a GEMM's forward m
                "measured_s": float(r.median_s),
                "charged_s": charged,
                "error": charged / float(r.median_s) - 1.0,
                "bound": bound,
                "share": share,
                "preset_share": _preset_share(gpu, share),
                "implied_share": implied,
            }
        )
    return pd.DataFrame(rows), skipped


def _preset_share(gpu: GpuKernels, share: str) -> float:
    if share.startswith("gemm."):
        return gpu.gemm.get(share.split(".", 1)[1], float("nan"))
    return float(getattr(gpu, share))


def single_share_floor(implied: list[float]) -> tuple[float, float]:
    """(share, MAPE %): the one share that fits the rows best, and the mean |error| it still
    leaves, for rows whose time goes as 1 / share (error s_i / s - 1 at share s, s_i each
    row's implied share). Sum |s_i - s| / s is monotone between the s_i: the best is one."""
    s = [x for x in implied if x == x and x > 0]
    if not s:
        return float("nan"), float("nan")
    best = min(s, key=lambda c: sum(abs(x / c - 1) for x in s))
    return best, 100 * sum(abs(x / best - 1) for x in s) / len(s)


def summarise(scored: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per part: rows, MAPE, mean signed error, worst row, rows the host's launches bound;
    per share it uses: the preset's figure, the range of the rows' implied shares, and the
    best a single share could do (the share and the MAPE it would still leave)."""
    out: dict[str, dict[str, Any]] = {}
    for g in KERNEL_PARTS:
        d = scored[scored["group"] == g] if not scored.empty else scored
        if d.empty:
            continue
        err = d["error"].abs()
        w = d.loc[err.idxmax()]
        shares = {}
        for name, ds in d.groupby("share", sort=True):
            best, floor = single_share_floor(list(ds["implied_share"]))
            shares[str(name)] = {
                "rows": int(ds["implied_share"].notna().sum()),  # host-bound rows aside
                "preset": float(ds["preset_share"].iloc[0]),
                "implied_min": float(ds["implied_share"].min()),
                "implied_max": float(ds["implied_share"].max()),
                "best_single": best,
                "best_single_mape_pct": floor,
            }
        out[g] = {
            "rows": len(d),
            "mape_pct": float(100 * err.mean()),
            "mean_error_pct": float(100 * d["error"].mean()),
            "worst_pct": float(100 * w["error"]),
            "worst": f"{w['name']} {w['impl']} {w['layout']} {w['shape']} {w['dtype']}".replace(
                "  ", " "
            ),
            "host_bound_rows": int((d["bound"] == "host").sum()),
            "shares": shares,
        }
    return out


def implied_by(scored: pd.DataFrame, group: str, keys: tuple[str, ...]) -> dict[str, float]:
    """The median implied share of a part's rows by shape fields (`name`, `layout` and
    `impl` are columns; others are read from the shape, e.g. "L", "d_qk", "m")."""
    d = scored[scored["group"] == group] if not scored.empty else scored
    if d.empty:
        return {}

    def label(r: Any) -> str:
        f = dict(_KV.findall(str(r.shape)))
        return " ".join(f"{k}={_text(getattr(r, k)) if k in d else f.get(k, '')}" for k in keys)

    med = d.assign(_k=[label(r) for r in d.itertuples()]).groupby("_k", sort=False)
    return {str(k): float(v) for k, v in med["implied_share"].median().items()}


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
