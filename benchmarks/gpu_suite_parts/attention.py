"""Part `attention`: fused causal attention forward and backward through torch's
`scaled_dot_product_attention`, one backend at a time (FlashAttention, cuDNN, memory-efficient:
those this torch offers for the shape), at the model presets' head shapes and 1K-8K tokens
per sequence (8192 tokens per call). FLOPs are FlashAttention's count, as sim.training.ops
times the kernel: forward B*H*L^2*(d_qk + d_v) (causal: half of the full 2*B*H*L^2*(d_qk + d_v)),
backward 2.5 times that. Where a backend refuses the shape as it is, the way training code
gets it to run is measured instead and named in the row's note: values padded to d_qk (MLA on
FlashAttention, whose kernels take one head dim), or the key / value heads expanded to the
query heads (GQA where a kernel has no grouped heads)."""

from __future__ import annotations

import warnings
from typing import Any

from .common import Ctx, Cut, bench, first_line, free, row, write_rows
from .plan import ATTN_BACKENDS, Attn, attention_cases, runs


def _variants(c: Attn) -> list[tuple[bool, bool]]:
    """(pad v to d_qk, expand kv heads) in the order tried: as is first."""
    out = [(False, False)]
    if c.dv != c.dqk:
        out.append((True, False))
    if c.kv < c.heads:
        out.append((False, True))
        if c.dv != c.dqk:
            out.append((True, True))
    return out


def _caller(c: Attn, q: Any, k: Any, v: Any, pad: bool, expand: bool):
    import torch.nn.functional as F

    def call() -> Any:
        kk, vv = k, v
        if expand:
            kk = kk.repeat_interleave(c.heads // c.kv, dim=1)
            vv = vv.repeat_interleave(c.heads // c.kv, dim=1)
        if pad:
            vv = F.pad(vv, (0, c.dqk - c.dv))
        gqa = {"enable_gqa": True} if kk.shape[1] < c.heads else {}
        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **gqa)
        return o[..., : c.dv] if pad else o

    return call


def run(ctx: Ctx) -> dict[str, Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    rows: list[dict[str, Any]] = []
    dt = torch.bfloat16
    dev = ctx.device
    try:
        for c in attention_cases(ctx.dry):
            ctx.check()
            g = torch.Generator(device=dev).manual_seed(0)

            def rnd(*shape: int, g=g) -> Any:
                return torch.randn(*shape, device=dev, dtype=dt, generator=g).requires_grad_(True)

            q = rnd(c.batch, c.heads, c.seq, c.dqk)
            k = rnd(c.batch, c.kv, c.seq, c.dqk)
            v = rnd(c.batch, c.kv, c.seq, c.dv)
            for name in ATTN_BACKENDS:
                common = dict(impl=name, shape=c.shape, dtype="bf16")
                err = ""
                for pad, expand in _variants(c):
                    call = _caller(c, q, k, v, pad, expand)
                    note = ", ".join(
                        s
                        for s, on in (
                            (f"v padded to d_qk={c.dqk}", pad),
                            ("kv heads expanded to the query heads", expand),
                        )
                        if on
                    )
                    try:
                        with warnings.catch_warnings(), sdpa_kernel([backends[name]]):
                            warnings.simplefilter("ignore")
                            out = call()
                            t_f = bench(ctx, call, runs(ctx.dry))
                            dout = torch.randn_like(out)

                            def back(out=out, dout=dout, qkv=(q, k, v)) -> Any:
                                return torch.autograd.grad(out, qkv, dout, retain_graph=True)

                            t_b = bench(ctx, back, runs(ctx.dry))
                    except Cut:
                        raise
                    except (RuntimeError, NotImplementedError, ValueError) as e:
                        err = err or first_line(e)
                        continue
                    for lay, fl, tm in (("fwd", 1.0, t_f), ("bwd", 2.5, t_b)):
                        r = row(
                            ctx,
                            "attention",
                            c.model,
                            layout=lay,
                            flops=fl * c.flops_fwd,
                            t=tm,
                            note=note,
                            **common,
                        )
                        rows.append({**r, "seq": c.seq, "dqk": c.dqk})
                    del out, dout
                    break
                else:
                    for lay in ("fwd", "bwd"):
                        rows.append(
                            row(
                                ctx,
                                "attention",
                                c.model,
                                layout=lay,
                                status="skipped",
                                note=f"backend refused the shape: {err}",
                                **common,
                            )
                        )
            del q, k, v
            free(ctx)
    except Cut as e:
        rows.append(row(ctx, "attention", "(rest)", status="cut", note=str(e)))
    write_rows(ctx, "kernels/attention.csv", rows)
    ctx.shared["attention"] = rows
    ok = sum(r["status"] == "ok" for r in rows)
    if not ok:
        return {"status": "skipped", "reason": "no SDPA backend ran any shape"}
    return {"status": "ran", "rows": ok}
