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

from sim.training.contention import ep_hold, tp_loss
from sim.training.ops import Comm, LayerWork
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
    kind = (c.bwd_kind or c.kind) if backward else c.kind
    nbytes = c.bytes * (2 if backward else 1)
    if c.dim == "cp":  # per ring step, beside the attention kernel of that step
        steps = m.lay.cp - 1
        step_s = m.comm.seconds("send", "cp", nbytes / steps) * steps
        attn = m.gpu.seconds(next(w for w in lw.work if w.name == "core_attn"), backward)
        sec = max(0.0, step_s - attn)
        m.totals["cp_comm_s"] += sec
        return sec
    sec = m.comm.seconds(kind, c.dim, nbytes)
    if m.r.tp_comm_overlap:
        # split into TP chunks, each beside the GEMM of the one before: the first chunk's
        # transfer is exposed (Wang et al., ASPLOS'23); the others slow that GEMM
        # (`sim.training.contention`)
        loss = tp_loss(m, lw, c, kind, nbytes, sec, backward)
        sec = sec / m.lay.tp + loss
    m.totals["tp_comm_s"] += sec
    return sec
