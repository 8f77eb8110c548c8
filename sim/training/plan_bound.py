"""What `moesim plan` knows of a candidate before simulating it (`sim.training.plan`): its
peak memory and a lower bound on its step with every collective free (`lower_bound`), then
with its collectives at their floor (`FloorTimer`: no simulation) or simulated
(`comm_bound`), the layers' work shared between candidates (`Screener`)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, replace
from typing import Any

from sim.core.errors import ConfigError, MoesimError
from sim.training.ops import LayerWork
from sim.training.pipeline import Phase
from sim.training.plan_space import Candidate, Request, candidate_row, recipe_of
from sim.training.predict import MODELS, _lookup, prepare
from sim.training.recipe import Recipe
from sim.training.step import StepModel


class FreeComm:
    """A collective timer that answers 0 s: the bound leaves communication out."""

    simulations = 0
    per_domain = 1  # any: every collective is free

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return 0.0

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        return 0.0

    def place(self, rank: int) -> int:
        return rank


def lower_bound(model: Any, works: list[list[list[Any]]]) -> float:
    """Seconds a step takes at least: the busiest stage's compute stream over the step (its
    passes as the simulation builds them, host-bound stretches included, every collective
    free) plus the pipeline's fill and drain of (PP - 1) chunks of the lightest stage (the
    interleaved schedule's bubble when stages are even), plus the optimizer step; with
    DualPipe (`pipeline_kind.Placement.fill`), each device's compute plus the forwards of the
    stages before its first chunk, each at least the lightest forward chunk. The simulated
    step adds communication to that. `model`: a step model whose collectives are free
    (`FreeComm`); `works`: its chunk works."""
    progs, _ = model.stage_programs(works)
    lay = model.lay
    per_stage = [
        sum(
            ph.seconds
            for passes in (prog.fwd, prog.bwd)
            for chunk in passes
            for ph in chunk
            if ph.stream == "compute"
        )
        for prog in progs
    ]
    opt = max(prog.optimizer_s for prog in progs)
    if model.place.dual:
        m = model.place.micro_per_chunk(lay.ga)
        return model.place.fill([m * x for x in per_stage], _lightest_forward(progs)) + opt
    return lay.ga * max(per_stage) + (lay.pp - 1) * min(per_stage) / lay.vp + opt


def _lightest_forward(progs: list[Any]) -> float:
    """Compute seconds of the lightest forward chunk of any stage."""
    return min(
        sum(ph.seconds for ph in chunk if ph.stream == "compute")
        for prog in progs
        for chunk in prog.fwd
    )


class _ScreenModel(StepModel):
    """The step model the memory model and the bound read: every collective free
    (`FreeComm`), the layers' works, their passes and their weights shared through a
    `Screener` between the layers of a kind and between candidates. A layer's work depends
    on TP, CP, EP, ETP, the micro-batch, the sequence and the layer's kind (MoE, banded), not
    on the pipeline; its phases on that and on the recomputation (the recipe's, and whether
    full recomputation takes this layer: all, or the first `recompute_layers` of each model
    chunk; offloading changes only the memory), so the phases of the first layer of a kind
    and recomputation stand for the others (their `layer` labels are that one's: the bound
    reads their seconds only)."""

    def __init__(self, screener: Screener, p: Any, comm: Any = None):
        super().__init__(
            p.arch, p.layout, p.precision, p.recipe, p.gpu, comm or FreeComm(), p.imbalance
        )
        r, lay = p.recipe, p.layout
        self.s = screener
        self.phase_memo = screener.phases
        self._lay_key = (
            lay.tp,
            lay.cp,
            lay.ep,
            lay.etp,
            lay.mbs,
            lay.seq,
            self.p,
            self.imbalance,
            self.chunk_sort,
        )
        self._rc_key = (r.recompute_full, r.recompute_modules)
        self._phase_key: tuple = self._rc_key  # what a layer's phases depend on besides it

    def layer_work(self, layer: int) -> LayerWork:
        key = (self._lay_key, "t", self.a.is_moe(layer), self.a.is_banded(layer))
        t = self.s.works.get(key)
        if t is None:
            t = self.s.works[key] = [super().layer_work(layer)]
        return LayerWork(layer, t[0].work, t[0].comm, t[0].moe)

    def symbol_work(self, sym: str) -> list[LayerWork]:
        key = (self._lay_key, sym)
        got = self.s.works.get(key)
        if got is None:
            got = self.s.works[key] = super().symbol_work(sym)
        return got

    def phases(self, lw: LayerWork, backward: bool) -> list[Phase]:
        key = (id(lw.work), backward, lw.layer >= 0, self._whole(lw), self._phase_key)
        got = self.phase_memo.get(key)
        if got is None:
            got = self.phase_memo[key] = super().phases(lw, backward)
        return got

    def _whole(self, lw: LayerWork) -> bool:
        """Whether full recomputation takes this layer (`StepModel.recomputed`)."""
        return lw.layer >= 0 and self.r.recompute_full and self.recomputed("", lw.layer)

    def params(self, lw: LayerWork) -> tuple[float, float]:
        got = self.s.params.get(id(lw.work))
        if got is None:
            got = self.s.params[id(lw.work)] = super().params(lw)
        return got

    def saved_bytes(self, lw: LayerWork) -> float:
        from sim.training.memory import offloaded

        # offloaded: the layer's activations go to the host (the first layers of a stage)
        off = lw.layer >= 0 and self.index_in_stage.get(lw.layer, 0) < offloaded(self)
        key = (id(lw.work), lw.layer >= 0, self._whole(lw), off, self._rc_key)
        got = self.s.saved.get(key)
        if got is None:
            got = self.s.saved[key] = super().saved_bytes(lw)
        return got


class BoundModel(_ScreenModel):
    """The screening model with the candidate's collectives timed (`p.comm`: the timer its
    simulation uses, so that what it simulates here is kept for that; `sim.training.comm`),
    but those of the distributed optimizer (its gathers and reduces run beside the passes and
    are left out of the bound); the phases shared between the layers of this candidate only
    (they depend on its collectives)."""

    def __init__(self, screener: Screener, p: Any):
        super().__init__(screener, p, p.comm)
        self.phase_memo = {}

    def dp_collectives(self, lw: LayerWork) -> tuple[float, float]:
        return 0.0, 0.0


class _FloorModel(_ScreenModel):
    """The screening model with the candidate's collectives at their floor (`FloorTimer`:
    nothing simulated) but those of the distributed optimizer (as `BoundModel`); the phases
    shared between the candidates of one layout (the groups), dispatcher and SMs (what the
    floors of a layer's collectives depend on besides its work and recomputation)."""

    def __init__(self, screener: Screener, p: Any):
        from sim.training.comm_floor import FloorTimer
        from sim.training.recipe import comm_sms

        super().__init__(screener, p, FloorTimer(p.comm))
        self.phase_memo = screener.floor_phases
        r = p.recipe
        self._phase_key = (*self._rc_key, p.comm.layout_key(), r.dispatcher, comm_sms(r))

    def dp_collectives(self, lw: LayerWork) -> tuple[float, float]:
        return 0.0, 0.0


def comm_bound(
    model: Any, works: list[list[list[Any]]], overlap: bool, speed: float = 1.0
) -> float:
    """Seconds a step takes at least, with its communication: `lower_bound`'s, where each
    stage's passes count the EP collectives their compute waits for. A stage's compute
    stream runs its tasks in the order they were issued, one at a time, so a pass's compute
    after its all-to-all cannot start before the all-to-all ends, nor the next pass's
    before it: a pass takes its compute plus the collectives between its compute phases.
    With EP overlap (`overlap`) a forward and a backward issued as a merged pair hide each
    other's collectives: the pair takes at least one pass's compute and the collectives
    between, or both computes W plus what the collectives' SMs cost them, whichever is
    longer. Compute beside a collective runs at `speed` at most (the SMs it holds): over a
    pair whose collectives take C, compute busy E and compute beside them I <= C, the work
    W <= E - (1 - speed) I and E + C - I <= the pair's time, so that time >= W + (1 -
    speed) C. The stage takes at least the collectives its communication stream runs one
    after the other. TP, CP and FSDP communication is in the compute phases already
    (`StepModel.phases`, `contention.fsdp`). `model`: a step model with its collectives
    timed but the distributed optimizer's (`BoundModel`)."""
    progs, _ = model.stage_programs(works)
    lay = model.lay

    def split(phases: list[Phase]) -> tuple[float, float, float]:
        """(compute, collectives between the first and last compute, all collectives)."""
        at = [i for i, ph in enumerate(phases) if ph.stream == "compute"]
        compute = sum(phases[i].seconds for i in at)
        comm = sum(ph.seconds for ph in phases if ph.stream != "compute")
        inner = (
            sum(ph.seconds for ph in phases[at[0] : at[-1]] if ph.stream != "compute")
            if at
            else 0.0
        )
        return compute, inner, comm

    busiest, lightest = 0.0, math.inf
    place, per_stage = model.place, []
    for s, prog in enumerate(progs):
        chunks = range(len(prog.fwd))
        parts = {("F", c): split(prog.fwd[c]) for c in chunks}
        parts.update({("B", c): split(prog.bwd[c]) for c in chunks})
        total = on_comm = 0.0
        # a pass of one chunk costs the same every micro-batch: the schedule's passes and
        # merged pairs counted once per schedule, not walked per candidate
        groups = (
            place.groups(lay.ga, s, overlap)
            if place.dual
            else schedule_groups(lay.pp, lay.vp, lay.ga, s, overlap)
        )
        for passes, n in groups:
            group = [parts[p] for p in passes]
            if len(group) > 1:  # each chain's span, or both computes slowed, the longest
                spans = [compute + inner for compute, inner, _ in group]
                both = sum(c + (1.0 - speed) * inner for c, inner, _ in group)
                total += n * max(*spans, both)
            else:
                total += n * (group[0][0] + group[0][1])
            on_comm += n * sum(comm for _, _, comm in group)
        busiest = max(busiest, total, on_comm)
        per_stage.append(max(total, on_comm))
        lightest = min(lightest, sum(parts[(k, c)][0] for k in "FB" for c in chunks))
    opt = max(prog.optimizer_s for prog in progs)
    if place.dual:  # each device after the forwards before its first chunk (`lower_bound`)
        return place.fill(per_stage, _lightest_forward(progs)) + opt
    return busiest + (lay.pp - 1) * lightest / lay.vp + opt


@functools.lru_cache(maxsize=1 << 14)
def schedule_groups(
    pp: int, vp: int, ga: int, stage: int, overlap: bool
) -> tuple[tuple[tuple[tuple[str, int], ...], int], ...]:
    """The stage's schedule (`sim.training.pipeline.schedule`) as ((pass, ...), count)
    pairs: each pass ("F" or "B", chunk) on its own, or with EP overlap a forward and the
    backward after it merged (as `step_graph` merges them), and how often that comes."""
    from collections import Counter

    from sim.training.pipeline import schedule

    order = schedule(pp, vp, ga, stage)
    counts: Counter[tuple[tuple[str, int], ...]] = Counter()
    i = 0
    while i < len(order):
        merged = overlap and order[i][0] == "F" and i + 1 < len(order) and order[i + 1][0] == "B"
        counts[tuple((kind, c) for kind, _, c in order[i : i + 1 + merged])] += 1
        i += 1 + merged
    return tuple(counts.items())


class Screener:
    """One request's memory model and bound of candidates, in one process, with the work
    candidates share cached (`_ScreenModel`; the cached works stay alive with it, so the ids
    that key their phases and weights stay theirs)."""

    def __init__(self, req: Request, base: Recipe):
        self.req, self.base = req, base
        self.works: dict[tuple, list[LayerWork]] = {}
        self.phases: dict[tuple, list[Phase]] = {}
        self.params: dict[int, tuple[float, float]] = {}
        self.saved: dict[tuple, float] = {}
        self.floor_phases: dict[tuple, list[Phase]] = {}
        self.mla: bool | None = None

    def prepared(self, c: Candidate) -> Any:
        """The candidate's run made ready (`sim.training.predict.prepare`) with its recipe
        (`recipe_of`); raises where it cannot be built."""
        from sim.training.predict import parse_row

        req = self.req
        run = parse_row({k: str(v) for k, v in candidate_row(req, c).items()}, 1)
        if self.mla is None:
            from sim.workload.architectures import architecture

            arch = architecture(_lookup(MODELS, req.model, "model", req.where))
            self.mla = arch.mla is not None
        p = prepare(run, recipe_of(self.base, c, self.mla))
        if c.tp > p.topo.gpus_per_node:
            raise ConfigError(f"{req.where}: tp {c.tp} beyond a node")
        return p

    def screen(self, c: Candidate) -> tuple[bool, float] | str:
        """(fits, lower bound in seconds) of a candidate, or why it cannot be built."""
        from sim.training.memory import step_memory

        try:  # a layout the step model cannot lay out is dropped, the plan goes on
            p = self.prepared(c)
            model = _ScreenModel(self, p)
            works = model.chunk_work()
        except MoesimError as e:
            return str(e)
        return step_memory(model, works).fits, lower_bound(model, works)

    def fits(self, c: Candidate) -> bool:
        """Whether the candidate's peak memory fits the GPU's (the memory model only)."""
        from sim.training.memory import step_memory

        model = _ScreenModel(self, self.prepared(c))
        return step_memory(model, model.chunk_work()).fits

    def floor(self, c: Candidate) -> float:
        """The candidate's bound with its collectives at their floor (`comm_bound` over
        `_FloorModel`: no collective simulated), for a candidate `screen` accepted."""
        p = self.prepared(c)
        model = _FloorModel(self, p)
        return comm_bound(model, model.chunk_work(), *overlap_speed(p))


def overlap_speed(p: Any) -> tuple[bool, float]:
    """(whether a prepared run overlaps its EP communication, the most speed compute has
    beside its collectives: the SMs they hold, `ep_hold` in the step's graph)."""
    r = p.recipe
    overlap = bool(r.ep_overlap and p.arch.moe and p.layout.ep > 1)
    if not overlap:
        return False, 1.0
    from sim.hardware.costs.resources import Resources
    from sim.training.recipe import comm_sms

    return True, Resources.build(p.topo.gpu, None).sm_speed(comm_sms(r))


_SCREENERS: dict[str, Screener] = {}  # per process: the last requests' screeners


def screener(req: Request, base: Recipe) -> Screener:
    from sim.training.predict import KERNELS

    key = json.dumps([asdict(replace(req, where="")), KERNELS], sort_keys=True, default=str)
    got = _SCREENERS.get(key)
    if got is None:
        if len(_SCREENERS) >= 2:
            _SCREENERS.pop(next(iter(_SCREENERS)))
        got = _SCREENERS[key] = Screener(req, base)
    return got
