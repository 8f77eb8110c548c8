"""`moesim plan`: the fastest layout and overlap choices for a model on a cluster, within
memory, found by simulating the candidates that could win.

1. Enumerate: every layout that divides the GPUs (TP inside a node and dividing the heads,
   CP, PP with the virtual stages the layers allow, EP dividing the experts, micro-batch
   sizes that divide the batch) times the MoE and memory choices (EP overlap on or off,
   recomputation none / the recipe's selective modules / full).
2. Drop what cannot run: a candidate whose peak memory (`sim.training.memory`, no simulation
   needed) exceeds the GPU's.
3. Bound: a candidate's step is at least its busiest stage's kernel time over the step plus
   the pipeline's fill and drain (`lower_bound`; the simulated step adds communication and
   host time to that). Candidates are simulated in the order of their bounds; one whose bound
   is no better than the best step simulated so far cannot win and is not simulated.
4. Rank the simulated ones by tokens/s/GPU.

Each candidate is a row of `moesim predict` (`sim.training.predict`) with a recipe of its
choices, so the best one is written as a table row `predict` takes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
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

    def key(self) -> tuple:
        return tuple(vars(self).values())

    def label(self) -> str:
        s = f"TP{self.tp} CP{self.cp} PP{self.pp} VP{self.vp} EP{self.ep} MBS{self.mbs}"
        s += " FSDP" if self.fsdp else ""
        return s + (" overlap" if self.ep_overlap else "") + f" recompute={self.recompute}"


@dataclass
class Plan:
    request: Request
    candidates: list[dict[str, Any]] = field(default_factory=list)  # simulated, ranked
    considered: int = 0
    simulated: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    given: dict[str, Any] | None = None  # the --layout candidate, scored and ranked

    def as_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.__dict__,
            "considered": self.considered,
            "simulated": self.simulated,
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
            for ov, rc, fs in itertools.product(overlaps, g["recompute"], shards):
                yield Candidate(tp, cp, pp, vp, ep, mbs, ov, rc, fs)


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
    """Simulate one candidate (in a worker process): its row of predictions, or its reason."""
    req, c, recipe = args
    rec: dict[str, Any] = {**_row(req, c), "ep_overlap": c.ep_overlap, "recompute": c.recompute}
    try:
        from sim.training.predict import parse_row

        run = parse_row({k: str(v) for k, v in _row(req, c).items()}, 1)
        rec.update(predict_run(run, recipe))
    except MoesimError as e:
        rec["reason"] = str(e)
    return rec


def plan(
    req: Request,
    given: Candidate | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    grid: dict[str, tuple] | None = None,
    prune: bool = True,
) -> Plan:
    """The ranked plan of a request (see the module docstring). `grid` narrows the values
    tried; `prune=False` simulates every candidate that fits (the exhaustive search the
    pruned one must agree with)."""
    from sim.hardware.topology import Topology
    from sim.training.memory import step_memory
    from sim.training.predict import parse_row
    from sim.training.step import StepModel
    from sim.workload.architectures import architecture

    check_request(req)
    arch = architecture(_lookup(MODELS, req.model, "model", req.where))
    node = Topology.load(_lookup(SYSTEMS, req.system, "system", req.where), nodes=1)
    base = recipe_for(req.model, req.system, req.precision)
    base = replace(base, etp=1, mtp=None)
    out = Plan(req)
    given_reason = ""
    pruned: dict[str, int] = {}
    feasible: list[tuple[float, Candidate, Recipe]] = []
    probe = None
    unknown = sorted(set(grid or {}) - set(GRID))
    if unknown:
        raise ConfigError(f"{req.where}: grid: unknown key(s) {unknown} (keys: {sorted(GRID)})")
    space = list(candidates(req, arch, min(8, node.gpus_per_node), grid))
    if given is not None and given.key() not in {c.key() for c in space}:
        space.append(given)
    for c in space:
        out.considered += 1
        recipe = _recipe(base, c, arch.mla is not None)
        try:
            run = parse_row({k: str(v) for k, v in _row(req, c).items()}, 1)
            p = prepare(run, recipe)
        except MoesimError as e:
            pruned["invalid"] = pruned.get("invalid", 0) + 1
            if c == given:
                given_reason = str(e)
            continue
        if probe is None:
            probe = p
        if c.tp > p.topo.gpus_per_node:
            pruned["invalid"] = pruned.get("invalid", 0) + 1
            continue
        # collectives free: memory needs none, and the bound leaves them out
        model = StepModel(p.arch, p.layout, p.precision, p.recipe, p.gpu, _FreeComm())
        works = model.chunk_work()
        mem = step_memory(model, works)
        if not mem.fits and c != given:
            pruned["memory"] = pruned.get("memory", 0) + 1
            continue
        feasible.append((lower_bound(model, works), c, recipe))
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
            f"{out.considered} candidates, dropped for {tried}"
        )
    feasible.sort(key=lambda t: t[0])
    best_step = math.inf
    done: list[dict[str, Any]] = []
    batch = max(1, workers)
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        i = 0
        while i < len(feasible):
            chunk: list[tuple[Request, Candidate, Recipe]] = []
            bounds: list[float] = []
            while i < len(feasible) and len(chunk) < batch:
                bound, c, recipe = feasible[i]
                i += 1
                if prune and bound >= best_step and c != given:
                    pruned["bound"] = pruned.get("bound", 0) + 1
                    continue
                chunk.append((req, c, recipe))
                bounds.append(bound)
            jobs = pool.map(_evaluate, chunk) if pool else map(_evaluate, chunk)
            for (_, c, _), bound, rec in zip(chunk, bounds, jobs):
                out.simulated += 1
                rec["lower_bound_s"] = bound
                rec["_candidate"] = c
                done.append(rec)
                if rec.get("predicted_step_s"):
                    best_step = min(best_step, rec["predicted_step_s"])
            if progress is not None:
                progress(i, len(feasible))
    finally:
        if pool is not None:
            pool.shutdown()
    ran = [r for r in done if r.get("predicted_tokens_per_s_per_gpu")]
    for r in ran:
        r["fits"] = r["memory_margin_bytes"] >= 0
        r["mfu"] = _mfu(r, probe)
    ok = sorted((r for r in ran if r["fits"]), key=lambda r: -r["predicted_tokens_per_s_per_gpu"])
    for rank, r in enumerate(ok, start=1):
        r["rank"] = rank
    pruned["failed"] = len(done) - len(ran)
    out.pruned = {k: v for k, v in pruned.items() if v}
    if given is not None:
        mine = next((r for r in done if r["_candidate"] == given), None)
        if mine is not None and "rank" not in mine and mine.get("predicted_tokens_per_s_per_gpu"):
            # where it would stand among the fitting candidates (it does not fit itself)
            mine["rank"] = 1 + sum(
                r["predicted_tokens_per_s_per_gpu"] > mine["predicted_tokens_per_s_per_gpu"]
                for r in ok
            )
        out.given = mine if mine is not None else {"reason": given_reason or "not simulated"}
    for r in done:
        c = r.pop("_candidate", None)
        if c is not None:
            r["vp"] = c.vp
    out.candidates = ok
    return out


def _mfu(r: dict[str, Any], p: Any) -> float | None:
    """Model FLOPs per second per GPU over the dense peak of the run's GEMM dtype."""
    if p is None:
        return None
    peak = p.gpu.peak.get(p.precision.gemm) or p.gpu.peak["bf16"]
    return float(r["predicted_tflops_per_gpu"]) * 1e12 / peak


def parse_layout(text: str, where: str = "--layout") -> Candidate:
    """`tp=1,pp=2,vp=12,ep=8,mbs=1[,cp=1,overlap=on,recompute=none]` as a candidate."""
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
        else:
            raise ConfigError(
                f"{where}: unknown key {k!r} (keys: {', '.join(LAYOUT_KEYS)}, overlap, "
                "recompute, fsdp)"
            )
    return Candidate(**vals, **extra)


def check_request(req: Request) -> None:
    """One-line errors for sizes no layout can take."""
    for k in ("gpus", "gbs", "seq_len"):
        v = getattr(req, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{req.where}: {k}: expected an integer >= 1, got {v!r}")
