"""One layer's forward (or backward) as the phases the pipeline times (`StepModel.phases`):
compute stretches cut by its EP collectives; its TP collectives add to the compute they sit
in (split and overlapped where the recipe overlaps them); the CP ring runs beside the
attention kernel, exposed where it is longer.

A recomputed layer runs its forward again before its backward, communication included:
Megatron-Core's full recomputation (`tensor_parallel.checkpoint` over whole layers) replays
the layer's TP all-gathers / reduce-scatters, CP ring and EP dispatch and combine, and the
`moe` module's (MoELayer's checkpointed forward: router, dispatch, experts, combine) replays
the EP collectives. The recomputed kernels are in the stretches' compute
(`StepModel._seconds`); their collectives are added here.
"""

from __future__ import annotations

from typing import Any

from sim.training.contention import ep_hold, gemm_after, tp_async, tp_loss
from sim.training.ops import ACT, Comm, LayerWork
from sim.training.pipeline import Phase
from sim.training.pipeline_kind import wgrad
from sim.training.recipe import comm_sms


def layer_phases(m: Any, lw: LayerWork, backward: bool) -> list[Phase]:
    """`m`: the StepModel (its GPU, timer, recipe and the totals it keeps)."""
    cuts = {c.after: c for c in lw.comm if c.dim == "ep"}
    serial = {c.after: c for c in lw.comm if c.dim != "ep"}
    segments: list[tuple[list[str], Any]] = [([], None)]
    for w in lw.work:
        segments[-1][0].append(w.name)
        if w.name in cuts:
            segments.append(([], cuts[w.name]))
    # whole layers recomputed replay every collective; the moe module its EP ones
    whole = backward and m.r.recompute_full and m.recomputed("", lw.layer)
    again = (
        [c for _, c in segments if c is not None]
        if backward and m.recomputed("moe", lw.layer)
        else []
    )
    out: list[Phase] = []
    for names, before in segments:
        if before is not None:
            out.append(_ep_phase(m, before, lw.layer))
        t = m._seconds(lw, names, backward)
        m.totals["compute_s"] += t
        for n in names:
            c = serial.get(n)
            if c is not None:
                t += _serial_seconds(m, lw, c, backward)
                if whole:
                    t += _serial_seconds(m, lw, c, False)
        what = "+".join(names[:1]) + ("…" if len(names) > 1 else "")
        wg = wgrad(m.gpu, lw, names) if backward else 0.0
        out.append(Phase("compute", t, what, lw.layer, wgrad=wg))
    if backward:
        # the recomputed forward's dispatch and combine run before the layer's backward
        out = [_ep_phase(m, c, lw.layer) for c in again] + out[::-1]
    return [p for p in out if p.seconds > 0 or p.stream == "comm"]


def _ep_phase(m: Any, c: Comm, layer: int) -> Phase:
    sec = m._ep_seconds(c)
    m.totals["ep_comm_s"] += sec
    hold = ep_hold(m.res, comm_sms(m.r), c.bytes, sec)
    return Phase("comm", sec, c.name, layer, c.kind, hold=hold)


def _serial_seconds(m: Any, lw: LayerWork, c: Comm, backward: bool) -> float:
    """Seconds a TP or CP collective adds to the compute it sits in."""
    if c.dim == "cp":  # per ring step, beside the attention kernel of that step
        nbytes = c.bytes * (2 if backward else 1)  # backward: K/V and their gradients
        steps = m.lay.cp - 1
        step_s = m.comm.seconds("send", "cp", nbytes / steps) * steps
        attn = m.gpu.seconds(next(w for w in lw.work if w.name == "core_attn"), backward)
        sec = max(0.0, step_s - attn)
        m.totals["cp_comm_s"] += sec
        return sec
    sec = tp_seconds(m, lw, c, backward)
    m.totals["tp_comm_s"] += sec
    return sec


def tp_parts(c: Comm, tp: int, backward: bool, q: float = 1.0) -> list[tuple[str, float]]:
    """(kind, bytes as `sim.training.comm` takes them) of the collectives a sequence-parallel
    TP collective stands for in a pass. Backward (Transformer Engine's Linear /
    LayerNormLinear `backward`): a column-parallel layer (forward all-gather of its input)
    gathers its input again for the weight gradient (only the shard was kept) and
    reduce-scatters the input gradient; a row-parallel one (forward reduce-scatter of its
    output) gathers the output gradient. `q`: the all-gathers' bytes over bf16's where the
    GEMM is quantized (TE quantizes before it gathers: `gather_along_first_dim(...,
    quantizer=...)`); reduce-scatters move bf16."""
    if not backward:
        return [(c.kind, c.bytes * (q if c.kind == "all_gather" else 1.0))]
    if c.kind == "all_gather":  # c.bytes: the shard
        return [("all_gather", c.bytes * q), ("reduce_scatter", c.bytes * tp)]
    return [("all_gather", c.bytes / tp * q)]  # c.bytes: the whole buffer


def tp_seconds(m: Any, lw: LayerWork, c: Comm, backward: bool) -> float:
    """Exposed seconds of a TP collective's pass. Without userbuffers the forward's are
    serial, and so is a row-parallel backward's gather; a column-parallel backward issues its
    gather asynchronously beside the dgrad GEMM and its reduce-scatter beside the wgrad GEMM
    (TE `gather_along_first_dim(..., async_op=True)`, `reduce_scatter_along_first_dim(...,
    async_op=True)`), exposed only where longer. With userbuffers (`tp_comm_overlap`) each is
    split into TP chunks, each beside the GEMM of the one before: the first chunk's transfer
    is exposed (Wang et al., ASPLOS'23); the others slow that GEMM (`sim.training.contention`)."""
    tp = m.lay.tp
    gemm = gemm_after(lw, c)
    q = m.p.wire_bytes / ACT if gemm.dtype != "bf16" else 1.0
    parts = [(k, b, m.comm.seconds(k, c.dim, b)) for k, b in tp_parts(c, tp, backward, q)]
    sec = sum(p[2] for p in parts)
    if m.r.tp_comm_overlap:
        return sec / tp + tp_loss(m, gemm, c, parts, backward)
    if backward and c.kind == "all_gather":
        return tp_async(m, gemm, parts)
    return sec
