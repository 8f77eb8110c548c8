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
   is no better than the best step simulated so far cannot win and is not simulated.
4. Rank the simulated ones by tokens/s/GPU.

Candidates that differ only in their communication choices (EP overlap, dispatcher, SMs)
share one memory model and one bound (both leave communication out). The simulations run on
local processes or a Dask cluster (`sim.core.pool`, shared with `moesim sweep`), as many at
a time as there are workers, the next one picked when one finishes. With `out`, every
simulated candidate is journaled as it finishes (`sim.training.plan_store`) and a plan run
again with the same request takes it from there instead of simulating it again.

Each candidate is a row of `moesim predict` (`sim.training.predict`) with a recipe of its
choices, so the best one is written as a table row `predict` takes.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, MoesimError
from sim.training.predict import MODELS, SYSTEMS, _lookup, predict_run, prepare
from sim.training.recipe import Recipe, recipe_for

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
    files: dict[str, Any] = field(default_factory=dict)  # written with `out`

    def as_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.__dict__,
            "considered": self.considered,
            "simulated": self.simulated,
            "resumed": self.resumed,
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
    modules: tuple[str, ...] = ()
    if c.recompute == "selective":
        modules = base.recompute_modules or (("mla_up_proj",) if mla else ("layernorm", "moe_act"))
    return replace(
        base,
        ep_overlap=c.ep_overlap,
        dispatcher=c.dispatcher or base.dispatcher,
        comm_sms=c.comm_sms or None,
        recompute_modules=modules,
        recompute_full=c.recompute == "full",
        recompute_layers=None,
        offload_layers=0,
        pipeline_layout="",
        source=f"plan: {c.label()}",
    )


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


def _evaluate(args: tuple[Request, Candidate, Recipe]) -> dict[str, Any]:
    """Simulate one candidate (in a worker): its row of predictions, or its reason."""
    req, c, recipe = args
    rec: dict[str, Any] = {**_row(req, c), **_choices(c)}
    try:
        from sim.training.predict import parse_row

        run = parse_row({k: str(v) for k, v in _row(req, c).items()}, 1)
        rec.update(predict_run(run, recipe))
    except MoesimError as e:
        rec["reason"] = str(e)
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
    from sim.hardware.topology import Topology
    from sim.training.memory import step_memory
    from sim.training.predict import parse_row
    from sim.training.step import StepModel
    from sim.workload.architectures import architecture

    check_request(req)
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ConfigError(f"{req.where}: workers: expected an integer >= 1, got {workers!r}")
    arch = architecture(_lookup(MODELS, req.model, "model", req.where))
    preset = _lookup(SYSTEMS, req.system, "system", req.where)
    node = Topology.load(preset, nodes=1)
    base = recipe_for(req.model, req.system, req.precision)
    base = replace(base, etp=1, mtp=None)
    _check_grid(req, grid)
    if given is not None and arch.moe and given.ep > 1 and not given.dispatcher:
        given = replace(given, dispatcher=base.dispatcher)
    out_plan = Plan(req)
    state = Progress()
    tell = progress or (lambda s: None)
    given_reason = ""
    pruned = state.pruned
    feasible: list[tuple[float, Candidate, Recipe]] = []
    probe = None
    space = list(candidates(req, arch, min(8, node.gpus_per_node), grid))
    if given is not None and given.key() not in {c.key() for c in space}:
        space.append(given)
    state.total = len(space)
    tell(state)
    screened: dict[tuple, tuple[bool, float] | str] = {}  # screen_key -> (fits, bound) | reason
    for c in space:
        out_plan.considered += 1
        state.screened += 1
        recipe = _recipe(base, c, arch.mla is not None)
        got = screened.get(c.screen_key())
        if got is None:
            try:
                run = parse_row({k: str(v) for k, v in _row(req, c).items()}, 1)
                p = prepare(run, recipe)
                if c.tp > p.topo.gpus_per_node:
                    raise ConfigError(f"{req.where}: tp {c.tp} beyond a node")
            except MoesimError as e:
                got = str(e)
            else:
                probe = probe or p
                # collectives free: memory needs none, and the bound leaves them out
                model = StepModel(p.arch, p.layout, p.precision, p.recipe, p.gpu, _FreeComm())
                works = model.chunk_work()
                got = (step_memory(model, works).fits, lower_bound(model, works))
            screened[c.screen_key()] = got
        if isinstance(got, str):
            pruned["invalid"] = pruned.get("invalid", 0) + 1
            if c == given:
                given_reason = got
        elif not got[0] and c != given:
            pruned["memory"] = pruned.get("memory", 0) + 1
        else:
            feasible.append((got[1], c, recipe))
        tell(state)
    if not space:
        g = {**GRID, **(grid or {})}
        raise ConfigError(
            f"{req.where}: no layout divides {req.gpus} GPUs with GBS {req.gbs} and sequence "
            f"{req.seq_len}: tried TP {g['tp']} x CP {g['cp']} x PP {g['pp']} x MBS {g['mbs']}"
        )
    if not feasible:
        tried = ", ".join(f"{k} {v}" for k, v in sorted(pruned.items())) or "none"
        raise ConfigError(
            f"{req.where}: no layout of {req.model} on {req.gpus} GPUs of {req.system} fits: "
            f"{out_plan.considered} candidates, dropped for {tried}"
        )
    feasible.sort(key=lambda t: t[0])
    bounds = {c: bound for bound, c, _ in feasible}
    best_step = [math.inf]
    done: list[dict[str, Any]] = []
    state.phase = "simulating"

    journal = None
    if out is not None:
        from sim.training.plan_store import Journal, fingerprint

        journal = Journal(out, fingerprint(asdict(req), preset))

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

    def feed() -> Iterator[tuple[Request, Candidate, Recipe]]:
        """The candidates to simulate, in the order of their bounds: those that can still
        win when their turn comes (the journal's taken from it, not simulated)."""
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
            yield (req, c, recipe)

    try:
        from sim.core import pool

        results = pool.stream(
            _evaluate,
            feed(),
            scheduler=scheduler,
            workers=workers,
            close_fds=[journal.lock_fd] if journal is not None and journal.lock_fd else [],
            name=lambda item: item[1].canonical().replace(",", "-").replace("=", ""),
            lazy=True,
            killed=_killed,
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
                (_, c, _), rec = got_one
                state.running -= 1
                accept(c, rec, False)
            tell(state)
    finally:
        if journal is not None:
            journal.close()
    ran = [r for r in done if r.get("predicted_tokens_per_s_per_gpu")]
    for r in ran:
        r["fits"] = r["memory_margin_bytes"] >= 0
        r["mfu"] = _mfu(r, probe)
    ok = sorted((r for r in ran if r["fits"]), key=lambda r: -r["predicted_tokens_per_s_per_gpu"])
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


def _mfu(r: dict[str, Any], p: Any) -> float | None:
    """Model FLOPs per second per GPU over the dense peak of the run's GEMM dtype."""
    if p is None:
        return None
    peak = p.gpu.peak.get(p.precision.gemm) or p.gpu.peak["bf16"]
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
