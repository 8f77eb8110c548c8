"""Parts `grouped`, `gemm` and `fp8`: matrix products as training runs them.

- grouped: each model preset's expert FFN (fc1: hidden -> 2 x width, SwiGLU's gate and up;
  fc2: width -> hidden) on LOCAL_EXPERTS experts with 512-8192 tokens each, in the three
  layouts autograd runs (fwd x w; dgrad dy w^T; wgrad x^T dy, both from transposed views as
  autograd computes them, never materialised), three ways: a loop of per-expert
  `torch.matmul` (one GEMM per expert, as Transformer Engine's multi-stream path issues
  them, here on one stream), one `torch.bmm` (equal tokens per expert), and torch's grouped
  GEMM (`torch.nn.functional.grouped_mm` / `torch._grouped_mm`, one kernel for every expert,
  token counts as offsets) where this torch has it. A large bf16 GEMM measured first is the
  reference the grouped share (`gpu.kernels.grouped_gemm`) is taken against.
- gemm: a large square GEMM per dtype (bf16, fp16, TF32, fp32: the `gpu.kernels.gemm` shares)
  and dense training GEMMs in bf16 in their three layouts.
- fp8: `torch._scaled_mm` (E4M3, bf16 out; per-tensor and row-wise scales) and
  `torch._scaled_grouped_mm` (row-wise) where the GPU has FP8 tensor cores (compute
  capability 8.9+); skipped with the reason otherwise. Hopper's FP8 GEMMs take only the TN
  layout (both operands k-major), so the layouts of training are TN GEMMs of the same sizes.
"""

from __future__ import annotations

from typing import Any

from .common import Ctx, Cut, bench, first_line, free, row, write_rows
from .plan import (
    FP8_SCALINGS,
    GROUPED_IMPLS,
    LAYOUTS,
    Gemm,
    fp8_cases,
    gemm_cases,
    grouped_cases,
    runs,
)

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32"}


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def _rand(ctx: Ctx, shape: tuple[int, ...], dtype: Any) -> Any:
    import torch

    return torch.randn(*shape, device=ctx.device, dtype=dtype)


class _tf32:
    """TF32 tensor cores allowed (tf32) or refused (fp32) for the GEMMs inside."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self) -> None:
        import torch

        self.was = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.on

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = self.was


def _plain(ctx: Ctx, g: Gemm, layout: str, dtype: Any) -> tuple[Any, tuple]:
    """A launch of the GEMM in `layout` (operands as autograd holds them) and its tensors."""
    import torch

    x, w, dy = _rand(ctx, (g.m, g.k), dtype), _rand(ctx, (g.k, g.n), dtype), None
    if layout == "fwd":
        out = torch.empty(g.m, g.n, device=ctx.device, dtype=dtype)
        return (lambda: torch.matmul(x, w, out=out)), (x, w, out)
    dy = _rand(ctx, (g.m, g.n), dtype)
    if layout == "dgrad":
        out = torch.empty(g.m, g.k, device=ctx.device, dtype=dtype)
        return (lambda: torch.matmul(dy, w.t(), out=out)), (x, w, dy, out)
    out = torch.empty(g.k, g.n, device=ctx.device, dtype=dtype)
    return (lambda: torch.matmul(x.t(), dy, out=out)), (x, w, dy, out)


def run_gemm(ctx: Ctx) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    try:
        for g, layout in gemm_cases(ctx.dry):
            ctx.check()
            cpu = ctx.device.type != "cuda"
            note = "on a CPU: fp32 (no TF32)" if cpu and g.dtype == "tf32" else ""
            with _tf32(g.dtype == "tf32"):
                fn, keep = _plain(ctx, g, layout, _dtype(g.dtype))
                t = bench(ctx, fn, runs(ctx.dry))
            rows.append(
                row(
                    ctx,
                    "gemm",
                    f"{g.model} {g.name}",
                    impl="matmul",
                    layout=layout,
                    shape=g.shape(layout),
                    dtype=g.dtype,
                    flops=g.flops,
                    t=t,
                    note=note,
                )
            )
            del fn, keep
            free(ctx)
    except Cut as e:
        rows.append(row(ctx, "gemm", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/gemm.csv", rows)
    ctx.shared["gemm"] = rows
    return {"status": "ran", "rows": sum(r["status"] == "ok" for r in rows)}


def grouped_fn() -> Any:
    import torch

    f = getattr(torch.nn.functional, "grouped_mm", None)
    return f if f is not None else getattr(torch, "_grouped_mm", None)


def _grouped(ctx: Ctx, g: Gemm, layout: str, impl: str, t: dict[str, Any]) -> Any:
    """A launch of the experts' GEMMs in `layout` by `impl` over the tensors in `t`."""
    import torch

    E, m = g.experts, g.m
    x, w, dy = t["x"], t["w"], t["dy"]
    if layout == "fwd":
        out = t["y"]
        if impl == "loop":
            return lambda: [torch.matmul(x[e], w[e], out=out[e]) for e in range(E)]
        if impl == "bmm":
            return lambda: torch.bmm(x, w, out=out)
        gmm, x2, offs = grouped_fn(), x.view(E * m, g.k), t["offs"]
        return lambda: gmm(x2, w, offs=offs)
    if layout == "dgrad":
        out, wt = t["dx"], w.transpose(1, 2)
        if impl == "loop":
            return lambda: [torch.matmul(dy[e], wt[e], out=out[e]) for e in range(E)]
        if impl == "bmm":
            return lambda: torch.bmm(dy, wt, out=out)
        gmm, dy2, offs = grouped_fn(), dy.view(E * m, g.n), t["offs"]
        return lambda: gmm(dy2, wt, offs=offs)
    out, xt = t["dw"], x.transpose(1, 2)
    if impl == "loop":
        return lambda: [torch.matmul(xt[e], dy[e], out=out[e]) for e in range(E)]
    if impl == "bmm":
        return lambda: torch.bmm(xt, dy, out=out)
    # wgrad: x^T [k, E*m] times dy [E*m, n], grouped along the tokens -> [E, k, n]
    gmm, x2t, dy2, offs = grouped_fn(), x.view(E * m, g.k).t(), dy.view(E * m, g.n), t["offs"]
    return lambda: gmm(x2t, dy2, offs=offs)


def run_grouped(ctx: Ctx) -> dict[str, Any]:
    import torch

    rows: list[dict[str, Any]] = []
    bf16 = torch.bfloat16
    try:
        s = 64 if ctx.dry else 8192
        ref = Gemm("reference", f"{s}^3", s, s, s)
        fn, keep = _plain(ctx, ref, "fwd", bf16)
        rows.append(
            row(
                ctx,
                "grouped",
                "reference",
                impl="matmul",
                layout="fwd",
                shape=ref.shape(),
                dtype="bf16",
                flops=ref.flops,
                t=bench(ctx, fn, runs(ctx.dry)),
                note="one large GEMM: what the grouped share is of",
            )
        )
        del fn, keep
        for g in grouped_cases(ctx.dry):
            ctx.check()
            E, m = g.experts, g.m
            t = {
                "x": _rand(ctx, (E, m, g.k), bf16),
                "w": _rand(ctx, (E, g.k, g.n), bf16),
                "dy": _rand(ctx, (E, m, g.n), bf16),
                "y": torch.empty(E, m, g.n, device=ctx.device, dtype=bf16),
                "dx": torch.empty(E, m, g.k, device=ctx.device, dtype=bf16),
                "dw": torch.empty(E, g.k, g.n, device=ctx.device, dtype=bf16),
                "offs": torch.arange(1, E + 1, device=ctx.device, dtype=torch.int32) * m,
            }
            for layout in LAYOUTS:
                for impl in GROUPED_IMPLS:
                    common = dict(impl=impl, layout=layout, shape=g.shape(layout), dtype="bf16")
                    name = f"{g.model} {g.name}"
                    if impl == "grouped_mm" and grouped_fn() is None:
                        rows.append(
                            row(
                                ctx,
                                "grouped",
                                name,
                                status="skipped",
                                note="this torch has no grouped GEMM",
                                **common,
                            )
                        )
                        continue
                    try:
                        fn = _grouped(ctx, g, layout, impl, t)
                        tm = bench(ctx, fn, runs(ctx.dry))
                    except Cut:
                        raise
                    except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
                        rows.append(
                            row(
                                ctx, "grouped", name, status="skipped", note=first_line(e), **common
                            )
                        )
                        continue
                    r = row(ctx, "grouped", name, flops=g.flops, t=tm, **common)
                    rows.append({**r, "tokens_per_expert": m, "gemm": g.name})
            del t
            free(ctx)
    except Cut as e:
        rows.append(row(ctx, "grouped", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/grouped.csv", rows)
    ctx.shared["grouped"] = rows
    return {"status": "ran", "rows": sum(r["status"] == "ok" for r in rows)}


def fp8_unavailable(ctx: Ctx) -> str | None:
    import torch

    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return "this torch has no float8_e4m3fn / _scaled_mm"
    if ctx.device.type == "cuda":
        cap = torch.cuda.get_device_capability(ctx.device)
        if cap < (8, 9):
            return f"no FP8 tensor cores (compute capability {cap[0]}.{cap[1]} < 8.9)"
    return None


def _fp8_call(ctx: Ctx, g: Gemm, scaling: str) -> tuple[Any, tuple]:
    import torch

    f8, f32 = torch.float8_e4m3fn, torch.float32
    dev = ctx.device
    if g.experts == 1:
        a = _rand(ctx, (g.m, g.k), torch.bfloat16).to(f8)
        b = _rand(ctx, (g.n, g.k), torch.bfloat16).to(f8).t()  # column-major [k, n]
        if scaling == "tensorwise":
            sa, sb = torch.tensor(1.0, device=dev), torch.tensor(1.0, device=dev)
        else:
            sa = torch.ones(g.m, 1, device=dev, dtype=f32)
            sb = torch.ones(1, g.n, device=dev, dtype=f32)
        return (lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)), (
            a,
            b,
            sa,
            sb,
        )
    if scaling != "rowwise":
        raise NotImplementedError("grouped FP8 GEMMs take row-wise scales only")
    sgmm = getattr(torch, "_scaled_grouped_mm", None)
    if sgmm is None:
        raise NotImplementedError("this torch has no _scaled_grouped_mm")
    E, M = g.experts, g.experts * g.m
    a = _rand(ctx, (M, g.k), torch.bfloat16).to(f8)
    b = _rand(ctx, (E, g.n, g.k), torch.bfloat16).to(f8).transpose(1, 2)  # [E, k, n] col-major
    sa = torch.ones(M, device=dev, dtype=f32)
    sb = torch.ones(E, g.n, device=dev, dtype=f32)
    offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * g.m
    return (lambda: sgmm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16)), (a, b, sa, sb, offs)


def run_fp8(ctx: Ctx) -> dict[str, Any]:
    why = fp8_unavailable(ctx)
    if why:
        return {"status": "skipped", "reason": why}
    rows: list[dict[str, Any]] = []
    try:
        for g in fp8_cases(ctx.dry):
            for scaling in FP8_SCALINGS:
                ctx.check()
                impl = "_scaled_mm" if g.experts == 1 else "_scaled_grouped_mm"
                common = dict(impl=f"{impl} {scaling}", layout="TN", shape=g.shape(), dtype="fp8")
                name = f"{g.model} {g.name}"
                try:
                    fn, keep = _fp8_call(ctx, g, scaling)
                    t = bench(ctx, fn, runs(ctx.dry))
                except Cut:
                    raise
                except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
                    rows.append(
                        row(ctx, "fp8", name, status="skipped", note=first_line(e), **common)
                    )
                    continue
                rows.append(row(ctx, "fp8", name, flops=g.flops, t=t, **common))
                del fn, keep
            free(ctx)
    except Cut as e:
        rows.append(row(ctx, "fp8", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/fp8.csv", rows)
    ctx.shared["fp8"] = rows
    ok = sum(r["status"] == "ok" for r in rows)
    if not ok:
        reasons = sorted({r["note"] for r in rows if r["status"] == "skipped"})
        return {"status": "skipped", "reason": "; ".join(reasons)[:300] or "no FP8 GEMM ran"}
    return {"status": "ran", "rows": ok}
