"""Layer-by-layer node order of Megatron-Core's schedules, on one rank's `Emitter`.

`forward`/`backward` run one micro-batch's layers alone; `merged` runs the forward of one
micro-batch and the backward of another together, layer by layer (forward layer k with
backward layer L-1-k), in the order `--overlap-moe-expert-parallel-comm` launches them:

    comm stream:    combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
    compute stream: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd

(`|`: overlapped with the node beside it). `mlp_bwd_dw` is launched after `dispatch_bwd`
(`--delay-wgrad-compute`): the experts' weight gradients fill the dispatch-backward window
instead of delaying its launch. A backward with `defer` (zero-bubble) leaves its weight
gradients to a later `weights` call.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.strategies.megatron_ep.nodes import Emitter

Deferred = list[Callable[[], object]]


def forward(em: Emitter, mb: int, layers: int, x: list[str]) -> list[str]:
    """Every layer's forward; returns the output's producers."""
    for lid in range(layers):
        x = _fwd_layer(em, mb, lid, x)
    return x


def _fwd_layer(em: Emitter, mb: int, lid: int, x: list[str]) -> list[str]:
    a = em.attn_fwd(mb, lid, x)
    d = em.dispatch_fwd(mb, lid, a)
    sh = em.shared_fwd(mb, lid, a)
    c = em.combine_fwd(mb, lid, em.mlp_fwd(mb, lid, d, a))
    return [c] + ([sh] if sh else [])


def _dw(em: Emitter, mb: int, lid: int, mlp: str, ab: str, sh: str | None) -> Deferred:
    out: Deferred = [lambda: em.mlp_bwd_dw(mb, lid, [mlp]), lambda: em.attn_bwd_dw(mb, lid, [ab])]
    if sh is not None:
        out.append(lambda: em.shared_bwd_dw(mb, lid, [sh]))
    return out


def backward(
    em: Emitter, mb: int, layers: int, g: list[str], defer: Deferred | None = None
) -> list[str]:
    """Every layer's backward, last layer first; weight gradients run in place, or are
    appended to `defer` (zero-bubble's W) when it is given."""
    for lid in reversed(range(layers)):
        cb = em.combine_bwd(mb, lid, g)
        sh = em.shared_bwd(mb, lid, g)
        m = em.mlp_bwd(mb, lid, cb)
        db = em.dispatch_bwd(mb, lid, m)
        if defer is None:
            em.mlp_bwd_dw(mb, lid, [m])
        ab = em.attn_bwd(mb, lid, [db] + ([sh] if sh else []))
        if defer is None:
            em.attn_bwd_dw(mb, lid, [ab])
            if sh is not None:
                em.shared_bwd_dw(mb, lid, [sh])
        else:
            defer += _dw(em, mb, lid, m, ab, sh)
        g = [ab]
    return g


def merged(
    em: Emitter,
    f_mb: int,
    b_mb: int,
    layers: int,
    x: list[str],
    g: list[str],
    em_b: Emitter | None = None,
) -> tuple[list[str], list[str]]:
    """Forward of `f_mb` merged with backward of `b_mb` (module docstring); returns the
    forward's output producers and the backward's input-gradient producers. `em_b`: the
    backward's emitter when it differs (DualPipe pairs chunks of two pipeline directions)."""
    eb = em if em_b is None else em_b
    for k in range(layers):
        lf, lb = k, layers - 1 - k
        cb = eb.combine_bwd(b_mb, lb, g)
        a = em.attn_fwd(f_mb, lf, x)
        d = em.dispatch_fwd(f_mb, lf, a)
        shf = em.shared_fwd(f_mb, lf, a)
        shb = eb.shared_bwd(b_mb, lb, g)
        m_b = eb.mlp_bwd(b_mb, lb, cb)
        db = eb.dispatch_bwd(b_mb, lb, m_b)
        eb.mlp_bwd_dw(b_mb, lb, [m_b])
        c = em.combine_fwd(f_mb, lf, em.mlp_fwd(f_mb, lf, d, a))
        ab = eb.attn_bwd(b_mb, lb, [db] + ([shb] if shb else []))
        eb.attn_bwd_dw(b_mb, lb, [ab])
        if shb is not None:
            eb.shared_bwd_dw(b_mb, lb, [shb])
        x, g = [c] + ([shf] if shf else []), [ab]
    return x, g


def weights(defer: Deferred) -> None:
    """Zero-bubble's W: run the oldest deferred chunk's weight gradients."""
    for fn in defer:
        fn()
