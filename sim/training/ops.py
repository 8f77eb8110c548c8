"""What one GPU runs for one micro-batch of a training step: the kernels of each transformer
layer, the embedding and the LM head, with the collectives between them.

A layer is a list of `Work` items in forward order. An item's FLOPs and bytes are its
forward's on one GPU (weights split by TP or ETP, tokens by CP, and by TP where sequence
parallelism shards them); its backward does `bwd` times the forward's work (2 for a GEMM:
data and weight gradients; 2.5 for fused attention, FlashAttention's count). `module` names
the part Megatron-Core's `--recompute-modules` can recompute. `launches` counts the
operations the host issues for an item in its forward (kernels and the bookkeeping ops
beside them: a quantized GEMM's scale update, the router's losses, the dispatcher's count
exchange), estimated from Megatron-Core's and Transformer Engine's module code paths, not
measured; its backward issues `bwd` times as many. `Comm` items are the collectives the
layer issues (per GPU bytes, as `sim.training.comm` times them), with the work item they
follow.

Precisions: the linear layers of the blocks run in the run's GEMM dtype (bf16, fp8, fp4),
paying a cast of their inputs (and of the gradients in backward) as memory-bound kernels: a
row-wise and a column-wise copy (Hopper's FP8 GEMMs take only TN layouts and MXFP8 / NVFP4
scale both orientations), plus one more read for the amax of per-tensor current scaling.
Attention's core, the router (in the provider's `moe_router_dtype`: fp32 or the input's bf16),
the embedding and the LM head stay unquantized (Transformer Engine quantizes only its linear
layers). Chains Megatron-Core runs as eager kernels (GPT-OSS's clamp, expert biases and YaRN
RoPE; FP8 padding) are `sim.training.eager`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.training import eager
from sim.training.layout import Layout
from sim.training.precision import PRECISIONS, Precision
from sim.workload.architectures import Architecture

ACT = 2  # bytes of a bf16 activation element
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "fp4": 0.5}


@dataclass(frozen=True)
class Work:
    name: str
    kind: str  # gemm | grouped_gemm | attention | memory
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"
    launches: int = 1
    bwd: float = 2.0
    module: str = ""
    experts: int = 1  # grouped GEMM: experts in the group
    saved: float | None = None  # bytes kept for the backward; None: half its traffic (input)
    shape: tuple[float, int, int] | None = None  # a GEMM's (rows per expert, n, k)
    saved_min: float = 0.0  # what it keeps when the kernels making its inputs are recomputed
    bwd_launches: int | None = None  # its backward's host ops where not `bwd` x `launches`
    span: float = 0.0  # attention: the causal sequence its key loop equals (0: unknown)
    head_dim: int = 0  # attention: the query/key head dim (0: unknown)

    @property
    def kept(self) -> float:
        return self.bytes / 2 if self.saved is None else self.saved


@dataclass(frozen=True)
class Comm:
    name: str
    kind: str  # all_gather | reduce_scatter | all_to_all | send
    dim: str  # the layout dimension whose groups run it
    bytes: float  # per GPU, as sim.training.comm takes it
    after: str  # the Work item it follows in forward


@dataclass
class LayerWork:
    layer: int
    work: list[Work] = field(default_factory=list)
    comm: list[Comm] = field(default_factory=list)
    moe: bool = False


class _Builder:
    def __init__(
        self,
        a: Architecture,
        lay: Layout,
        prec: Precision,
        imbalance: float = 1.0,
        chunk_sort: bool = False,
        probs_fp32: bool = False,
        fp8_pad: bool = False,
    ):
        self.a, self.lay, self.p = a, lay, prec
        self.chunk_sort = chunk_sort
        self.probs_fp32, self.fp8_pad = probs_fp32, fp8_pad
        # the hottest GPU's routed rows over the mean (1: balanced routing): every all-to-all
        # of an EP group waits for it, so its rows set the pace of the MoE part
        self.imbalance = imbalance
        self.T = lay.mbs * lay.seq // lay.cp  # tokens of this GPU's attention
        self.Ts = self.T // lay.tp if lay.tp > 1 else self.T  # sequence-parallel shard
        self.out = LayerWork(-1)

    def add(self, w: Work) -> None:
        self.out.work.append(w)

    def mem(
        self, name: str, nbytes: float, module: str, launches: int = 1, saved: float | None = None
    ) -> None:
        """A memory-bound kernel; it keeps its input (half its traffic) unless `saved` says."""
        self.add(Work(name, "memory", bytes=nbytes, launches=launches, module=module, saved=saved))

    def chain(self, name: str, c: eager.Chain, module: str, saved: float = 0.0) -> None:
        """An eager kernel chain (`sim.training.eager`): forward and backward as counted."""
        w = Work(name, "memory", bytes=c.fwd_bytes, launches=c.fwd_kernels, module=module)
        bwd = c.bwd_bytes / c.fwd_bytes if c.fwd_bytes else 0.0
        self.add(replace(w, bwd=bwd, saved=saved, bwd_launches=c.bwd_kernels))

    def linear(
        self,
        name: str,
        tokens: float,
        k: int,
        n: int,
        module: str,
        quantize: bool = True,
        experts: int = 1,
        gathered: bool = False,
    ) -> None:
        """y[tokens, n] = x[tokens, k] @ w[k, n] (n, k already split), with its input's cast.
        It keeps its input for the weight gradient; `gathered`: the input is the all-gather
        of a sequence-parallel shard, and only the shard is kept (gathered again backward)."""
        dtype = self.p.gemm if quantize else "bf16"
        if quantize and self.p.quantized:  # grouped: one cast per expert's slice
            elems = tokens * k
            cast = elems * (ACT + self.p.cast_write + self.p.cast_extra_read)
            self.mem(f"{name}.cast", cast, module, launches=experts, saved=0.0)
        e = DTYPE_BYTES[dtype]
        kept = tokens / self.lay.tp if gathered and self.lay.tp > 1 else tokens
        nbytes = tokens * k * e + k * n * e * experts + tokens * n * ACT
        kind = "grouped_gemm" if experts > 1 else "gemm"
        # Transformer Engine's grouped GEMM issues one GEMM per expert (multi-stream cuBLAS)
        ops = experts * (2 if dtype != "bf16" else 1)  # + the scale / amax update per GEMM
        self.add(
            Work(
                name,
                kind,
                2.0 * tokens * k * n,
                nbytes,
                dtype,
                launches=ops,
                module=module,
                experts=experts,
                saved=kept * k * e,
                shape=(tokens / experts, n, k),
            )
        )

    def tp_gather(self, name: str, after: str) -> None:
        if self.lay.tp > 1:  # sequence parallelism: all-gather in, reduce-scatter out
            self.out.comm.append(
                Comm(name, "all_gather", "tp", self.Ts * self.a.hidden * ACT, after)
            )

    def tp_scatter(self, name: str, after: str) -> None:
        if self.lay.tp > 1:
            self.out.comm.append(
                Comm(name, "reduce_scatter", "tp", self.T * self.a.hidden * ACT, after)
            )

    # -- a transformer layer ---------------------------------------------------------------
    def attention(self, layer: int) -> None:
        a, lay, T, Ts, h = self.a, self.lay, self.T, self.Ts, self.a.hidden
        tp = lay.tp
        self.mem("norm1", 2 * ACT * Ts * h, "layernorm")
        self.tp_gather("attn.ag", "norm1")
        heads = a.heads // tp if a.heads >= tp else 1
        if a.mla is None:
            kv = max(a.kv_heads, tp) // tp
            width = (heads + 2 * kv) * a.qk_dim
            self.linear("qkv", T, h, width, "attn", gathered=True)
            if a.qk_norm:
                self.mem("qk_norm", 2 * ACT * T * (heads + kv) * a.qk_dim, "layernorm")
            self.chain("rope", eager.rope(T * (heads + kv) * a.qk_dim, a.yarn_factor), "attn")
            kv_bytes = T * kv * (a.qk_dim + a.v_dim) * ACT
        else:
            m = a.mla
            if m.q_lora_rank:
                self.linear("q_down", T, h, m.q_lora_rank, "attn", gathered=True)
                self.mem("q_norm", 2 * ACT * T * m.q_lora_rank, "mla_up_proj")
                self.linear("q_up", T, m.q_lora_rank, heads * a.qk_dim, "mla_up_proj")
            else:
                self.linear("q", T, h, heads * a.qk_dim, "attn", gathered=True)
            self.linear("kv_down", T, h, m.kv_lora_rank + m.qk_rope_head_dim, "attn", gathered=True)
            self.mem("kv_norm", 2 * ACT * T * m.kv_lora_rank, "mla_up_proj")
            self.linear(
                "kv_up",
                T,
                m.kv_lora_rank,
                heads * (m.qk_nope_head_dim + m.v_head_dim),
                "mla_up_proj",
            )
            self.mem(
                "rope", 2 * ACT * T * heads * (a.qk_dim + m.qk_rope_head_dim), "attn", saved=0.0
            )
            kv_bytes = T * heads * (a.qk_dim + a.v_dim) * ACT
            kv = heads  # MLA expands the latent to every head's keys and values
        # causal: each query sees half the keys on average (CP's load-balanced halves keep it)
        keys = lay.seq / 2
        if a.is_banded(layer):
            keys = min(float(a.sliding_window or lay.seq), lay.seq / 2)
        flops = 2.0 * T * keys * heads * (a.qk_dim + a.v_dim)
        # the key loop's length as the causal sequence that loops as far (twice the keys a
        # query sees); CP's ring runs the kernel on chunks of seq / cp
        span = min(2.0 * keys, lay.seq / lay.cp)
        # reads Q, K, V and writes O; keeps all four and the log-sum-exp for its backward
        io = ACT * T * (heads * (a.qk_dim + a.v_dim) + kv * (a.qk_dim + a.v_dim))
        out_lse = ACT * T * heads * a.v_dim + 4.0 * T * heads  # O and the log-sum-exp
        self.add(
            Work(
                "core_attn",
                "attention",
                flops,
                io,
                launches=6,
                bwd=2.5,
                module="core_attn",
                saved=io + 4.0 * T * heads,
                saved_min=out_lse,
                span=span,
                head_dim=a.qk_dim,
            )
        )
        if lay.cp > 1:  # ring attention: every step passes a K/V chunk to the next rank
            self.out.comm.append(Comm("cp.kv", "send", "cp", kv_bytes * (lay.cp - 1), "core_attn"))
        self.linear("proj", T, heads * a.v_dim, h, "attn")
        if a.attention_bias:  # skip_bias_add: the bias is added before the residual
            self.chain("proj.bias", eager.proj_bias(T, h), "attn")
        self.tp_scatter("attn.rs", "proj")
        self.mem("residual1", 3 * ACT * Ts * h, "attn", saved=0.0)

    def dense_mlp(
        self, width: int, prefix: str = "", module: str = "mlp", tokens: float | None = None
    ) -> None:
        a, h, tp = self.a, self.a.hidden, self.lay.tp
        T = self.T if tokens is None else tokens
        F = width // tp
        self.linear(
            f"{prefix}fc1", T, h, F * (2 if a.gated else 1), module, gathered=tokens is None
        )
        width = 2 if a.gated else 1
        self.mem(f"{prefix}act", (width + 1) * ACT * T * F, module, saved=width * ACT * T * F)
        self.linear(f"{prefix}fc2", T, F, h, module)

    def mlp(self, layer: int) -> None:
        a, lay, Ts, h = self.a, self.lay, self.Ts, self.a.hidden
        self.mem("norm2", 2 * ACT * Ts * h, "layernorm")
        if not a.is_moe(layer):
            self.tp_gather("mlp.ag", "norm2")
            self.dense_mlp(a.ffn)
            self.tp_scatter("mlp.rs", "fc2")
            self.mem("residual2", 3 * ACT * Ts * h, "mlp", saved=0.0)
            return
        self.out.moe = True
        E, rd = a.experts, a.router_dtype  # the provider's moe_router_dtype
        rb = DTYPE_BYTES[rd]
        self.add(
            Work(
                "router",
                "gemm",
                2.0 * Ts * h * E,
                rb * (Ts * h + h * E + Ts * E),
                rd,
                launches=4,
                module="moe_router",
                saved=rb * Ts * h,
            )
        )
        # softmax / top-k and the load-balancing and z losses
        self.mem("topk", rb * 4 * Ts * E, "moe_router", launches=10, saved=rb * Ts * E)
        # token copies this GPU dispatches; the hot GPU receives `imbalance` times as many
        routed = Ts * a.top_k * self.imbalance
        # the permutation and the dispatcher's preprocessing (counts per expert and per rank)
        self.mem("permute", 2 * ACT * routed * h, "moe_preprocess", launches=12, saved=0.0)
        # Megatron-Core dispatches bf16 hidden states whatever the GEMM dtype (its dispatchers
        # quantize after the all-to-all; `megatron_ep`'s dispatch_dtype default, the same)
        payload = routed * h * ACT
        self.out.comm.append(Comm("dispatch", "all_to_all", "ep", payload, "permute"))
        local = max(1, E // lay.ep)
        # Megatron-Core's all-to-all dispatcher receives rows grouped by source rank, then by
        # expert: with several local experts it sorts the chunks by expert after the
        # all-to-all and back before the combine (token_dispatcher.py, "Permutation 2",
        # moe_utils.sort_chunks_by_idxs): a copy of the routed rows each way
        sort = self.chunk_sort and local > 1
        if sort:
            self.mem("sort_chunks", 2 * ACT * routed * h, "moe", saved=0.0)
        F = a.moe_ffn // lay.etp
        if self.fp8_pad and self.p.quantized:
            self.chain("expert.fp8_pad", eager.fp8_padding(routed, h), "moe")
        self.linear("expert.fc1", routed, h, F * (2 if a.gated else 1), "moe", experts=local)
        width = 2 if a.gated else 1
        if a.glu_clamp is not None:  # it keeps the fc1 output (its two halves)
            kept = 2 * ACT * routed * F
            self.chain("expert.clamp", eager.clamped_glu(routed, F), "moe_act", kept)
        # Megatron-Core weighs each routed row by its probability in the grouped MLP's
        # activation (TEGroupedMLP.bias_act_func, weighted_bias_swiglu_impl): it keeps its
        # input and the fp32 probabilities; the unpermute then only sums, keeping nothing
        self.mem(
            "expert.act",
            (width + 1) * ACT * routed * F,
            "moe_act",
            saved=width * ACT * routed * F + 4.0 * routed,
        )
        self.linear("expert.fc2", routed, F, h, "moe", experts=local)
        if a.expert_bias:
            pb = 4 if self.probs_fp32 else int(rb)
            self.chain("expert.fc2.bias", eager.expert_bias(routed, h, local, pb), "moe")
        if sort:
            self.mem("unsort_chunks", 2 * ACT * routed * h, "moe", saved=0.0)
        before = "unsort_chunks" if sort else "expert.fc2"
        self.out.comm.append(Comm("combine", "all_to_all", "ep", routed * h * ACT, before))
        self.mem("unpermute", 3 * ACT * routed * h, "moe", launches=4, saved=0.0)
        if a.shared:
            self.tp_gather("shared.ag", "norm2")
            self.dense_mlp(a.moe_ffn * a.shared, "shared.", "shared_experts")
            self.tp_scatter("shared.rs", "shared.fc2")
        self.mem("residual2", 3 * ACT * Ts * h, "moe", saved=0.0)


def layer_work(
    a: Architecture,
    lay: Layout,
    prec: Precision,
    layer: int,
    imbalance: float = 1.0,
    chunk_sort: bool = False,
    probs_fp32: bool = False,
    fp8_pad: bool = False,
) -> LayerWork:
    """One transformer layer's forward on one GPU for one micro-batch; `imbalance`: the
    hottest GPU's routed rows over the mean (its MoE part is what the layer waits for);
    `chunk_sort`: the dispatcher sorts the received rows by local expert (all-to-all);
    `probs_fp32`: it hands the experts fp32 probabilities (DeepEP, HybridEP); `fp8_pad`: the
    quantized grouped GEMMs pad each expert's rows themselves (`eager.fp8_padding`)."""
    b = _Builder(a, lay, prec, imbalance, chunk_sort, probs_fp32, fp8_pad)
    b.out.layer = layer
    b.attention(layer)
    b.mlp(layer)
    return b.out


def embedding_work(a: Architecture, lay: Layout) -> LayerWork:
    """The input embedding (first stage): a lookup of the sequence-parallel shard."""
    b = _Builder(a, lay, PRECISIONS["BF16"])
    b.mem("embedding", 2 * ACT * b.Ts * a.hidden, "embedding")
    return b.out


def head_work(a: Architecture, lay: Layout) -> LayerWork:
    """Final norm, LM head (vocabulary split by TP) and the vocab-parallel cross-entropy
    (fp32 softmax over the logits: a read of the bf16 logits, the max and sum reductions
    across TP, the loss and the gradient written back)."""
    b = _Builder(a, lay, PRECISIONS["BF16"])
    b.mem("final_norm", 2 * ACT * b.Ts * a.hidden, "layernorm")
    b.tp_gather("head.ag", "final_norm")
    V = -(-a.vocab // lay.tp)
    b.linear("lm_head", b.T, a.hidden, V, "head", quantize=False, gathered=True)
    # the logits are a transient (sim.training.memory), not kept per micro-batch
    b.mem("cross_entropy", (ACT + 4 + 4 + ACT) * b.T * V, "head", launches=4, saved=0.0)
    return b.out


def mtp_work(
    a: Architecture,
    lay: Layout,
    prec: Precision,
    imbalance: float = 1.0,
    chunk_sort: bool = False,
    probs_fp32: bool = False,
    fp8_pad: bool = False,
) -> list[LayerWork]:
    """DeepSeek-V3's multi-token prediction module (arXiv 2412.19437 Sec. 2.2), per depth:
    two norms, a projection of the concatenated 2h to h, one transformer block (as the last
    layer) and its own pass through the shared LM head."""
    out = []
    for _ in range(a.mtp):
        b = _Builder(a, lay, prec)
        b.mem("mtp.norms", 2 * 2 * ACT * b.Ts * a.hidden, "layernorm", launches=2)
        b.linear("mtp.proj", b.T, 2 * a.hidden, a.hidden // lay.tp, "mtp", quantize=False)
        pre = b.out
        blk = layer_work(a, lay, prec, a.layers - 1, imbalance, chunk_sort, probs_fp32, fp8_pad)
        pre.work += blk.work
        pre.comm += blk.comm
        pre.moe = blk.moe
        head = head_work(a, lay)
        pre.work += head.work
        pre.comm += head.comm
        out.append(pre)
    return out
