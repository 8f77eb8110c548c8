"""Parts `memory`, `copy` and `launch`.

- memory: the memory-bound kernels of a MoE layer at deepseek-v3's sizes (RMSNorm, LayerNorm,
  the residual add, RoPE, SwiGLU, the token permutation as `index_select` and its inverse as
  `index_add_`, the router's softmax and top-k in fp32, a device copy), each with the bytes
  sim.training.ops counts for it (read + written): achieved GB/s and the share of HBM
  bandwidth. Eager composites (RoPE: 5 kernels, SwiGLU: 2) move more than that count; a
  training framework's fused kernel moves it once. `kernels` in the row's note.
- copy: device-to-device copies (bytes read + written) and host copies, pinned and pageable
  (bytes copied; share of the preset's PCIe link class).
- launch: the host's time per eager op (`gpu.kernels.launch_s`): a loop of tiny ops timed on
  the host, with no synchronisation inside it, per op; and the same op followed by a
  synchronize (a launch's round trip).
"""

from __future__ import annotations

import time
from typing import Any

from .common import Ctx, Cut, bench, first_line, free, row, sync, write_rows
from .plan import LAUNCH_OPS, copy_cases, launch_loops, memory_cases, runs


def _kernel(ctx: Ctx, name: str, d: dict[str, int]) -> tuple[Any, tuple]:
    import torch
    import torch.nn.functional as F

    dev, bf = ctx.device, torch.bfloat16
    T, h, E, k, H, dd, FF, R = (d[x] for x in ("T", "h", "E", "k", "H", "d", "F", "R"))

    def rnd(*shape: int, dtype: Any = bf) -> Any:
        return torch.randn(*shape, device=dev, dtype=dtype)

    if name == "rms_norm":
        x, w = rnd(T, h), rnd(h)
        if hasattr(F, "rms_norm"):
            return (lambda: F.rms_norm(x, (h,), w)), (x, w)
        return (lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True)).to(bf) * w), (
            x,
            w,
        )
    if name == "layer_norm":
        x, w, b = rnd(T, h), rnd(h), rnd(h)
        return (lambda: F.layer_norm(x, (h,), w, b)), (x, w, b)
    if name == "residual_add":
        a, b, c = rnd(T, h), rnd(T, h), rnd(T, h)
        return (lambda: torch.add(a, b, out=c)), (a, b, c)
    if name == "rope":
        x, cos, sin = rnd(T, H, dd), rnd(T, 1, dd), rnd(T, 1, dd)

        def rope() -> Any:
            x1, x2 = x[..., : dd // 2], x[..., dd // 2 :]
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin

        return rope, (x, cos, sin)
    if name == "swiglu":
        g = rnd(R, 2 * FF)
        return (lambda: F.silu(g[:, :FF]) * g[:, FF:]), (g,)
    if name == "permute_index_select":
        x, out = rnd(T, h), torch.empty(R, h, device=dev, dtype=bf)
        idx = torch.randperm(R, device=dev) % T  # each token k times, scattered
        return (lambda: torch.index_select(x, 0, idx, out=out)), (x, out, idx)
    if name == "unpermute_index_add":
        y, out = rnd(R, h), torch.zeros(T, h, device=dev, dtype=bf)
        idx = torch.randperm(R, device=dev) % T
        return (lambda: out.index_add_(0, idx, y)), (y, out, idx)
    if name == "router_softmax_fp32":
        logits = rnd(T, E, dtype=torch.float32)
        return (lambda: torch.softmax(logits, dim=-1)), (logits,)
    if name == "router_topk_fp32":
        logits = rnd(T, E, dtype=torch.float32)
        return (lambda: torch.topk(logits, k, dim=-1)), (logits,)
    if name == "copy_d2d":
        a = rnd(T * h * 8)
        b = torch.empty_like(a)
        return (lambda: b.copy_(a)), (a, b)
    raise ValueError(f"unknown memory-bound kernel {name!r}")


def run_memory(ctx: Ctx) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    try:
        for m in memory_cases(ctx.dry):
            ctx.check()
            dtype = "fp32" if m.name.endswith("fp32") else "bf16"
            note = f"kernels: {m.kernels} (eager)" if m.kernels > 1 else "kernels: 1"
            try:
                fn, keep = _kernel(ctx, m.name, m.dims)
                t = bench(ctx, fn, runs(ctx.dry))
            except Cut:
                raise
            except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
                rows.append(
                    row(
                        ctx,
                        "memory",
                        m.name,
                        shape=m.shape,
                        dtype=dtype,
                        status="skipped",
                        note=first_line(e),
                    )
                )
                continue
            r = row(
                ctx,
                "memory",
                m.name,
                impl="torch eager",
                shape=m.shape,
                dtype=dtype,
                nbytes=m.nbytes,
                t=t,
                note=note,
            )
            rows.append({**r, "kernels": m.kernels})
            del fn, keep
            free(ctx)
    except Cut as e:
        rows.append(row(ctx, "memory", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/memory.csv", rows)
    ctx.shared["memory"] = rows
    return {"status": "ran", "rows": sum(r["status"] == "ok" for r in rows)}


def run_copy(ctx: Ctx) -> dict[str, Any]:
    import torch

    rows: list[dict[str, Any]] = []
    cuda = ctx.device.type == "cuda"
    pcie = ctx.preset.get("pcie_class")
    link = (f"link_classes.{pcie}.bw", ctx.preset.get("pcie_bw")) if pcie else ("link", None)
    try:
        for kind, size in copy_cases(ctx.dry):
            ctx.check()
            dev = torch.empty(size, dtype=torch.uint8, device=ctx.device)
            note = ""
            if kind == "d2d":
                other = torch.empty_like(dev)
                fn = lambda a=dev, b=other: b.copy_(a)  # noqa: E731
                nbytes, peak, note = 2 * size, None, "bytes read + written (copied: half)"
            else:
                pinned = "pinned" in kind and cuda
                host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
                if not cuda:
                    note = "on a CPU: a host memcpy, nothing pinned"
                if kind.startswith("h2d"):
                    fn = lambda a=dev, h=host, nb=pinned: a.copy_(h, non_blocking=nb)  # noqa: E731
                else:
                    fn = lambda a=dev, h=host, nb=pinned: h.copy_(a, non_blocking=nb)  # noqa: E731
                nbytes, peak = size, link
            t = bench(ctx, fn, runs(ctx.dry))
            rows.append(
                row(
                    ctx,
                    "copy",
                    kind,
                    impl="copy_",
                    shape=f"{size} B",
                    dtype="u8",
                    nbytes=nbytes,
                    t=t,
                    peak=peak,
                    note=note,
                )
            )
            del fn, dev
            free(ctx)
    except Cut as e:
        rows.append(row(ctx, "copy", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/copy.csv", rows)
    ctx.shared["copy"] = rows
    return {"status": "ran", "rows": sum(r["status"] == "ok" for r in rows)}


def _op(ctx: Ctx, name: str) -> tuple[Any, tuple]:
    import torch

    dev = ctx.device
    if name == "add_":
        x = torch.zeros(1, device=dev)
        return (lambda: x.add_(1.0)), (x,)
    if name == "mm_64":
        a, b = (torch.randn(64, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
        c = torch.empty_like(a)
        return (lambda: torch.mm(a, b, out=c)), (a, b, c)
    if name == "copy_4k":
        s = torch.empty(4096, dtype=torch.uint8, device=dev)
        d = torch.empty_like(s)
        return (lambda: d.copy_(s)), (s, d)
    if name == "fill_":
        x = torch.empty(1024, device=dev)
        return (lambda: x.fill_(0.5)), (x,)
    raise ValueError(f"unknown op {name!r}")


def run_launch(ctx: Ctx) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    n = launch_loops(ctx.dry)
    warm, reps = runs(ctx.dry)
    try:
        for name in LAUNCH_OPS:
            ctx.check()
            fn, keep = _op(ctx, name)
            host, total, trip = [], [], []
            for i in range(warm + reps):
                ctx.check()
                sync(ctx)
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                t1 = time.perf_counter()
                sync(ctx)
                t2 = time.perf_counter()
                t3 = time.perf_counter()
                for _ in range(max(1, n // 10)):
                    fn()
                    sync(ctx)
                t4 = time.perf_counter()
                if i >= warm:
                    host.append((t1 - t0) / n)
                    total.append((t2 - t0) / n)
                    trip.append((t4 - t3) / max(1, n // 10))

            def stats(xs: list[float]) -> tuple[float, float, float, int]:
                xs = sorted(xs)
                return xs[len(xs) // 2], xs[0], xs[-1], len(xs)

            th, tt, tr = stats(host), stats(total), stats(trip)
            rows.append(
                row(
                    ctx,
                    "launch",
                    name,
                    impl=f"eager loop of {n}",
                    layout="host",
                    t=th,
                    note=f"per op until the GPU finished too: {tt[0] * 1e6:.2f} us",
                )
            )
            rows.append(
                row(ctx, "launch", name, impl="op + synchronize", layout="round trip", t=tr)
            )
            del fn, keep
    except Cut as e:
        rows.append(row(ctx, "launch", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/launch.csv", rows)
    ctx.shared["launch"] = rows
    return {"status": "ran", "rows": sum(r["status"] == "ok" for r in rows)}
