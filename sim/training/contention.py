"""Compute beside an overlapped collective: the SMs the collective's kernel holds and the HBM
it streams, and what that costs the compute (issues 23 and 24).

A collective overlapped with compute runs as a kernel that holds SMs (NCCL: one CTA per
channel, resident until it ends) and streams HBM, so the compute beside it runs at

    s = Resources.sm_speed(k) * Resources.mem_factor(u)

(`sim.hardware.costs.resources`, fitted to an H100: shared/reference/measurements finding 6)
while the collective is resident. One phase: compute of C seconds alone beside a collective
resident T seconds from the phase's start takes T if C / s <= T, else C + T (1 - s)
(`phase_seconds`; s = 1 gives max(C, T)). The step model applies it where it says a
collective runs beside compute: FSDP's per-layer gathers and reduce-scatters (`fsdp`), the
distributed optimizer's overlapped gradient reduce-scatter and parameter all-gather (their
tasks hold `sms` and an `hbm_share` in the step's graph: the engine slows the compute
beside them while they run), TP communication where the recipe overlaps it (`tp_loss`), and
the EP dispatcher's kernels (`ep_hold`: with EP overlap, beside a merged pair's other pass).

How many SMs (NCCL 2.27-2.30 source, github.com/NVIDIA/nccl; NCCL_NVLS_ENABLE=0 on every run
but one: Megatron-Bridge scripts/performance/utils/executors.py PERF_ENV_VARS):
- a ring all-gather / reduce-scatter of tens to hundreds of MB runs on all of the
  communicator's channels (src/enqueue.cc topoGetAlgoInfo: the ring's `nc` starts at
  comm->nChannels and drops only for small messages), one CTA each. Channels: the ring
  graph's search channels doubled (src/graph/connect.cc, "Duplication should be complete
  now"); per GPU the presets' `gpu.resources.coll_sms` (NVLink domain) and `coll_sms_net`
  (across domains), each with its source there.
- with user-buffer registration (Megatron-FSDP `nccl_ub`) and NVLS enabled, a single-node
  all-gather runs NVLS on 4 CTAs and a reduce-scatter on 5 (src/register/coll_reg.cc: "for
  registered NVLS buffer, we only need 4/5 channels to saturate bandwidth";
  NCCL_CTA_POLICY=1 picks NVLS for registered buffers, src/enqueue.cc ncclGetAlgoInfo);
  Megatron-LM megatron/core/distributed/distributed_data_parallel_config.py `nccl_ub`: "SM
  usage of AG/RS: NVL 4 / 5, NVL+IB without SHARP 16 / 16, with SHARP 6 / 6".
- Transformer Engine's userbuffers (TP overlap): ring-exchange overlaps copy over the copy
  engine (transformer_engine/pytorch/module/base.py get_default_config: `use_ce: True`, one
  nominal SM), so they hold none; bulk and pipeline overlaps hold `num_sm` SMs
  (Megatron-Bridge src/megatron/bridge/training/comm_overlap.py, the recipes'
  tp_comm_overlap_cfg; TE's default 16 where the recipe names none).

HBM bytes per byte a GPU receives (what `mem_factor`'s u counts, read + write):
- NCCL ring over NVLink on Hopper and Blackwell: P2P write (src/graph/paths.cc: P2P read only
  on Ampere), so the peer writes each byte into this GPU's FIFO, the kernel reads it and
  writes it to the output (forwarding it from the same read): `RING_HBM` = 3. On 8 H100s
  (~370 GB/s received) that is ~0.33 of the HBM, on Blackwell's NVLink 5 ~0.3: above the
  fitted knee (0.063), so `mem_factor` applies (the resources docstring said below; it is not).
- NVLS: the switch writes each byte once into the receiver's buffer (`NVLS_HBM` = 1).
- userbuffers and copy-engine copies write into the peer's registered buffer: a read where
  sent and a write where received (`UB_HBM` = 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sim.hardware.costs.resources import Resources
from sim.training.pipeline import Phase

RING_HBM = 3.0  # NCCL ring (P2P write through a FIFO): HBM bytes per byte received
NVLS_HBM = 1.0  # NVLink SHARP with registered buffers
UB_HBM = 2.0  # TE userbuffers / copy engine, into the peer's registered buffer
NVLS_UB_SMS = {"all_gather": 4, "reduce_scatter": 5}  # NCCL coll_reg.cc, one NVLink domain


@dataclass(frozen=True)
class TpSms:
    """SMs Transformer Engine's userbuffers kernels hold per overlap (BulkOverlapCfg /
    PipelineOverlapCfg `num_sm`; ring exchange over the copy engine: 0)."""

    qkv_dgrad: int = 16  # all-gather of the input beside the dgrad GEMM (column-parallel)
    qkv_wgrad: int = 16  # reduce-scatter of the input gradient beside the wgrad GEMM
    fc1_dgrad: int = 16
    fc1_wgrad: int = 16
    fprop_rs: int = 16  # the row-parallel forward's reduce-scatter (pipeline; ring: 0)


# Megatron-Bridge src/megatron/bridge/training/comm_overlap.py (identical in r0.1.0, v0.2.0
# and v0.3.0, lines 108-198): the FP8 configs the recipes name; their fprop reduce-scatters
# are ring exchanges (RingExchangeOverlapCfg(num_sm=1, set_sm_margin=True): copy engine)
TP_OVERLAP = {
    "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192": TpSms(4, 24, 2, 4, 0),
    "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192": TpSms(4, 24, 2, 4, 0),
    "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192": TpSms(2, 24, 2, 2, 0),
    "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192": TpSms(8, 32, 2, 8, 0),
}
TE_DEFAULT = TpSms()  # TE base.py get_default_config: bulk and pipeline num_sm 16


def lost(compute: float, resident: float, speed: float) -> float:
    """Seconds `compute` seconds of work lose beside a collective resident for `resident`
    seconds from their start, at `speed` while it is: all of their slowdown if they end
    within it, else what its time takes from them."""
    if speed >= 1.0 or compute <= 0 or resident <= 0:
        return 0.0
    return min(compute * (1.0 / speed - 1.0), resident * (1.0 - speed))


def phase_seconds(compute: float, resident: float, speed: float) -> float:
    """One phase: T if C / s <= T, else C + T (1 - s); max(C, T) at s = 1."""
    return max(resident, compute + lost(compute, resident, speed))


def stretch(phases: list[Phase], resident: float, speed: float) -> list[Phase]:
    """A pass's phases beside a collective resident from its start: its compute phases
    lengthened evenly by what they lose, and the last phase by what the collective outlasts
    them."""
    compute = sum(ph.seconds for ph in phases if ph.stream == "compute")
    loss = lost(compute, resident, speed)
    out = list(phases)
    if loss > 0:
        f = 1.0 + loss / compute
        out = [replace(ph, seconds=ph.seconds * f) if ph.stream == "compute" else ph for ph in out]
    extra = max(0.0, resident - sum(ph.seconds for ph in out))
    if extra and out:
        out[-1] = replace(out[-1], seconds=out[-1].seconds + extra)
    return out


def received(kind: str, nbytes: float, n: int) -> float:
    """Bytes a GPU receives in a collective of `n` over `nbytes` (all-gather: its shard;
    reduce-scatter: the whole buffer; as `sim.training.comm` takes them)."""
    if n <= 1:
        return 0.0
    return nbytes * (n - 1) if kind == "all_gather" else nbytes * (n - 1) / n


@dataclass(frozen=True)
class Contention:
    """What overlapped collectives cost the compute beside them, for one run: the GPU's
    resource model, whether each DP dimension's groups span NVLink domains, whether FSDP's
    buffers are registered for NVLS (`nccl_ub` with NCCL_NVLS_ENABLE=1), TE's SMs."""

    res: Resources
    spans: dict[str, bool] = field(default_factory=dict)
    nvls_ub: bool = False
    tp: TpSms = TE_DEFAULT

    def coll(self, kind: str, dim: str) -> tuple[int, float]:
        """(SMs, HBM bytes per byte received) of an NCCL all-gather / reduce-scatter over
        the groups of `dim`."""
        if self.spans.get(dim, False):
            return self.res.coll_sms_net, RING_HBM
        if self.nvls_ub:
            return NVLS_UB_SMS[kind], NVLS_HBM
        return self.res.coll_sms, RING_HBM

    def speed(self, sms: int, hbm_bytes: float, seconds: float) -> float:
        """Speed of compute beside a kernel holding `sms` SMs that moves `hbm_bytes` of HBM
        in `seconds`."""
        if sms <= 0 and hbm_bytes <= 0:
            return 1.0
        return self.res.speed(sms, self.res.mem_share(hbm_bytes, seconds))

    def window(self, parts: list[tuple[str, str, float, int, float]]) -> tuple[float, float]:
        """(seconds, speed) of collectives run one after the other beside compute, each
        (kind, dim, bytes, group size, seconds): the speed their time averages (the work
        the compute does beside them over their time)."""
        total = sum(p[4] for p in parts)
        if total <= 0:
            return 0.0, 1.0
        done = 0.0
        for kind, dim, nbytes, n, sec in parts:
            sms, per_byte = self.coll(kind, dim)
            done += sec * self.speed(sms, per_byte * received(kind, nbytes, n), sec)
        return total, done / total

    def task_hold(self, parts: list[tuple[str, str, float, int, float]]) -> tuple[int, float]:
        """(SMs, HBM share) of a task that runs the collectives `parts` (kind, dim, bytes,
        group size, seconds) back to back: the most SMs any holds, the HBM they move over
        the task's time."""
        total = sum(p[4] for p in parts)
        if total <= 0:
            return 0, 0.0
        sms, hbm = 0, 0.0
        for kind, dim, nbytes, n, sec in parts:
            if sec <= 0:
                continue
            k, per_byte = self.coll(kind, dim)
            sms = max(sms, k)
            hbm += per_byte * received(kind, nbytes, n)
        return sms, self.res.mem_share(hbm, total) if sms else 0.0

    def tp_loss(
        self, kind: str, attn: bool, backward: bool, compute: float, hidden: float, u: float
    ) -> float:
        """Seconds a TP collective's overlapped part (`hidden` seconds, HBM share `u`) adds
        to the GEMM it hides behind (`compute` seconds, counted already): its slowdown and
        what the collective outlasts it by, per userbuffers overlap. A column-parallel
        layer's collective (forward all-gather) is a ring exchange forward and, backward, a
        bulk all-gather beside the dgrad and a bulk reduce-scatter beside the wgrad (half
        the time each); a row-parallel one's (forward reduce-scatter) is the fprop overlap
        forward and a ring exchange backward."""
        mem = self.res.mem_factor(u)
        if kind == "all_gather" and backward:
            k_d, k_w = (
                (self.tp.qkv_dgrad, self.tp.qkv_wgrad)
                if attn
                else (self.tp.fc1_dgrad, self.tp.fc1_wgrad)
            )
            return sum(
                _excess(compute / 2, hidden / 2, self.res.sm_speed(k) * mem) for k in (k_d, k_w)
            )
        k = self.tp.fprop_rs if kind == "reduce_scatter" and not backward else 0
        return _excess(compute, hidden, self.res.sm_speed(k) * mem)


def _excess(compute: float, resident: float, speed: float) -> float:
    """Seconds a GEMM of `compute` seconds (counted already) lengthens by with a collective
    resident beside it: its slowdown, and what the collective outlasts it by."""
    return phase_seconds(compute, resident, speed) - compute


def build(recipe: Any, lay: Any, topo: Any, place: Any) -> Contention | None:
    """The run's contention: its GPU's resources (`gpu.resources`), its DP groups' spans
    (rank r on GPU `place(r)`), its recipe's FSDP registration and TE overlap configs;
    None where the preset names no SMs for NCCL's collectives (`coll_sms`, `coll_sms_net`
    both 0): then overlapped collectives cost the compute nothing, as before."""
    res = Resources.build(topo.gpu, None)
    if res.coll_sms <= 0 and res.coll_sms_net <= 0:
        return None
    G = topo.gpus_per_node
    spans = {
        dim: len({place(r) // G for r in lay.groups(dim)[0]}) > 1
        for dim in ("dpcp", "edp")
        if lay.size(dim) > 1
    }
    other = (recipe.notes or {}).get("other") or {}
    if not isinstance(other, dict):
        other = {}
    nvls_ub = other.get("nccl_ub") is True and str(other.get("NCCL_NVLS_ENABLE", "0")) == "1"
    cfg = other.get("tp_comm_overlap_cfg")
    tp = TP_OVERLAP.get(cfg, TE_DEFAULT) if isinstance(cfg, str) else TE_DEFAULT
    return Contention(res, spans, nvls_ub, tp)


def fsdp(model: Any, progs: list[Any], works: list[list[list[Any]]]) -> None:
    """FSDP (ZeRO-3): every micro-batch gathers each layer's weights before its forward
    and its backward and reduce-scatters its gradients after the backward, prefetched
    beside the layer before: a chunk's pass takes the longer of its compute and that
    traffic, its compute slowed while the traffic runs (`model.contention`; None: not).
    With `fp8_param_gather` the weights are gathered in FP8, a byte each (Megatron-FSDP's
    DistributedDataParallelConfig: "keep the compute param in fp8 ... and perform the param
    all-gather in fp8"), as the distributed optimizer's gather (`dp_hold`)."""
    lay, r, comm = model.lay, model.r, model.comm
    con: Contention | None = model.contention
    n = lay.size("dpcp")
    for s, prog in enumerate(progs):
        for c in range(lay.vp):
            for passes, backward in ((prog.fwd, False), (prog.bwd, True)):
                parts: list[tuple[str, str, float, int, float]] = []
                for lw in works[s][c]:
                    dense, expert = model.params(lw)
                    p = dense + expert
                    shard = p * model.gather_bytes / lay.dpcp
                    parts.append(
                        ("all_gather", "dpcp", shard, n, comm.seconds("all_gather", "dpcp", shard))
                    )
                    if backward:
                        buf = p * r.grad_reduce_bytes
                        sec = comm.seconds("reduce_scatter", "dpcp", buf)
                        parts.append(("reduce_scatter", "dpcp", buf, n, sec))
                comm_s = sum(x[4] for x in parts)
                speed = con.window(parts)[1] if con is not None else 1.0
                if passes[c]:
                    passes[c] = stretch(passes[c], comm_s, speed)


def gemm_after(lw: Any, c: Any) -> Any:
    """The GEMM a TP collective feeds (the one it follows, else the next)."""
    i = [w.name for w in lw.work].index(c.after)
    return next((w for w in lw.work[i:] if w.kind in ("gemm", "grouped_gemm")), lw.work[i])


def tp_loss(
    model: Any, gemm: Any, c: Any, parts: list[tuple[str, float, float]], backward: bool
) -> float:
    """Seconds an overlapped TP collective's hidden part (all but its first of TP chunks)
    adds to the GEMM it hides behind (`gemm`: `gemm_after`): 0 without a contention model
    (`model.contention`). `parts`: (kind, bytes, seconds) of the collectives of the pass
    (`tp_parts`)."""
    con: Contention | None = model.contention
    sec = sum(p[2] for p in parts)
    if con is None or sec <= 0:
        return 0.0
    tp = model.lay.tp
    u = con.res.mem_share(UB_HBM * sum(received(k, b, tp) for k, b, _ in parts), sec)
    compute = model.gpu.seconds(gemm, backward)
    return con.tp_loss(c.kind, gemm.module == "attn", backward, compute, sec - sec / tp, u)


def tp_async(model: Any, gemm: Any, parts: list[tuple[str, float, float]]) -> float:
    """Exposed seconds of a column-parallel layer's backward collectives issued beside its
    GEMMs (no userbuffers): the input's all-gather beside the dgrad GEMM, the input
    gradient's reduce-scatter beside the wgrad GEMM (half the GEMM's backward each), each
    exposed where longer and slowing the GEMM by NCCL's SMs and HBM traffic while resident
    (`phase_seconds`; without a contention model, the longer of the two). `gemm`: the
    layer's GEMM (`gemm_after`)."""
    half = model.gpu.seconds(gemm, True) / 2
    con: Contention | None = model.contention
    tp = model.lay.tp
    out = 0.0
    for kind, nbytes, sec in parts:
        speed = 1.0
        if con is not None:  # a TP group: one NVLink domain, NCCL's ring
            speed = con.speed(con.res.coll_sms, RING_HBM * received(kind, nbytes, tp), sec)
        out += phase_seconds(half, sec, speed) - half
    return out


def dp_hold(model: Any, parts: list[tuple[str, str, float, int, float]]) -> tuple[int, float]:
    """(SMs, HBM share) the distributed optimizer's overlapped all-gather or reduce-scatter
    of a layer's parameters holds while it runs (`parts`: `StepModel.dp_parts`; its task in
    the step's graph: the engine slows the compute beside it): none without a contention
    model."""
    con: Contention | None = model.contention
    if con is None or sum(x[4] for x in parts) <= 0:
        return 0, 0.0
    return con.task_hold(parts)


def ep_hold(res: Resources | None, sms: int, nbytes: float, seconds: float) -> tuple[int, float]:
    """(SMs, HBM share) an EP dispatcher's kernel (DeepEP, HybridEP, NCCL's all-to-all)
    holds while it runs: its `sms` and the HBM it streams, each byte received written into a
    FIFO, read and written out (as NCCL's ring, `RING_HBM`); its task in the step's graph
    slows the compute beside it (a merged pair's other pass) only while it runs. None
    without the GPU's SM count (`res`)."""
    if res is None or not res.sms or sms <= 0:
        return 0, 0.0
    return sms, res.mem_share(RING_HBM * nbytes, seconds)
