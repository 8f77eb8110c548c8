"""`moesim plan`: the fastest layout and overlap choices for a model on a cluster, within
memory, found by simulating the candidates that could win.

1. Enumerate: every layout that divides the GPUs (TP inside a node and dividing the heads,
   CP, PP with the virtual stages the layers allow, EP dividing the experts, micro-batch
   sizes that divide the batch) times the MoE and memory choices (EP overlap on or off,
   where Megatron-Core runs it: `overlap_refusal`; the EP dispatcher: NCCL's all-to-all,
   DeepEP's kernels, and HybridEP's where the GPU gives their share of the links; the SMs
   DeepEP's kernels hold; recomputation none / the recipe's selective modules / full) and
   the pipeline schedule:
   Megatron-Core's 1F1B, or DualPipe / DualPipeV where the layout runs them (vp 1, pp >= 2,
   even for DualPipe, enough micro-batches: `sim.training.pipeline_kind`). Each candidate
   runs on the hardware queues Megatron-Bridge's scripts give it (one on Hopper where TP
   or CP communication overlaps GEMMs without EP overlap, `recipe.bridge_queues`), or on
   those `--grid queues=...` / `--layout ...,queues=N` name: the step model has no gain
   from fewer queues (it does not schedule a kernel ahead of the host's order), so
   searching them is the user's call. Not searched, because the training step model
   does not tell them apart: the all-gather dispatcher (its tokens move as the
   all-to-all's) and the SMs of NCCL's all-to-all (its simulated time does not depend on
   them, so fewer would always win).
2. Drop what cannot run: a candidate whose peak memory (`sim.training.memory`, no simulation
   needed) exceeds the GPU's. Where full recomputation fits and recomputing nothing does
   not, add the fewest layers per model chunk fully recomputed that fit (Megatron-Core's
   block method; `sim.training.plan_partial`: a search on the memory model).
3. Bound: a candidate's step is at least its busiest stage's kernel time over the step plus
   the pipeline's fill and drain (`lower_bound`; the simulated step adds communication and
   host time to that), and at least that with the EP all-to-alls its compute waits for and
   its TP, CP and FSDP traffic, each collective at its floor (`comm_bound` over
   `FloorTimer`, `sim.training.comm_floor`: the bytes over the busiest link of the
   collective's flows, per-message costs and latency included, with no simulation). The
   candidates are simulated in the order of the larger of the two (`sim.training.
   plan_order`: the lowest first, so that the best step found tightens early; the floors
   computed, in chunks on the pool, as the order reaches a candidate whose compute bound
   can still win); one whose bound is no better than the best step of the candidates
   ahead of it cannot win and is not simulated (`bound` where the compute bound alone says
   so, else `comm_floor`). Just before simulating, a worker simulates the candidate's
   collectives (the simulation needs them anyway) and bounds its step again with them
   (`comm_bound`); no better than the best step when it was sent, it is not simulated
   either (`comm_bound`).
4. Rank the simulated ones by tokens/s/GPU.

Candidates that differ only in their communication choices (EP overlap, dispatcher, SMs)
share one memory model and one compute bound, and candidates share the work of their layers
(`Screener`: a layer's kernels depend on TP, CP, EP, the micro-batch and its kind, not on
the pipeline) and, with their collectives at their floor, the phases of a layout's layers.
Screening (steps 2 and 3) and the simulations run on the same pool, local processes or a
Dask cluster (`sim.core.pool`, shared with `moesim sweep`): the distinct memory-and-bound
questions in chunks first, then the candidates' floors and simulations in the order of their
bounds, as many at a time as there are workers, the next one picked when one finishes. A
worker's process keeps the collectives it simulated (`sim.training.comm`), which candidates
of one layout share; the main process sends them with the layout's later candidates to
whichever worker runs them, and holds the layout's other candidates back while its first one
is running (layout-affine: a layout's collectives are simulated once, not by two workers
side by side). The ranking does not depend on the number of workers: with several, a
candidate may be simulated that a single worker would have pruned (a bound beaten by a
result still running); it is left out of the ranking (counted in `outranked`). With `out`,
every simulated candidate is journaled as it finishes (`sim.training.plan_store`) and a plan
run again with the same request takes it from there instead of simulating it again.

Each candidate is a row of `moesim predict` (`sim.training.predict`) with a recipe of its
choices, so the best one is written as a table row `predict` takes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.training.plan_gpu import mfu, precision_probe
from sim.training.plan_order import WAIT, Entry, SimOrder
from sim.training.plan_partial import Partial
from sim.training.plan_partial import check_given as check_partial
from sim.training.plan_space import (
    SCREEN_CHUNK,
    Candidate,
    Request,
    base_recipe,
    candidates,
    check_given,
    check_grid,
    check_request,
    plan_grid,
    recipe_of,
)
from sim.training.plan_work import Item, item_name, killed_item, layout_key, work
from sim.training.predict import MODELS, SYSTEMS, _lookup


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
    # with `out`: the top candidates' steps simulated again for the page (plan_timeline),
    # or why they could not be
    timelines: list[Any] = field(default_factory=list)
    timeline_note: str = ""
    # full recomputation of the fewest layers that fit (`sim.training.plan_partial`): layouts
    # searched, found, candidates added
    partial: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.__dict__,
            "considered": self.considered,
            "simulated": self.simulated,
            "resumed": self.resumed,
            "outranked": self.outranked,
            "pruned": dict(self.pruned),
            "partial_recompute": dict(self.partial),
            "candidates": self.candidates,
            "given": self.given,
        }


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
    from sim.training.predict import _topology
    from sim.workload.architectures import architecture

    check_request(req)
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ConfigError(f"{req.where}: workers: expected an integer >= 1, got {workers!r}")
    arch = architecture(_lookup(MODELS, req.model, "model", req.where))
    preset = _lookup(SYSTEMS, req.system, "system", req.where)
    node = _topology(preset, 1)
    base = base_recipe(req)
    probe = precision_probe(req, preset, node.gpu, base)
    check_grid(req, grid, probe[0].sms, arch.layers)
    if given is not None and arch.moe and given.ep > 1 and not given.dispatcher:
        given = replace(given, dispatcher=base.dispatcher)
    if given is not None:
        check_given(req, given, probe[0].sms, arch.layers, base.recompute_modules)
        check_partial(req, given, arch.layers, base)
    out_plan = Plan(req)
    state = Progress()
    tell = progress or (lambda s: None)
    pruned = state.pruned
    gpn = min(8, node.gpus_per_node)
    g = plan_grid(base, grid, probe[0].hybridep_link_share > 0)
    space = list(candidates(req, arch, gpn, g, base.recompute_modules))
    if given is not None and given.key() not in {c.key() for c in space}:
        space.append(given)
    if not space:
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
    part = Partial(space, share, screened)  # full recomputation of the fewest layers that fit
    entries: list[Entry] = []
    order = SimOrder([], given, prune)
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
        nonlocal given_reason, order
        for at, c in enumerate(space):
            got = screened[c.screen_key()]
            if isinstance(got, str):
                pruned["invalid"] = pruned.get("invalid", 0) + 1
                if c == given:
                    given_reason = got
            elif not got[0] and c != given:
                pruned["memory"] = pruned.get("memory", 0) + 1
            else:
                recipe = recipe_of(base, c, arch.mla is not None)
                entries.append(Entry(got[1], c, recipe, layout_key(req, c), at))
        if not entries:
            tried = ", ".join(f"{k} {v}" for k, v in sorted(pruned.items())) or "none"
            raise ConfigError(
                f"{req.where}: no layout of {req.model} on {req.gpus} GPUs of {req.system} "
                f"fits: {out_plan.considered} candidates, dropped for {tried}"
            )
        order = SimOrder(entries, given, prune)

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
        e = order.entries[c]
        rec["lower_bound_s"], rec["comm_floor_s"] = e.lower, e.floor
        rec["_candidate"] = c
        done.append(rec)
        # a given layout that does not fit is ranked, never a step the others must beat
        fits = rec.get("memory_margin_bytes", 0.0) >= 0
        order.back(c, rec.get("predicted_step_s") if fits else None)

    def drop(e: Entry, why: str) -> None:
        pruned[why] = pruned.get(why, 0) + 1

    def resumed(e: Entry) -> bool:
        rec = journal.get(e.c.canonical()) if journal is not None else None
        if rec is not None:
            accept(e.c, rec, True)
        return rec is not None

    def feed() -> Iterator[Item]:
        """The chunks to screen; once all are back, the candidates to simulate in the order
        of their bounds (`SimOrder`): those that can still win when their turn comes (the
        journal's taken from it, not simulated)."""
        for i, chunk in enumerate(chunks):
            yield ("screen", i, req, base, chunk)
        while len(screened) < len(firsts):
            yield pool.WAIT
        for i, ask in enumerate(part.chunks(size)):
            yield ("partial", i, req, base, ask)
        while part.waiting:
            yield pool.WAIT
        out_plan.partial = part.summary()
        rank_screened()
        state.phase = "simulating"
        tell(state)
        asked = 0
        while True:
            e = order.next(drop, resumed)
            tell(state)
            if e is None:
                return
            if e is WAIT:  # each one left waits on a floor or on its layout's first candidate
                yield pool.WAIT
                continue
            if isinstance(e, list):  # the next candidates' floors, computed on the pool
                asked += 1
                yield ("floor", asked, req, base, [x.c for x in e])
                continue
            state.running += 1
            limit = order.limit(e.c)
            yield ("sim", req, e.c, e.recipe, limit, known.get(e.layout, {}))

    try:
        results = pool.stream(
            work,
            feed(),
            scheduler=scheduler,
            workers=workers,
            close_fds=[journal.lock_fd] if journal is not None and journal.lock_fd else [],
            name=item_name,
            lazy=True,
            killed=killed_item,
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
                if item[0] == "floor":
                    order.floors(item[4], answer)
                    continue
                if item[0] == "partial":
                    added = part.took(item[4], answer)
                    state.screened += added
                    out_plan.considered = state.total = state.total + added
                    continue
                for k, v in (answer.pop("_collectives", None) or {}).items():
                    known.setdefault(k[1], {})[k] = v
                if answer.get("_pruned"):  # its bound with communication lost
                    state.running -= 1
                    pruned["comm_bound"] = pruned.get("comm_bound", 0) + 1
                    order.back(item[2], None)
                else:
                    state.running -= 1
                    accept(item[2], answer, False)
            tell(state)
    finally:
        if journal is not None:
            journal.close()

    def place(r: dict[str, Any]) -> tuple[float, int]:
        return order.entries[r["_candidate"]].place

    done.sort(key=place)
    if prune:  # what a single worker would have simulated: the same ranking for any number
        best, kept = math.inf, []
        for r in done:
            c = r["_candidate"]
            key = order.entries[c].key
            if c != given and max(key, r.get("comm_bound_s", 0.0)) >= best:
                out_plan.outranked += 1
                continue
            kept.append(r)
            if r.get("predicted_step_s") and r.get("memory_margin_bytes", 0.0) >= 0:
                best = min(best, r["predicted_step_s"])
        done = kept
    ran = [r for r in done if r.get("predicted_tokens_per_s_per_gpu")]
    for r in ran:
        r["fits"] = r["memory_margin_bytes"] >= 0
        r["mfu"] = mfu(r, probe)
    ok = sorted(
        (r for r in ran if r["fits"]),
        key=lambda r: (-r["predicted_tokens_per_s_per_gpu"], place(r)),
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
    if out is not None and ok:
        from sim.core.errors import MoesimError
        from sim.training.plan_timeline import TOP, timelines

        top = [(r["_candidate"], r["predicted_step_s"]) for r in ok[:TOP]]
        try:
            out_plan.timelines = timelines(req, top, known)
        except MoesimError as e:  # the page says why; the plan itself stands
            out_plan.timeline_note = f"timelines not drawn: {' '.join(str(e).split())}"
    for r in done:
        c = r.pop("_candidate", None)
        if c is not None:
            r["vp"] = c.vp
    out_plan.candidates = ok
    if out is not None:
        from sim.training.plan_report import write

        out_plan.files = write(out_plan, out)
    return out_plan
