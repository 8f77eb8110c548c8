"""The suite's parts in priority order (the last is dropped first), the shapes each measures
(full on a GPU, tiny in `--dry-run`), and each part's expected seconds on one H100 SXM,
estimated from the shared H100 measurements (../shared/reference/measurements/
h100-sxm-2026-11-23/: `h100_micro.csv`, `calibrate_output.txt`,
`validation_report_calibrated.md`) and, where those have no figure, from the `dgx-h100`
preset or an assumption named as one below. No torch here: `--help` and `--plan` need none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# -- rates of one H100 SXM, from the shared files ----------------------------------------------
H100 = {
    "bf16": 730e12,  # h100_micro.csv: large bf16 expert GEMMs 730-880 TFLOP/s (the low end)
    "fp16": 730e12,  # h100_micro.csv: fp16 rows as bf16
    "tf32": 346e12,  # h100_micro.csv: the gemm_fwd:tf32 row
    "fp32": 50e12,  # h100_micro.csv: fp32 rows 40-52 TFLOP/s
    "fp8": 1460e12,  # assumed: no FP8 row; dgx-h100 gpu.kernels.gemm.fp8 0.74 x 1,979
    "attn_fwd": 0.6 * 989e12,  # no attention row: dgx-h100 gpu.kernels.attention_fwd x peak
    "attn_bwd": 0.5 * 989e12,  # dgx-h100 gpu.kernels.attention_bwd x peak
    "hbm": 2.98e12,  # h100_micro.csv: d2d_copy of 1 GiB, 1.49 TB/s copied = 2.98 read + written
    "pcie": 55e9,  # h100_micro.csv: pinned d2h / h2d of 1 GiB
    "pageable": 20e9,  # assumed: no pageable row
    "op_s": 13e-6,  # h100_micro.csv: d2d_copy of 16 KiB-4 MiB, 12.8-13.1 us per eager op
}
STARTUP_S = 6.0  # assumed: one rank process (torch import, CUDA context, a 1-rank NCCL group)
CLI_S = 3.0  # assumed: a `moesim` command's own start-up (sim, numpy, pandas, torch imports)
# calibrate_output.txt: its measured phases took 0.275 + 0.001 + 0.017 + 0.009 + 1.044 + 0.114 s
CALIBRATE_S = 1.5
MEASURE_S = 0.02  # assumed: per measured row, its tensors' allocation, random fill and syncs
PART_S = 5.0  # assumed: a kernel part's first calls (cuBLAS / cuDNN handles, autotuning)
CUDNN_PLAN_S = 0.5  # assumed: cuDNN builds an attention graph per new shape and pass
VALIDATE_REPEATS = 3  # runs per validation graph on a GPU (median kept); dry run: 1
BLOCK_REPEATS = 3  # `moesim exec` runs of the block graph on a GPU; dry run: 1
LAYER_STRATEGIES = (  # the bf16 layer set of issue 27, fwd and fwd+bwd each
    "sequential",
    "pipelined:degree=4",
    "mpipemoe:degree=2,reuse=S1",  # offload
    "mpipemoe:degree=2,reuse=S4",  # recompute
)
# the dry run measures one of them (the offload's host copies; validate_big's dry run measures
# the plain layer) to stay within a minute on a busy 2-core machine; its calibration still
# builds every graph of the set (`--shapes-from` with `--strategies`), so a strategy the set
# names cannot rot unseen
LAYER_STRATEGIES_DRY = ("mpipemoe:degree=2,reuse=S1",)
# validate_big: the larger, GPU-bound layer of the H200's run 3 (twin_big.py), as run 3 ran it;
# the dry run measures its plain layer alone (its own calibration still builds all three)
BIG_STRATEGIES = ("sequential", "pipelined:degree=4", "pipelined:degree=8")
BIG_STRATEGIES_DRY = ("sequential",)
# one validation run (a fresh launch, its warm-ups, the graph) on the H200: the layer set's
# validate took 107.6, 109.7 and 117.1 s for 24 runs (reports/gpu-h200-2026-11-27/)
VALIDATE_RUN_S = 4.9


def runs(dry: bool) -> tuple[int, int]:
    """(warm-ups, timed repeats) of a kernel measurement."""
    return (1, 2) if dry else (3, 10)


# -- the shapes (sim/workload/architectures.yaml) --------------------------------------------
@dataclass(frozen=True)
class Attn:
    model: str
    heads: int
    kv: int
    dqk: int
    dv: int
    seq: int
    batch: int

    @property
    def flops_fwd(self) -> float:
        """Causal: each query sees half the keys (sim.training.ops, FlashAttention's count)."""
        return float(self.batch * self.heads * self.seq * self.seq * (self.dqk + self.dv))

    @property
    def shape(self) -> str:
        return (
            f"B={self.batch} L={self.seq} heads={self.heads} kv={self.kv} "
            f"d_qk={self.dqk} d_v={self.dv}"
        )


ATTN_BACKENDS = ("flash", "cudnn", "efficient")


def attention_cases(dry: bool) -> list[Attn]:
    # (model, query heads, key/value heads, qk head dim, v head dim)
    heads = [
        ("deepseek-v3 MLA", 128, 128, 192, 128),
        ("qwen3-235b-a22b GQA", 64, 4, 128, 128),
        ("llama3-70b GQA", 64, 8, 128, 128),
        ("gpt-oss-120b GQA", 64, 8, 64, 64),
    ]
    seqs, tokens = (1024, 2048, 4096, 8192), 8192
    if dry:
        heads = [(m, 4, 4 if kv == h else 2, q // 8, v // 8) for m, h, kv, q, v in heads]
        seqs, tokens = (32, 64), 64
    return [Attn(m, h, kv, q, v, s, tokens // s) for m, h, kv, q, v in heads for s in seqs]


@dataclass(frozen=True)
class Gemm:
    """y[m, n] = x[m, k] @ w[k, n] for each of `experts` experts (1: a plain GEMM)."""

    model: str
    name: str
    m: int
    n: int
    k: int
    experts: int = 1
    dtype: str = "bf16"

    @property
    def flops(self) -> float:
        return 2.0 * self.experts * self.m * self.n * self.k

    def dims(self, layout: str) -> tuple[int, int, int]:
        """(m, n, k) of the GEMM autograd runs in `layout`: fwd x w; dgrad dy w^T; wgrad x^T dy."""
        m, n, k = self.m, self.n, self.k
        return {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}[layout]

    def shape(self, layout: str = "fwd") -> str:
        m, n, k = self.dims(layout)
        e = f"E={self.experts} " if self.experts > 1 else ""
        return f"{e}m={m} n={n} k={k}"


LAYOUTS = ("fwd", "dgrad", "wgrad")
GROUPED_IMPLS = ("loop", "bmm", "grouped_mm")
LOCAL_EXPERTS = 8


def grouped_cases(dry: bool) -> list[Gemm]:
    """Each model's expert FFN (SwiGLU: fc1 hidden -> 2 x width, fc2 width -> hidden) with
    LOCAL_EXPERTS experts on the GPU and 512-8192 tokens per expert."""
    experts = [
        ("deepseek-v3", 7168, 2048),
        ("qwen3-235b-a22b", 4096, 1536),
        ("gpt-oss-120b", 2880, 2880),
        ("qwen3-30b-a3b", 2048, 768),
    ]
    tpe, E = (512, 1024, 2048, 4096, 8192), LOCAL_EXPERTS
    if dry:
        experts, tpe, E = [("tiny-a", 64, 32), ("tiny-b", 48, 16)], (8, 16), 2
    out = []
    for model, h, w in experts:
        for m in tpe:
            out.append(Gemm(model, "fc1", m, 2 * w, h, E))
            out.append(Gemm(model, "fc2", m, h, w, E))
    return out


GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32")


def gemm_cases(dry: bool) -> list[tuple[Gemm, str]]:
    """(GEMM, layout): a large square GEMM per dtype (the `gpu.kernels.gemm` shares) and the
    dense layers of a training step in bf16, in their three layouts."""
    s = 64 if dry else 8192
    out = [(Gemm("square", f"{s}^3", s, s, s, dtype=d), "fwd") for d in GEMM_DTYPES]
    if dry:
        dense = [Gemm("tiny", "fc1", 64, 96, 32)]
    else:
        dense = [
            Gemm("square", "4096^3", 4096, 4096, 4096),
            Gemm("llama3-70b tp8", "fc1", 8192, 2 * 28672 // 8, 8192),
            Gemm("deepseek-v3", "q_up", 8192, 128 * 192, 1536),
        ]
    return out + [(g, lay) for g in dense for lay in LAYOUTS]


FP8_SCALINGS = ("tensorwise", "rowwise")


def fp8_cases(dry: bool) -> list[Gemm]:
    """FP8 GEMMs as Hopper runs them (TN: both operands k-major): a square one and the
    deepseek-v3 expert GEMMs for 8192 tokens; the last one is grouped (`_scaled_grouped_mm`)."""
    if dry:
        return [
            Gemm("square", "64^3", 64, 64, 64, dtype="fp8"),
            Gemm("tiny", "fc1", 16, 64, 32, 2, "fp8"),
        ]
    return [
        Gemm("square", "8192^3", 8192, 8192, 8192, dtype="fp8"),
        Gemm("deepseek-v3", "fc1", 8192, 4096, 7168, dtype="fp8"),
        Gemm("deepseek-v3", "fc2", 8192, 7168, 2048, dtype="fp8"),
        Gemm("deepseek-v3", "fc1", 2048, 4096, 7168, LOCAL_EXPERTS, "fp8"),
    ]


@dataclass(frozen=True)
class Mem:
    name: str
    shape: str
    nbytes: float  # bytes read + written, as sim.training.ops counts the kernel
    kernels: int = 1  # eager kernels the op runs (1: one fused kernel)
    dims: dict = field(default_factory=dict)


def memory_cases(dry: bool) -> list[Mem]:
    """The memory-bound kernels of a deepseek-v3-sized MoE layer (T tokens, hidden h, top-k of
    E experts, 128 heads of 64 RoPE dims, expert width F), bf16 unless named."""
    T, h, E, k, H, d, F = (64, 32, 8, 2, 4, 8, 16) if dry else (8192, 7168, 256, 8, 128, 64, 2048)
    R = T * k  # routed rows
    dims = dict(T=T, h=h, E=E, k=k, H=H, d=d, F=F, R=R)
    return [
        Mem("rms_norm", f"T={T} h={h}", 2 * 2 * T * h, 1, dims),
        Mem("layer_norm", f"T={T} h={h}", 2 * 2 * T * h, 1, dims),
        Mem("residual_add", f"T={T} h={h}", 3 * 2 * T * h, 1, dims),
        Mem("rope", f"T={T} heads={H} d={d}", 2 * 2 * T * H * d, 5, dims),
        Mem("swiglu", f"rows={R} F={F}", 3 * 2 * R * F, 2, dims),
        Mem("permute_index_select", f"T={T} k={k} h={h}", 2 * 2 * R * h, 1, dims),
        Mem("unpermute_index_add", f"T={T} k={k} h={h}", 3 * 2 * R * h, 1, dims),
        Mem("router_softmax_fp32", f"T={T} E={E}", 2 * 4 * T * E, 1, dims),
        Mem("router_topk_fp32", f"T={T} E={E} k={k}", 4 * T * E + 12 * T * k, 1, dims),
        Mem("copy_d2d", f"{2 * T * h * 8} B", 2 * 2 * T * h * 8, 1, dims),
    ]


def copy_cases(dry: bool) -> list[tuple[str, int]]:
    sizes = (1 << 16, 1 << 20) if dry else (1 << 20, 1 << 26, 1 << 30)
    big = sizes[-1]
    out = [("d2d", s) for s in sizes]
    out += [(kind, s) for kind in ("h2d_pinned", "d2h_pinned") for s in sizes[-2:]]
    out += [(kind, big // 16) for kind in ("h2d_pageable", "d2h_pageable")]
    return out


LAUNCH_OPS = ("add_", "mm_64", "copy_4k", "fill_")


def launch_loops(dry: bool) -> int:
    """Eager ops per timed loop of the launch part."""
    return 50 if dry else 2000


# -- the parts --------------------------------------------------------------------------------
def _kernel_s(rows: Iterator[float]) -> float:
    """PART_S plus, per row, MEASURE_S and its warm-ups and repeats at the row's seconds."""
    warm, reps = runs(False)
    return PART_S + sum(MEASURE_S + (warm + reps) * max(t, H100["op_s"]) for t in rows)


def _attention_s() -> float:
    cases = attention_cases(False)
    rows = (
        t
        for c in cases
        for _ in ATTN_BACKENDS
        for t in (c.flops_fwd / H100["attn_fwd"], 2.5 * c.flops_fwd / H100["attn_bwd"])
    )
    return _kernel_s(rows) + 2 * len(cases) * CUDNN_PLAN_S


def _grouped_s() -> float:
    return _kernel_s(
        g.flops / H100["bf16"] for g in grouped_cases(False) for _ in LAYOUTS for _ in GROUPED_IMPLS
    )


def _gemm_s() -> float:
    return _kernel_s(g.flops / H100[g.dtype] for g, _ in gemm_cases(False))


def _fp8_s() -> float:
    return _kernel_s(g.flops / H100["fp8"] for g in fp8_cases(False) for _ in FP8_SCALINGS)


def _memory_s() -> float:
    return _kernel_s(m.nbytes / H100["hbm"] + m.kernels * H100["op_s"] for m in memory_cases(False))


def _copy_s() -> float:
    def rate(kind: str) -> float:
        return (
            H100["hbm"] / 2 if kind == "d2d" else H100["pageable" if "pageable" in kind else "pcie"]
        )

    # + pinning the host buffers: assumed ~1 s per GiB
    pinned = sum(s for kind, s in copy_cases(False) if "pinned" in kind) / 2**30
    return _kernel_s(s / rate(kind) for kind, s in copy_cases(False)) + pinned


def _launch_s() -> float:
    warm, reps = runs(False)
    return PART_S + len(LAUNCH_OPS) * (warm + reps) * launch_loops(False) * H100["op_s"] * 2


def _calibrate_s() -> float:
    return (
        CLI_S + 3 * STARTUP_S + CALIBRATE_S + 5.0
    )  # 3 rank launches; exact shapes + fit: assumed 5 s


def _validate_s() -> float:
    graphs = 2 * len(LAYER_STRATEGIES)  # fwd, fwd+bwd
    # each run a fresh launch; the graphs themselves take 1-7 ms (validation_report_calibrated.md)
    return CLI_S + graphs * VALIDATE_REPEATS * (STARTUP_S + 0.2) + graphs * 0.5


def _validate_big_s() -> float:
    """Its own calibrate, then 3 runs of each graph. Run 3 (H200): about 25 s and 90 s."""
    graphs = 2 * len(BIG_STRATEGIES)  # fwd, fwd+bwd
    return _calibrate_s() + CLI_S + graphs * VALIDATE_REPEATS * VALIDATE_RUN_S


def _block_s() -> float:
    return CLI_S + BLOCK_REPEATS * (CLI_S + STARTUP_S + 0.5) + CLI_S  # graph, exec xN, simulate


def _replay_s() -> float:
    return STARTUP_S + 9 * 0.05 + 2.0 + CLI_S + 2.0  # 9 block steps, trace export, replay


@dataclass(frozen=True)
class Part:
    name: str
    group: str
    what: str
    estimate: Callable[[], float]
    needs: tuple[str, ...] = ()

    @property
    def expected_s(self) -> int:
        return int(math.ceil(self.estimate()))


# Priority order: the first is the most valuable; a budget drops parts from the end. The twin's
# validation comes first (issue 27's criteria), then the kernels the cost models lack
# (attention, grouped GEMMs), the Kineto replay, the other kernels; last the figures the shared
# H100 files already have (GEMMs per dtype, copies). `env` always runs: it names the device.
PARTS: list[Part] = [
    Part(
        "env", "env", "device, driver, torch, CUDA, cuDNN, NCCL, clocks, SMs, memory", lambda: 5.0
    ),
    Part(
        "calibrate",
        "twin",
        "moesim calibrate (every dtype; the layer set's exact GEMMs)",
        _calibrate_s,
    ),
    Part(
        "validate",
        "twin",
        "moesim validate of the bf16 layer set: MAPE, worst, best",
        _validate_s,
        ("calibrate",),
    ),
    Part(
        "validate_big",
        "twin",
        "a larger, GPU-bound bf16 layer: its own calibrate; moesim validate",
        _validate_big_s,
    ),
    Part("attention", "kernels", "SDPA causal fwd + bwd, flash / cuDNN / efficient", _attention_s),
    Part(
        "grouped", "kernels", "expert GEMMs: loop, bmm, _grouped_mm; fwd, dgrad, wgrad", _grouped_s
    ),
    Part("replay", "replay", "Kineto trace of the executor's block step, moesim replay", _replay_s),
    Part("memory", "kernels", "RMSNorm, RoPE, SwiGLU, permute, top-k: achieved GB/s", _memory_s),
    Part("launch", "kernels", "host seconds per eager op (gpu.kernels.launch_s)", _launch_s),
    Part("fp8", "kernels", "torch._scaled_mm (and grouped) where the GPU has FP8", _fp8_s),
    Part(
        "block",
        "twin",
        "one transformer block (attention + MoE): exec vs simulate",
        _block_s,
        ("calibrate",),
    ),
    Part("gemm", "kernels", "GEMMs per dtype; dense training GEMMs fwd/dgrad/wgrad", _gemm_s),
    Part("copy", "kernels", "device-to-device and host copies (pinned, pageable)", _copy_s),
]
BY_NAME = {p.name: p for p in PARTS}
GROUPS = sorted({p.group for p in PARTS})
ALWAYS = ("env",)
TARGET_S = 480  # issue 27: the whole suite within 8 minutes on one H100 / H200


def select(names: list[str] | None) -> list[Part]:
    """The parts named (groups expand to their parts; what a part needs is added), in
    priority order; None: every part."""
    if not names:
        return list(PARTS)
    want: set[str] = set(ALWAYS)
    for n in names:
        want |= {p.name for p in PARTS if p.group == n} if n in GROUPS else {n}
    for n in list(want):
        want |= set(BY_NAME[n].needs)
    return [p for p in PARTS if p.name in want]


def plan(parts: list[Part], budget_s: float) -> tuple[list[Part], list[Part]]:
    """(to run, dropped): parts kept in priority order while their expected seconds fit the
    budget; from the first that does not fit, it and every later part are dropped (so the
    dropped parts are always the least valuable ones). ALWAYS parts run whatever the budget."""
    run, dropped, used = [], [], 0.0
    for p in parts:
        if p.name in ALWAYS:
            run.append(p)
            used += p.expected_s
            continue
        if dropped or used + p.expected_s > budget_s:
            dropped.append(p)
            continue
        run.append(p)
        used += p.expected_s
    return run, dropped
