"""`moesim plan`: the fastest layout and overlap choices for a model on a cluster, within
memory, found by simulating the candidates that could win.

1. Enumerate: every layout that divides the GPUs (TP inside a node and dividing the heads,
   CP, PP with the virtual stages the layers allow, EP dividing the experts, micro-batch
   sizes that divide the batch) times the MoE and memory choices (EP overlap on or off,
   the EP dispatcher: NCCL's all-to-all or DeepEP's kernels, the SMs DeepEP's kernels hold,
   recomputation none / the recipe's selective modules / full). Not searched, because the
   training step model does not simulate them: the all-gather dispatcher and HybridEP (the
   step model moves their tokens as the all-to-all does), DualPipe (only the layer-level
   strategies of `sim.workload` model it) and hardware queues; nor the SMs of NCCL's
   all-to-all (its simulated time does not depend on them, so fewer would always win).
2. Drop what cannot run: a candidate whose peak memory (`sim.training.memory`, no simulation
   needed) exceeds the GPU's.
3. Bound: a candidate's step is at least its busiest stage's kernel time over the step plus
   the pipeline's fill and drain (`lower_bound`; the simulated step adds communication and
   host time to that). Candidates are simulated in the order of their bounds; one whose bound
   is no better than the best step simulated so far cannot win and is not simulated
   (`bound`). Just before simulating, a worker times the candidate's collectives (the
   simulation needs them anyway) and bounds its step again with them (`comm_bound`: the
   EP all-to-alls its compute waits for, TP, CP and FSDP traffic); no better than the best
   step when it was sent, it is not simulated either (`comm_bound`).
4. Rank the simulated ones by tokens/s/GPU.

Candidates that differ only in their communication choices (EP overlap, dispatcher, SMs)
share one memory model and one bound (both leave communication out), and candidates share
the work of their layers (`_Screener`: a layer's kernels depend on TP, CP, EP, the micro-batch
and its kind, not on the pipeline). Screening (steps 2 and 3) and the simulations run on the
same pool, local processes or a Dask cluster (`sim.core.pool`, shared with `moesim sweep`):
the distinct memory-and-bound questions in chunks first, then the candidates in the order of
their bounds, as many at a time as there are workers, the next one picked when one finishes.
A worker's process keeps the collectives it simulated (`sim.training.comm`), which candidates
of one layout share. The ranking does not depend on the number of workers: with several, a
candidate may be simulated that a single worker would have pruned (a bound beaten by a
result still running); it is left out of the ranking (counted in `outranked`). With `out`,
every simulated candidate is journaled as it finishes (`sim.training.plan_store`) and a plan
run again with the same request takes it from there instead of simulating it again.

Each candidate is a row of `moesim predict` (`sim.training.predict`) with a recipe of its
choices, so the best one is written as a table row `predict` takes.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, MoesimError
from sim.training.ops import LayerWork
from sim.training.pipeline import Phase
from sim.training.predict import MODELS, SYSTEMS, _lookup, predict_run, prepare, with_choices
from sim.training.recipe import Recipe, recipe_for
from sim.training.step import StepModel

TP = (1, 2, 4, 8)
CP = (1, 2, 4)
PP = (1, 2, 4, 8, 16, 32)
VP = (1, 2, 3, 4, 5, 6, 8, 12)
EP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MBS = (1, 2, 4)
RECOMPUTE = ("none", "selective", "full")
DISPATCHER = ("alltoall", "deepep")  # the EP dispatchers the step model tells apart
COMM_SMS = (0,)  # SMs DeepEP's kernels hold; 0: DeepEP's default (sim.training.step)
LAYOUT_KEYS = ("tp", "cp", "pp", "vp", "ep", "mbs")
SCREEN_CHUNK = 256  # memory-and-bound questions per task of the pool, at most


@dataclass(frozen=True)
class Request:
    model: str
    system: str
    gpus: int
    gbs: int
    seq_len: int
    precision: str
    where: str = "plan"


@dataclass(frozen=True)
class Candidate:
    tp: int
    cp: int
    pp: int
    vp: int
    ep: int
    mbs: int
    ep_overlap: bool = False
    recompute: str = "none"
    fsdp: bool = False  # FSDP over the data-parallel ranks instead of the distributed optimizer
    dispatcher: str = ""  # the EP dispatcher; "": the recipe's
    comm_sms: int = 0  # SMs the dispatcher's kernels hold; 0: the dispatcher's default

    def key(self) -> tuple:
        return tuple(vars(self).values())

    def canonical(self) -> str:
        """The candidate as text, every field named: its key in a plan's journal."""
        return ",".join(f"{k}={v}" for k, v in vars(self).items())

    def screen_key(self) -> tuple:
        """What the memory model and the bound read: not the communication choices."""
        return (self.tp, self.cp, self.pp, self.vp, self.ep, self.mbs, self.recompute, self.fsdp)

    def label(self) -> str:
        s = f"TP{self.tp} CP{self.cp} PP{self.pp} VP{self.vp} EP{self.ep} MBS{self.mbs}"
        s += " FSDP" if self.fsdp else ""
        s += f" {self.dispatcher}" if self.dispatcher and self.ep > 1 else ""
        s += f" sms={self.comm_sms}" if self.comm_sms else ""
        return s + (" overlap" if self.ep_overlap else "") + f" recompute={self.recompute}"


@dataclass
class Plan:
    request: Request
    candidates: list[dict[str, Any]] = field(default_factory=list)  # simulated, ranked
    considered: int = 0
    simulated: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    given: dict[str, Any] | None = None  # the --layout candidate, scored and ranked
    resumed: int = 0  # of the simulated, those taken from an earlier run's journal
    # of the simulated, those a single worker would have pruned: not ranked (see the module
    # docstring)
    outranked: int = 0
    files: dict[str, Any] = field(default_factory=dict)  # written with `out`

    def as_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.__dict__,
            "considered": self.considered,
            "simulated": self.simulated,
            "resumed": self.resumed,
            "outranked": self.outranked,
            "pruned": dict(self.pruned),
            "candidates": self.candidates,
            "given": self.given,
        }


def _row(req: Request, c: Candidate) -> dict[str, Any]:
    """The candidate as a row of `moesim predict`."""
    return {
        "system": req.system,
        "model": req.model,
        "gpus": req.gpus,
        "precision": req.precision,
        "gbs": req.gbs,
        "mbs": c.mbs,
        "seq_len": req.seq_len,
        "fsdp": req.gpus // (c.tp * c.pp) if c.fsdp else 0,
        "tp": c.tp,
        "pp": c.pp,
        "cp": c.cp,
        "vp": c.vp if c.vp > 1 else "",
        "ep": c.ep,
        "ga": "",
    }


def _recipe(base: Recipe, c: Candidate, mla: bool) -> Recipe:
    """The candidate's recipe: the request's with the candidate's choices over it, the
    pipeline split evenly and nothing offloaded (the recipe's layout string and offloading
    are tuned for its published layout), as `moesim predict` builds a row with those choices
    (`best_choices`)."""
    choices = {**best_choices(c), "dispatcher": c.dispatcher or base.dispatcher}
    return replace(with_choices(base, choices, mla), source=f"plan: {c.label()}")


def best_choices(c: Candidate) -> dict[str, Any]:
    """The candidate's choices as `moesim predict`'s CHOICES (a plan keeps the
    architecture's MTP modules whatever the recipe says: `base`'s mtp is None)."""
    out: dict[str, Any] = {
        "dispatcher": c.dispatcher,
        "ep_overlap": c.ep_overlap,
        "comm_sms": c.comm_sms,
        "recompute": c.recompute,
        "pipeline_layout": "",
        "offload_layers": 0,
    }
    return {k: v for k, v in out.items() if v != "" or k == "pipeline_layout"}


GRID: dict[str, tuple] = {
    "tp": TP,
    "cp": CP,
    "pp": PP,
    "vp": VP,
    "ep": EP,
    "mbs": MBS,
    "recompute": RECOMPUTE,
    "dispatcher": DISPATCHER,
    "comm_sms": COMM_SMS,
}


def candidates(
    req: Request, arch: Any, gpus_per_node: int, grid: dict[str, tuple] | None = None
) -> Iterator[Candidate]:
    """Every layout and choice the request's sizes allow (unchecked beyond divisibility), over
    `grid` (the module's value lists, or narrower ones)."""
    g = {**GRID, **(grid or {})}
    kv = arch.kv_heads if arch.mla is None else arch.heads
    for tp, cp, pp in itertools.product(g["tp"], g["cp"], g["pp"]):
        if tp > gpus_per_node or arch.heads % tp or kv % tp and tp % kv:
            continue
        if req.gpus % (tp * cp * pp) or pp > arch.layers or req.seq_len % (2 * cp):
            continue
        if cp > 1 and req.seq_len < 8192:  # CP pays off only on long sequences
            continue
        dp = req.gpus // (tp * cp * pp)
        for vp, ep, mbs in itertools.product(g["vp"], g["ep"] if arch.moe else (1,), g["mbs"]):
            if vp > 1 and (pp == 1 or pp * vp > arch.layers):
                continue
            if arch.moe and (arch.experts % ep or (req.gpus // pp) % ep):
                continue
            if req.gbs % (mbs * dp):
                continue
            overlaps = (False, True) if arch.moe and ep > 1 else (False,)
            shards = (False, True) if pp == 1 and dp > 1 else (False,)
            comms = _comm_choices(g) if arch.moe and ep > 1 else [("", 0)]
            for rc, fs, ov, (disp, sms) in itertools.product(
                g["recompute"], shards, overlaps, comms
            ):
                yield Candidate(tp, cp, pp, vp, ep, mbs, ov, rc, fs, disp, sms)


def _comm_choices(g: dict[str, tuple]) -> list[tuple[str, int]]:
    """(dispatcher, SMs) pairs: SMs only for DeepEP, whose simulated kernels depend on them."""
    return [(d, sms) for d in g["dispatcher"] for sms in (g["comm_sms"] if d == "deepep" else (0,))]


class _FreeComm:
    """A collective timer that answers 0 s: the bound leaves communication out."""

    simulations = 0

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
    interleaved schedule's bubble when stages are even), plus the optimizer step. The
    simulated step adds communication to that. `model`: a step model whose collectives are
    free (`_FreeComm`); `works`: its chunk works."""
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
    return lay.ga * max(per_stage) + (lay.pp - 1) * min(per_stage) / lay.vp + opt


class _ScreenModel(StepModel):
    """The step model the memory model and the bound read: every collective free
    (`_FreeComm`), the layers' works, their passes and their weights shared through a
    `_Screener` between the layers of a kind and between candidates. A layer's work depends
    on TP, CP, EP, ETP, the micro-batch, the sequence and the layer's kind (MoE, banded), not
    on the pipeline; its phases on that and on the recomputation, which a plan's recipes set
    for every layer or none (`_recipe`: no `recompute_layers`, no offloading), so the phases
    of the first layer of a kind stand for the others (their `layer` labels are that one's:
    the bound reads their seconds only)."""

    def __init__(self, screener: _Screener, p: Any, comm: Any = None):
        super().__init__(
            p.arch, p.layout, p.precision, p.recipe, p.gpu, comm or _FreeComm(), p.imbalance
        )
        r, lay = p.recipe, p.layout
        assert r.recompute_layers is None and not r.offload_layers, "a plan's recipe"
        self.s = screener
        self.phase_memo = screener.phases
        self._lay_key = (lay.tp, lay.cp, lay.ep, lay.etp, lay.mbs, lay.seq, self.p, self.imbalance)
        self._rc_key = (r.recompute_full, r.recompute_modules)

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
        key = (id(lw.work), backward, lw.layer >= 0, self._rc_key)
        got = self.phase_memo.get(key)
        if got is None:
            got = self.phase_memo[key] = super().phases(lw, backward)
        return got

    def params(self, lw: LayerWork) -> tuple[float, float]:
        got = self.s.params.get(id(lw.work))
        if got is None:
            got = self.s.params[id(lw.work)] = super().params(lw)
        return got

    def saved_bytes(self, lw: LayerWork) -> float:
        key = (id(lw.work), lw.layer >= 0, self._rc_key)
        got = self.s.saved.get(key)
        if got is None:
            got = self.s.saved[key] = super().saved_bytes(lw)
        return got


class _BoundModel(_ScreenModel):
    """The screening model with the candidate's collectives timed (`p.comm`: the timer its
    simulation uses, so that what it simulates here is kept for that; `sim.training.comm`),
    but those of the distributed optimizer (its gathers and reduces run beside the passes and
    are left out of the bound); the phases shared between the layers of this candidate only
    (they depend on its collectives)."""

    def __init__(self, screener: _Screener, p: Any):
        super().__init__(screener, p, p.comm)
        self.phase_memo = {}

    def dp_collectives(self, lw: LayerWork) -> tuple[float, float]:
        return 0.0, 0.0


def comm_bound(
    model: Any, works: list[list[list[Any]]], overlap: bool, slowdown: float = 1.0
) -> float:
    """Seconds a step takes at least, with its communication: `lower_bound`'s, where each
    stage's passes count the EP collectives their compute waits for. A stage's compute
    stream runs its tasks in the order they were issued, one at a time, so a pass's compute
    after its all-to-all cannot start before the all-to-all ends, nor the next pass's
    before it: a pass takes its compute plus the collectives between its compute phases.
    With EP overlap (`overlap`) a forward and a backward issued as a merged pair hide each
    other's collectives: the pair takes at least both computes, or one pass's compute and
    the collectives between, whichever is longer (compute slowed by `slowdown` as the
    simulation slows it: the SMs the collectives hold), and the stage at least the
    collectives its communication stream runs one after the other. TP, CP and FSDP
    communication is in the compute phases already (`StepModel.phases`, `_fsdp`). `model`: a
    step model with its collectives timed but the distributed optimizer's (`_BoundModel`)."""
    from sim.training.pipeline import schedule

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
    for s, prog in enumerate(progs):
        parts = {("F", c): split(prog.fwd[c]) for c in range(lay.vp)}
        parts.update({("B", c): split(prog.bwd[c]) for c in range(lay.vp)})
        order = schedule(lay.pp, lay.vp, lay.ga, s)
        total = on_comm = 0.0
        i = 0
        while i < len(order):
            merged = (
                overlap and order[i][0] == "F" and i + 1 < len(order) and order[i + 1][0] == "B"
            )
            group = [parts[(kind, c)] for kind, _, c in order[i : i + 1 + merged]]
            if merged:  # each chain's span, or both computes, whichever is longer
                spans = [compute * slowdown + inner for compute, inner, _ in group]
                total += max(*spans, sum(compute for compute, _, _ in group) * slowdown)
            else:
                total += group[0][0] + group[0][1]
            on_comm += sum(comm for _, _, comm in group)
            i += 1 + merged
        busiest = max(busiest, total, on_comm)
        lightest = min(lightest, sum(parts[(k, c)][0] for k in "FB" for c in range(lay.vp)))
    opt = max(prog.optimizer_s for prog in progs)
    return busiest + (lay.pp - 1) * lightest / lay.vp + opt


class _Screener:
    """One request's memory model and bound of candidates, in one process, with the work
    candidates share cached (`_ScreenModel`; the cached works stay alive with it, so the ids
    that key their phases and weights stay theirs)."""

    def __init__(self, req: Request, base: Recipe):
        self.req, self.base = req, base
        self.works: dict[tuple, list[LayerWork]] = {}
        self.phases: dict[tuple, list[Phase]] = {}
        self.params: dict[int, tuple[float, float]] = {}
        self.saved: dict[tuple, float] = {}
        self.mla: bool | None = None

    def screen(self, c: Candidate) -> tuple[bool, float] | str:
        """(fits, lower bound in seconds) of a candidate, or why it cannot be built."""
        from sim.training.memory import step_memory
        from sim.training.predict import parse_row

        req = self.req
        try:
            run = parse_row({k: str(v) for k, v in _row(req, c).items()}, 1)
            if self.mla is None:
                from sim.workload.architectures import architecture

                arch = architecture(_lookup(MODELS, req.model, "model", req.where))
                self.mla = arch.mla is not None
            p = prepare(run, _recipe(self.base, c, self.mla))
            if c.tp > p.topo.gpus_per_node:
                raise ConfigError(f"{req.where}: tp {c.tp} beyond a node")
        except MoesimError as e:
            return str(e)
        model = _ScreenModel(self, p)
        works = model.chunk_work()
        return step_memory(model, works).fits, lower_bound(model, works)


_SCREENERS: dict[str, _Screener] = {}  # per process: the last requests' screeners


def _screener(req: Request, base: Recipe) -> _Screener:
    from sim.training.predict import KERNELS

    key = json.dumps([asdict(replace(req, where="")), KERNELS], sort_keys=True, default=str)
    got = _SCREENERS.get(key)
    if got is None:
        if len(_SCREENERS) >= 2:
            _SCREENERS.pop(next(iter(_SCREENERS)))
        got = _SCREENERS[key] = _Screener(req, base)
    return got


# the pool's tasks: ("screen", chunk number, request, recipe, [candidate, ...]) and
# ("sim", request, candidate, recipe, the best step when sent)
Item = tuple[Any, ...]


def _work(item: Item) -> Any:
    """A task of the pool (in a worker): a chunk of candidates screened (their answers), or
    one candidate simulated (its record)."""
    if item[0] == "screen":
        _, _, req, base, cands = item
        s = _screener(req, base)
        return [s.screen(c) for c in cands]
    return _evaluate(item[1:])


def _name(item: Item) -> str:
    if item[0] == "screen":
        return f"screen{item[1]}"
    return item[2].canonical().replace(",", "-").replace("=", "")


def _killed_item(item: Item, e: Exception) -> Any:
    if item[0] == "screen":
        raise MoesimError(f"plan: screening stopped: a worker killed ({e})")
    return _killed(item[1:4], e)


def _layout_key(req: Request, c: Candidate) -> tuple:
    """The group sizes that key a candidate's collectives (`CommTimer.layout_key`'s)."""
    return (req.gpus, c.tp, c.cp, c.pp, c.ep, 1)


def _base(req: Request) -> Recipe:
    """The recipe a request's candidates start from: the recorded one, expert-TP 1 and the
    architecture's MTP modules."""
    return replace(recipe_for(req.model, req.system, req.precision), etp=1, mtp=None)


def _evaluate(args: tuple) -> dict[str, Any]:
    """Simulate one candidate (in a worker): its row of predictions, or its reason. First its
    bound with communication (`comm_bound`, in `comm_bound_s`); where that is no better than
    `best` (the best step when it was sent, default none), the candidate is not simulated
    (`_pruned`)."""
    req, c, recipe = args[:3]
    best = args[3] if len(args) > 3 else math.inf
    known: dict[tuple, float] = args[4] if len(args) > 4 else {}
    rec: dict[str, Any] = {**_row(req, c), **_choices(c)}
    try:
        from sim.training.predict import parse_row

        run = parse_row({k: str(v) for k, v in _row(req, c).items()}, 1)
        p = prepare(run, recipe)
        shared = p.comm.shared()
        for k, v in known.items():  # what other workers simulated of this layout
            shared.setdefault(k, v)
        mine = p.comm.layout_key()
        before = {k for k in shared if k[:2] == mine}
        rec["_collectives"] = lambda: {
            k: v for k, v in shared.items() if k[:2] == mine and k not in before
        }
        model = _BoundModel(_screener(req, _base(req)), p)
        overlap = recipe.ep_overlap and p.arch.moe and p.layout.ep > 1
        slowdown = 1.0
        if overlap:  # as run_step slows a merged pair's compute
            from sim.hardware.costs.resources import Resources
            from sim.training.step import comm_sms

            slowdown = 1.0 / Resources.build(p.topo.gpu, None).sm_speed(comm_sms(recipe))
        rec["comm_bound_s"] = comm_bound(model, model.chunk_work(), overlap, slowdown)
        if rec["comm_bound_s"] >= best:
            rec["_pruned"] = True
        else:
            rec.update(predict_run(run, recipe))
    except MoesimError as e:
        rec["reason"] = str(e)
    if "_collectives" in rec:  # the layout's collectives simulated here, for the others
        rec["_collectives"] = rec["_collectives"]()
    return rec


def _choices(c: Candidate) -> dict[str, Any]:
    return {
        "ep_overlap": c.ep_overlap,
        "recompute": c.recompute,
        "dispatcher": c.dispatcher,
        "comm_sms": c.comm_sms,
    }


def _killed(args: tuple[Request, Candidate, Recipe], e: Exception) -> dict[str, Any]:
    """The record of a candidate that killed its Dask workers every time it ran (not
    journaled: a resumed plan tries it again)."""
    req, c, _ = args
    return {**_row(req, c), **_choices(c), "reason": f"worker killed: {e}", "_lost": True}


@dataclass
class Progress:
    """Where a plan stands, for a progress bar: `settled` of `total` candidates are dropped
    or simulated."""

    total: int = 0
    screened: int = 0  # memory and bound known (or dropped before)
    simulated: int = 0
    resumed: int = 0  # of the simulated, taken from the journal
    pruned: dict[str, int] = field(default_factory=dict)
    running: int = 0
    phase: str = "screening"

    @property
    def settled(self) -> int:
        return self.simulated + sum(self.pruned.values())


def plan(
    req: Request,
    given: Candidate | None = None,
    workers: int | None = 1,
    progress: Callable[[Progress], None] | None = None,
    grid: dict[str, tuple] | None = None,
    prune: bool = True,
    scheduler: Any = None,
    out: str | Path | None = None,
) -> Plan:
    """The ranked plan of a request (see the module docstring). `grid` narrows (or widens)
    the values tried; `prune=False` simulates every candidate that fits (the exhaustive
    search the pruned one must agree with). `workers`: local processes (1: this one; None:
    the CPU count), or a `dask-local` cluster's;
    `scheduler`: a Dask scheduler address, a `distributed.Client` or `dask-local` (a Dask
    cluster of `workers` local processes). `out`: a folder that journals the simulated
    candidates (a run again with the same request skips them) and receives the results as
    one output set (`sim.training.plan_report.write`). `progress(state)` is called as the
    plan moves."""
    from sim.core import pool
    from sim.training.kernels import GpuKernels
    from sim.training.predict import _topology
    from sim.training.step import precision_of
    from sim.workload.architectures import architecture

    check_request(req)
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ConfigError(f"{req.where}: workers: expected an integer >= 1, got {workers!r}")
    arch = architecture(_lookup(MODELS, req.model, "model", req.where))
    preset = _lookup(SYSTEMS, req.system, "system", req.where)
    node = _topology(preset, 1)
    base = _base(req)
    _check_grid(req, grid)
    if given is not None and arch.moe and given.ep > 1 and not given.dispatcher:
        given = replace(given, dispatcher=base.dispatcher)
    out_plan = Plan(req)
    state = Progress()
    tell = progress or (lambda s: None)
    pruned = state.pruned
    space = list(candidates(req, arch, min(8, node.gpus_per_node), grid))
    if given is not None and given.key() not in {c.key() for c in space}:
        space.append(given)
    if not space:
        g = {**GRID, **(grid or {})}
        raise ConfigError(
            f"{req.where}: no layout divides {req.gpus} GPUs with GBS {req.gbs} and sequence "
            f"{req.seq_len}: tried TP {g['tp']} x CP {g['cp']} x PP {g['pp']} x MBS {g['mbs']}"
        )
    out_plan.considered = state.total = len(space)
    # the distinct memory-and-bound questions, in chunks for the pool (in the order of the
    # space, so that a chunk's candidates share layers)
    share: dict[tuple, list[Candidate]] = {}
    for c in space:
        share.setdefault(c.screen_key(), []).append(c)
    firsts = [cs[0] for cs in share.values()]
    n = workers or os.cpu_count() or 1
    size = max(1, min(SCREEN_CHUNK, -(-len(firsts) // (4 * n))))
    chunks = [firsts[i : i + size] for i in range(0, len(firsts), size)]
    screened: dict[tuple, tuple[bool, float] | str] = {}  # screen_key -> (fits, bound) | why
    feasible: list[tuple[float, Candidate, Recipe]] = []
    bounds: dict[Candidate, float] = {}
    best_step = [math.inf]
    done: list[dict[str, Any]] = []
    # the collectives the workers simulated, by layout, sent with that layout's candidates
    # (a worker's own are kept in its process; these are the others')
    known: dict[tuple, dict[tuple, float]] = {}
    given_reason = ""
    tell(state)

    journal = None
    if out is not None:
        from sim.training.plan_store import Journal, fingerprint

        journal = Journal(out, fingerprint(asdict(req), preset))

    def took(chunk: list[Candidate], answers: list[tuple[bool, float] | str]) -> None:
        for c, got in zip(chunk, answers):
            screened[c.screen_key()] = got
            state.screened += len(share[c.screen_key()])

    def rank_screened() -> None:
        """The screened candidates dropped (invalid, memory) or queued in bound order."""
        nonlocal given_reason
        for c in space:
            got = screened[c.screen_key()]
            if isinstance(got, str):
                pruned["invalid"] = pruned.get("invalid", 0) + 1
                if c == given:
                    given_reason = got
            elif not got[0] and c != given:
                pruned["memory"] = pruned.get("memory", 0) + 1
            else:
                feasible.append((got[1], c, _recipe(base, c, arch.mla is not None)))
        if not feasible:
            tried = ", ".join(f"{k} {v}" for k, v in sorted(pruned.items())) or "none"
            raise ConfigError(
                f"{req.where}: no layout of {req.model} on {req.gpus} GPUs of {req.system} "
                f"fits: {out_plan.considered} candidates, dropped for {tried}"
            )
        feasible.sort(key=lambda t: t[0])  # stable: ties in the order of the space
        bounds.update({c: bound for bound, c, _ in feasible})

    def accept(c: Candidate, rec: dict[str, Any], resumed: bool) -> None:
        lost = rec.pop("_lost", False)
        if not resumed:
            rec = json.loads(json.dumps(rec, default=str))  # as a resumed one reads it back
            if journal is not None and not lost:
                journal.add(c.canonical(), rec)
        out_plan.simulated += 1
        state.simulated += 1
        state.resumed += resumed
        out_plan.resumed += resumed
        rec["lower_bound_s"] = bounds[c]
        rec["_candidate"] = c
        done.append(rec)
        if rec.get("predicted_step_s"):
            best_step[0] = min(best_step[0], rec["predicted_step_s"])

    def feed() -> Iterator[Item]:
        """The chunks to screen; once all are back, the candidates to simulate in the order
        of their bounds: those that can still win when their turn comes (the journal's
        taken from it, not simulated)."""
        for i, chunk in enumerate(chunks):
            yield ("screen", i, req, base, chunk)
        while len(screened) < len(firsts):
            yield pool.WAIT
        rank_screened()
        state.phase = "simulating"
        tell(state)
        for bound, c, recipe in feasible:
            if prune and bound >= best_step[0] and c != given:
                pruned["bound"] = pruned.get("bound", 0) + 1
                tell(state)
                continue
            rec = journal.get(c.canonical()) if journal is not None else None
            if rec is not None:
                accept(c, rec, True)
                tell(state)
                continue
            state.running += 1
            best = best_step[0] if prune and c != given else math.inf
            yield ("sim", req, c, recipe, best, known.get(_layout_key(req, c), {}))

    try:
        results = pool.stream(
            _work,
            feed(),
            scheduler=scheduler,
            workers=workers,
            close_fds=[journal.lock_fd] if journal is not None and journal.lock_fd else [],
            name=_name,
            lazy=True,
            killed=_killed_item,
            what="plan",
            resume=(
                f"the candidates simulated so far are kept in {journal.path}: run the same "
                "command again to resume"
                if journal is not None
                else "give --out DIR to keep them"
            ),
        )
        for got_one in results:
            if got_one is not None:
                item, answer = got_one
                if item[0] == "screen":
                    took(item[4], answer)
                    continue
                for k, v in (answer.pop("_collectives", None) or {}).items():
                    known.setdefault(k[1], {})[k] = v
                if answer.get("_pruned"):  # its bound with communication lost
                    state.running -= 1
                    pruned["comm_bound"] = pruned.get("comm_bound", 0) + 1
                else:
                    state.running -= 1
                    accept(item[2], answer, False)
            tell(state)
    finally:
        if journal is not None:
            journal.close()
    order = {c: i for i, (_, c, _) in enumerate(feasible)}
    done.sort(key=lambda r: order[r["_candidate"]])
    if prune:  # what a single worker would have simulated: the same ranking for any number
        best, kept = math.inf, []
        for r in done:
            c = r["_candidate"]
            if c != given and max(bounds[c], r.get("comm_bound_s", 0.0)) >= best:
                out_plan.outranked += 1
                continue
            kept.append(r)
            if r.get("predicted_step_s"):
                best = min(best, r["predicted_step_s"])
        done = kept
    ran = [r for r in done if r.get("predicted_tokens_per_s_per_gpu")]
    spec = node.gpu
    probe = (
        GpuKernels.from_gpu(spec, f"{req.where}: {preset}"),
        precision_of(req.precision.upper(), base),
    )
    for r in ran:
        r["fits"] = r["memory_margin_bytes"] >= 0
        r["mfu"] = _mfu(r, probe)
    ok = sorted(
        (r for r in ran if r["fits"]),
        key=lambda r: (-r["predicted_tokens_per_s_per_gpu"], order[r["_candidate"]]),
    )
    for rank, r in enumerate(ok, start=1):
        r["rank"] = rank
    pruned["failed"] = len(done) - len(ran)
    out_plan.pruned = {k: v for k, v in pruned.items() if v}
    if given is not None:
        mine = next((r for r in done if r["_candidate"] == given), None)
        if mine is not None and "rank" not in mine and mine.get("predicted_tokens_per_s_per_gpu"):
            # where it would stand among the fitting candidates (it does not fit itself)
            mine["rank"] = 1 + sum(
                r["predicted_tokens_per_s_per_gpu"] > mine["predicted_tokens_per_s_per_gpu"]
                for r in ok
            )
        out_plan.given = mine if mine is not None else {"reason": given_reason or "not simulated"}
    for r in done:
        c = r.pop("_candidate", None)
        if c is not None:
            r["vp"] = c.vp
    out_plan.candidates = ok
    if out is not None:
        from sim.training.plan_report import write

        out_plan.files = write(out_plan, out)
    return out_plan


def _check_grid(req: Request, grid: dict[str, tuple] | None) -> None:
    unknown = sorted(set(grid or {}) - set(GRID))
    if unknown:
        raise ConfigError(f"{req.where}: grid: unknown key(s) {unknown} (keys: {sorted(GRID)})")
    for d in (grid or {}).get("dispatcher", ()):
        if d not in DISPATCHER:
            raise ConfigError(
                f"{req.where}: grid: dispatcher {d!r}: the step model tells apart "
                f"{', '.join(DISPATCHER)} (allgather and hybridep move tokens as alltoall)"
            )


def _mfu(r: dict[str, Any], probe: tuple[Any, Any]) -> float:
    """Model FLOPs per second per GPU over the dense peak of the run's GEMM dtype;
    `probe`: the GPU's kernels and the run's precision."""
    gpu, prec = probe
    peak = gpu.peak.get(prec.gemm) or gpu.peak["bf16"]
    return float(r["predicted_tflops_per_gpu"]) * 1e12 / peak


def parse_layout(text: str, where: str = "--layout") -> Candidate:
    """`tp=1,pp=2,vp=12,ep=8,mbs=1[,cp=1,overlap=on,recompute=none,fsdp=off,
    dispatcher=deepep,sms=24]` as a candidate."""
    vals: dict[str, Any] = {"tp": 1, "cp": 1, "pp": 1, "vp": 1, "ep": 1, "mbs": 1}
    extra: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        if "=" not in part:
            raise ConfigError(f"{where}: {part!r}: expected KEY=VALUE")
        k, v = (x.strip() for x in part.split("=", 1))
        if k in vals:
            try:
                vals[k] = int(v)
            except ValueError:
                raise ConfigError(f"{where}: {k}: expected an integer, got {v!r}") from None
            if vals[k] < 1:
                raise ConfigError(f"{where}: {k}: expected an integer >= 1, got {v!r}")
        elif k == "overlap":
            if v not in ("on", "off", "true", "false"):
                raise ConfigError(f"{where}: overlap: expected on or off, got {v!r}")
            extra["ep_overlap"] = v in ("on", "true")
        elif k == "fsdp":
            if v not in ("on", "off", "true", "false"):
                raise ConfigError(f"{where}: fsdp: expected on or off, got {v!r}")
            extra["fsdp"] = v in ("on", "true")
        elif k == "recompute":
            if v not in RECOMPUTE:
                raise ConfigError(f"{where}: recompute: expected one of {RECOMPUTE}, got {v!r}")
            extra["recompute"] = v
        elif k == "dispatcher":
            if v not in DISPATCHER:
                raise ConfigError(f"{where}: dispatcher: expected one of {DISPATCHER}, got {v!r}")
            extra["dispatcher"] = v
        elif k == "sms":
            if not v.isdigit():
                raise ConfigError(f"{where}: sms: expected an integer >= 0, got {v!r}")
            extra["comm_sms"] = int(v)
        else:
            raise ConfigError(
                f"{where}: unknown key {k!r} (keys: {', '.join(LAYOUT_KEYS)}, overlap, "
                "recompute, fsdp, dispatcher, sms)"
            )
    return Candidate(**vals, **extra)


def check_request(req: Request) -> None:
    """One-line errors for sizes no layout can take."""
    for k in ("gpus", "gbs", "seq_len"):
        v = getattr(req, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{req.where}: {k}: expected an integer >= 1, got {v!r}")


def parse_grid(items: list[str], where: str = "--grid") -> dict[str, tuple]:
    """`KEY=V1,V2,...` items (e.g. `pp=1,2,4`, `dispatcher=deepep`, `comm_sms=16,24,32`) as
    the values a plan tries for those keys (the others: GRID's)."""
    grid: dict[str, tuple] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{where}: {item!r}: expected KEY=V1,V2,...")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in GRID:
            raise ConfigError(f"{where}: unknown key {k!r} (keys: {', '.join(GRID)})")
        vals = [x.strip() for x in v.split(",") if x.strip()]
        if not vals:
            raise ConfigError(f"{where}: {k}: no values")
        if isinstance(GRID[k][0], int):
            try:
                grid[k] = tuple(int(x) for x in vals)
            except ValueError:
                raise ConfigError(f"{where}: {k}: expected integers, got {v!r}") from None
            if min(grid[k]) < (0 if k == "comm_sms" else 1):
                raise ConfigError(f"{where}: {k}: expected integers >= 1, got {v!r}")
        else:
            allowed = {"recompute": RECOMPUTE, "dispatcher": DISPATCHER}[k]
            bad = [x for x in vals if x not in allowed]
            if bad:
                raise ConfigError(f"{where}: {k}: {bad[0]!r} is not one of {', '.join(allowed)}")
            grid[k] = tuple(vals)
    return grid
