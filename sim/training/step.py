"""One training step of a whole model at a production layout: its time and its memory.

The step is built from three levels, each simulated once and reused where the structure
repeats (a 1,024-GPU DeepSeek-V3 step would otherwise be ~10^7 kernels):
1. kernels: each layer's forward and backward on one GPU (`sim.training.ops`), timed by the
   GPU's kernel figures (`sim.training.kernels`);
2. collectives: each distinct one (EP all-to-all, TP all-gather / reduce-scatter, CP ring,
   PP send, DP reduce-scatter / all-gather) simulated by the engine on the topology with all
   of its groups at once (`sim.training.comm`);
3. the pipeline: the stages' passes in Megatron-Core's schedule, with the phases above as
   timed tasks, simulated by the engine over one GPU per stage (`sim.training.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sim.core.issue import in_issue_order
from sim.hardware.costs.resources import Resources
from sim.training.comm import Timer, flex_dispatch
from sim.training.contention import Contention, build, dp_hold, fsdp
from sim.training.kernels import GpuKernels
from sim.training.layer_phases import layer_phases
from sim.training.layout import Layout
from sim.training.memory import MemoryReport, saved_bytes, step_memory
from sim.training.ops import LayerWork, embedding_work, head_work, layer_work, mtp_work
from sim.training.pipeline import Phase, StagePrograms, step_graph
from sim.training.pipeline_kind import Placement
from sim.training.precision import Precision
from sim.training.recipe import GRAPH_SCOPES, Recipe, comm_sms
from sim.workload.architectures import Architecture

OPTIMIZER_BYTES_PER_PARAM = 30.0  # Adam on a shard: fp32 master, m, v read and written (24),
# the fp32 gradient read (4), the bf16 weight written (2)


@dataclass
class StepResult:
    step_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    memory: MemoryReport
    breakdown: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class StepModel:
    def __init__(
        self,
        arch: Architecture,
        lay: Layout,
        prec: Precision,
        recipe: Recipe,
        gpu: GpuKernels,
        comm: Timer,
        imbalance: float = 1.0,
    ):
        if prec.copies(gpu.fp8_any_layout) == 1:
            # a cast writes the copies the GPU keeps (`Precision.copies`); the table's
            # `cast_write` counts both orientations
            prec = replace(prec, cast_write=prec.cast_write / 2)
        self.a, self.lay, self.p, self.r, self.gpu, self.comm = arch, lay, prec, recipe, gpu, comm
        self.imbalance = imbalance  # the hottest EP rank's routed rows over the mean
        # what overlapped collectives cost the compute beside them (`sim.training.contention`;
        # None: nothing, as the bound's models and the tests' stubs have it)
        self.contention: Contention | None = None
        self.res: Resources | None = None  # the GPU's (`on`): the SMs EP kernels hold
        self.graphed: set[str] = set()
        for scope in recipe.cuda_graph_scope:
            self.graphed |= GRAPH_SCOPES.get(scope, set())
        self.place = Placement(recipe.pipeline, lay.pp, lay.vp)  # 1F1B or DualPipe's chunks
        self.vstages = self._layout()
        self.index_in_stage: dict[int, int] = {}
        first = 0
        layer_of: list[list[int]] = []
        for sym in self.vstages:
            n = sym.count("t")
            layer_of.append(list(range(first, first + n)))
            first += n
        self.vstage_layers = layer_of
        # a layer's place in its model chunk: Megatron-Core's block recomputation counts there
        self.index_in_chunk = {layer: k for ls in layer_of for k, layer in enumerate(ls)}
        for s in range(lay.pp):
            stage = [i for v in self.place.held_by(s) for i in layer_of[v]]
            self.index_in_stage.update({layer: k for k, layer in enumerate(stage)})
        self.totals = {"compute_s": 0.0, "ep_comm_s": 0.0, "tp_comm_s": 0.0, "cp_comm_s": 0.0}

    def _layout(self) -> list[str]:
        """Each virtual stage's symbols (sim.training.stages): the recipe's layout string,
        else the even split (with the embedding and loss counted where the recipe says)."""
        from sim.training import stages

        n = self.place.vstages
        where = f"{self.lay.where}: pipeline layout"
        if self.r.pipeline_layout and n > 1:
            return stages.parse(self.r.pipeline_layout, n, self.a.layers, where)
        return stages.even(
            n,
            self.a.layers,
            self.r.account_for_embedding and n > 1,
            self.r.account_for_loss and n > 1,
            self.lay.where,
        )

    # -- one pass of one layer as phases ---------------------------------------------------
    def _seconds(self, lw: LayerWork, names: list[str], backward: bool) -> float:
        by_name = {w.name: w for w in lw.work}
        t, kernels, launches = 0.0, 0, 0
        for n in names:
            w = by_name[n]
            t += self.gpu.seconds(w, backward)
            k = self.gpu.launches(w, backward)
            if backward and self.recomputed(w.module, lw.layer):
                t += self.gpu.seconds(w)
                k += w.launches
            kernels += k
            if w.module not in self.graphed:
                launches += k
        # the GPU's own floor per kernel, graphed or not; the host launches ahead of the GPU,
        # except after a host sync (a dropless dispatcher reads the token counts before its
        # all-to-all): then each stretch between syncs takes the longer of its kernels and
        # their launches (the CPU thread is serial)
        return self.gpu.stretch(t, kernels, launches, self.syncs(lw))

    def syncs(self, lw: LayerWork) -> bool:
        """Whether the layer's dispatcher waits on the host for the token counts: dropless
        routing does; capacity-bound routing padded to capacity has static shapes."""
        return lw.moe and not self.r.notes.get("moe_token_drop", False)

    def _ep_seconds(self, c: Any) -> float:
        """An EP collective: DeepEP's or HybridEP's kernels (`comm.flex_dispatch`: each token
        once per GPU over NVLink, once per NVLink domain over RDMA; HybridEP as DeepEP's
        where the GPU gives no share of its own), else NCCL's all-to-all of one row per
        (token, expert)."""
        if self.r.dispatcher in ("deepep", "hybridep"):
            share = self.gpu.hybridep_link_share if self.r.dispatcher == "hybridep" else 0.0
            a, sms = self.a, comm_sms(self.r)
            combine = c.name == "combine"
            return flex_dispatch(self.comm, c.bytes, a.top_k, a.experts, combine, sms, share)
        return self.comm.seconds(c.kind, "ep", c.bytes)

    def recomputed(self, module: str, layer: int = -1) -> bool:
        """Whether the recipe recomputes this module of this layer in the backward (full
        recomputation of `recompute_layers` layers per model chunk, the first ones of each:
        Megatron-Core's block method, `checkpointed_forward`, counts over the layers of one
        chunk's TransformerBlock, so with VP each virtual stage recomputes N)."""
        if self.r.recompute_full and layer >= 0:
            n = self.r.recompute_layers
            return n is None or self.index_in_chunk.get(layer, 0) < n
        mods = self.r.recompute_modules
        return module in mods or ("moe" in mods and module.startswith("moe"))

    def phases(self, lw: LayerWork, backward: bool) -> list[Phase]:
        """The layer's forward (or backward) as the pipeline's phases
        (`sim.training.layer_phases`)."""
        return layer_phases(self, lw, backward)

    def graph(self, progs: list[StagePrograms], topo: Any) -> tuple[Any, list[int], float]:
        """The step's task graph over one GPU per stage (`sim.training.pipeline.step_graph`),
        those GPUs' ranks and the send time between stages."""
        lay, a, r, comm = self.lay, self.a, self.r, self.comm
        ranks = [comm.place(s * lay.stage_size) for s in range(lay.pp)]
        p2p_bytes = lay.mbs * lay.seq / lay.cp / lay.tp * a.hidden * 2
        p2p_s = comm.seconds("send", "pp", p2p_bytes) if lay.pp > 1 else 0.0
        overlap = r.ep_overlap and a.moe and lay.ep > 1
        if self.place.dual:  # DualPipe's order (`sim.training.dualpipe_schedule`)
            from sim.training.dualpipe_schedule import dualpipe_graph

            pipe = self.place.pipe(lay.ga)
            g = dualpipe_graph(progs, ranks, topo.world_size, pipe, p2p_s, overlap)
        else:
            g = step_graph(progs, ranks, topo.world_size, lay.ga, lay.vp, p2p_s, overlap)
        if r.max_connections is not None and r.max_connections < _streams(g):
            # streams share queues (`sim.engine.queues`): the builder's order where the
            # queues can run it, else one a host could issue
            g = in_issue_order(g)
        return g, ranks, p2p_s

    # -- per stage ---------------------------------------------------------------------------
    def chunk_work(self) -> list[list[list[LayerWork]]]:
        """Per stage, per chunk: the layer works of its virtual stage (embedding first, the
        LM head and MTP last)."""
        per_vstage: list[list[LayerWork]] = []
        for sym, layers in zip(self.vstages, self.vstage_layers):
            todo = iter(layers)
            works: list[LayerWork] = []
            for x in sym:
                if x == "t":
                    works.append(self.layer_work(next(todo)))
                else:
                    works += self.symbol_work(x)
            per_vstage.append(works)
        return [[per_vstage[v] for v in self.place.held_by(s)] for s in range(self.lay.pp)]

    def layer_work(self, layer: int) -> LayerWork:
        """One transformer layer's work (`sim.training.ops.layer_work`)."""
        return layer_work(self.a, self.lay, self.p, layer, self.imbalance, *self.dispatch)

    @property
    def chunk_sort(self) -> bool:
        """Whether the dispatcher sorts received rows by local expert (NCCL all-to-all)."""
        return self.r.dispatcher == "alltoall"

    @property
    def dispatch(self) -> tuple[bool, bool, bool]:
        """(chunk_sort, probs_fp32, fp8_pad) of `sim.training.ops.layer_work`: DeepEP and
        HybridEP hand the experts fp32 probabilities (token_dispatcher.py casts them); only
        HybridEP pads each expert's rows for quantized GEMMs in its dispatch (`pad_multiple`),
        else dropless routing leaves TEGroupedMLP's Fp8Padding to copy them."""
        r = self.r
        flex = r.dispatcher in ("deepep", "hybridep")
        pad = r.dispatcher != "hybridep" and not r.notes.get("moe_token_drop", False)
        return self.chunk_sort, flex, pad

    def symbol_work(self, sym: str) -> list[LayerWork]:
        """The works of a stage symbol other than a layer: the embedding (E), the MTP
        modules (m), the LM head and loss (L)."""
        a, lay = self.a, self.lay
        if sym == "E":
            return [embedding_work(a, lay)]
        if sym == "m":
            return mtp_work(a, lay, self.p, self.imbalance, *self.dispatch)
        if sym == "L":
            return [head_work(a, lay)]
        return []

    def params(self, lw: LayerWork) -> tuple[float, float]:
        """(dense, expert) weights of a layer work on one GPU: dense ones split by TP,
        experts by EP x ETP (an MTP module: its projection and its block)."""
        a, lay = self.a, self.lay
        names = {w.name for w in lw.work}
        dense = expert = 0.0
        if "embedding" in names:
            dense += a.vocab * a.hidden / lay.tp
        if "lm_head" in names:
            dense += a.vocab * a.hidden / lay.tp
        if "mtp.proj" in names:
            dense += 2 * a.hidden * a.hidden / lay.tp
        if "core_attn" in names:  # a transformer block (a layer's, or an MTP module's)
            dense += a.attention_params() / lay.tp
            if lw.moe:
                dense += a.mlp_params(a.moe_ffn) * a.shared / lay.tp + a.hidden * a.experts
                expert = a.mlp_params(a.moe_ffn) * a.experts / (lay.ep * lay.etp)
            else:
                dense += a.mlp_params(a.ffn) / lay.tp
        return dense, expert

    def saved_bytes(self, lw: LayerWork) -> float:
        """Bytes the layer keeps for its backward per micro-batch (`sim.training.memory`)."""
        return saved_bytes(lw, self)

    @property
    def gather_bytes(self) -> float:
        """Bytes per parameter a weight all-gather moves: FP8 with `fp8_param_gather`."""
        return 1.0 if self.r.fp8_param_gather else 2.0

    def dp_parts(self, lw: LayerWork, kind: str) -> list[tuple[str, str, float, int, float]]:
        """The distributed optimizer's `kind` (all-gather of the weights, reduce-scatter of the
        gradients) for one layer: (kind, dimension, bytes, group size, seconds) for each
        data-parallel dimension of more than one rank that holds some of its parameters."""
        dense, expert = self.params(lw)
        lay, r = self.lay, self.r
        out = []
        for dim, p, n in (("dpcp", dense, lay.dpcp), ("edp", expert, lay.edp)):
            if p and n > 1:
                if kind == "all_gather":
                    nbytes = p * self.gather_bytes / n
                else:
                    nbytes = p * r.grad_reduce_bytes
                out.append((kind, dim, nbytes, n, self.comm.seconds(kind, dim, nbytes)))
        return out

    def dp_collectives(self, lw: LayerWork) -> tuple[float, float]:
        """(all-gather, reduce-scatter) seconds of one layer's parameters and gradients."""
        ag, rs = (sum(x[4] for x in self.dp_parts(lw, k)) for k in ("all_gather", "reduce_scatter"))
        return ag, rs

    def stage_programs(
        self, works: list[list[list[LayerWork]]] | None = None
    ) -> tuple[list[StagePrograms], list[list[list[LayerWork]]]]:
        """Per stage, the phases of its passes and its layers' DP collectives; `works`: the
        chunks' layer works if the caller built them already (`chunk_work`)."""
        works = works if works is not None else self.chunk_work()
        progs = []
        for s in range(self.lay.pp):
            fwd, bwd, gather, reduce = [], [], [], []
            shard = 0.0
            for lws in works[s]:
                fwd.append([ph for lw in lws for ph in self.phases(lw, False)])
                bwd.append([ph for lw in reversed(lws) for ph in self.phases(lw, True)])
                g_c: list[tuple[int, float, int, float]] = []
                r_c: list[tuple[int, float, int, float]] = []
                for lw in lws:
                    dense, expert = self.params(lw)
                    shard += dense / self.lay.dpcp + expert / self.lay.edp
                    if self.lay.fsdp:
                        continue  # FSDP's collectives are per micro-batch (fsdp_phases)
                    for out, kind in ((g_c, "all_gather"), (r_c, "reduce_scatter")):
                        parts = self.dp_parts(lw, kind)
                        sec = sum(x[4] for x in parts)
                        out.append((lw.layer, sec, *dp_hold(self, parts)))
                gather.append(g_c)
                reduce.append(r_c)
            opt = shard * OPTIMIZER_BYTES_PER_PARAM / (self.gpu.mem_bw * self.gpu.memory_bound)
            progs.append(StagePrograms(fwd, bwd, gather, reduce, opt))
        if self.lay.fsdp:  # its per-micro-batch gathers and reduce-scatters
            fsdp(self, progs, works)
        return progs, works

    def on(self, topo: Any) -> StepModel:
        """The model on its topology: what overlapped collectives cost the compute beside
        them (`sim.training.contention`) and the GPU's resources (the SMs EP kernels hold)."""
        self.contention = build(self.r, self.lay, topo, self.comm.place)
        self.res = Resources.build(topo.gpu, None)
        return self


def run_step(
    arch: Architecture,
    lay: Layout,
    prec: Precision,
    recipe: Recipe,
    gpu: GpuKernels,
    comm: Timer,
    topo: Any,
    costs: Any,
    imbalance: float = 1.0,
) -> StepResult:
    """Simulate one steady-state step; `imbalance`: the routing's max/mean routed rows per
    EP rank (1: balanced; the hot rank's MoE part paces every layer)."""
    from sim.core import limits
    from sim.engine.engine import simulate

    # every stage runs GA x VP forward and backward passes (DualPipeV: 2 GA): bounded before
    # anything is built
    passes = 2 * lay.ga * (2 if recipe.pipeline == "dualpipev" else lay.vp) * lay.pp
    limits.active().check("max_tasks", passes, f"{lay.where}: pipeline passes (2 x ga x vp x pp)")
    model = StepModel(arch, lay, prec, recipe, gpu, comm, imbalance).on(topo)
    progs, works = model.stage_programs()
    phases = max(len(p) for prog in progs for p in prog.fwd + prog.bwd)
    limits.active().check(
        "max_tasks", passes * (phases + 2), f"{lay.where}: step graph tasks (passes x phases)"
    )
    g, _, p2p_s = model.graph(progs, topo)
    res = simulate(g, topo, costs)
    step_s = res.makespan
    tokens = lay.gbs * lay.seq
    tps = tokens / step_s / lay.gpus
    mem = step_memory(model, works)
    bubble = _bubble(progs, model.place.micro_per_chunk(lay.ga), step_s)
    return StepResult(
        step_s=step_s,
        tokens_per_s_per_gpu=tps,
        tflops_per_gpu=tps * arch.model_flops_per_token(lay.seq) / 1e12,
        memory=mem,
        breakdown={
            "pass_compute_s": sum(
                sum(p.seconds for p in f if p.stream == "compute")
                for f in progs[0].fwd + progs[0].bwd
            ),
            "bubble_share": bubble,
            "p2p_s": p2p_s,
            "optimizer_s": max(p.optimizer_s for p in progs),
            **{k: v for k, v in model.totals.items()},
        },
        meta={"tasks": len(g), "collective_simulations": comm.simulations},
    )


def _streams(g: Any) -> int:
    """The most streams one rank of graph `g` uses."""
    per_rank: dict[int, int] = {}
    for rank, _ in {(t.rank, t.stream) for t in g}:
        per_rank[rank] = per_rank.get(rank, 0) + 1
    return max(per_rank.values(), default=0)


def _bubble(progs: list[StagePrograms], micro: int, step_s: float) -> float:
    """Share of the step the busiest stage's compute stream is not computing passes;
    `micro`: micro-batches per chunk."""
    busiest = max(
        micro * sum(sum(p.seconds for p in ph) for ph in prog.fwd + prog.bwd) for prog in progs
    )
    return max(0.0, 1.0 - busiest / step_s) if step_s > 0 else 0.0
