"""The work of `moesim plan`'s pool (`sim.training.plan`), done in a worker: screening a
chunk of candidates (peak memory and the compute bound, `sim.training.plan_bound`), the
bounds of a chunk with their collectives at their floor, and simulating one candidate after
its bound with its collectives simulated (`comm_bound`), as a row of predictions."""

from __future__ import annotations

import math
from typing import Any

from sim.core.errors import MoesimError
from sim.training.plan_bound import BoundModel, comm_bound, overlap_speed, screener
from sim.training.plan_space import Candidate, Request, base_recipe, candidate_row
from sim.training.predict import predict_run, prepare
from sim.training.recipe import Recipe

# the pool's tasks: ("screen", chunk number, request, recipe, [candidate, ...]), each the
# first of the candidates that share a memory-and-bound question; ("floor", number, request,
# recipe, [candidate, ...]); ("partial", number, request, recipe, [(candidate, whether it fits
# recomputing nothing: None unknown), ...]), the fewest layers of full recomputation that fit
# (`sim.training.plan_partial`); and ("sim", request, candidate, recipe, the step to beat, the
# collectives known of its layout)
Item = tuple[Any, ...]
CHUNKS = ("screen", "floor", "partial")  # the tasks of a chunk of candidates


def work(item: Item) -> Any:
    """A task of the pool (in a worker): a chunk of candidates screened (their answers),
    the floors of a chunk of candidates (`Screener.floor`), or one candidate simulated (its
    record)."""
    if item[0] in CHUNKS:
        _, _, req, base, cands = item
        s = screener(req, base)
        if item[0] == "partial":
            from sim.training.plan_partial import fewest_layers

            return [fewest_layers(s, c, none_fits) for c, none_fits in cands]
        return [s.screen(c) if item[0] == "screen" else s.floor(c) for c in cands]
    return evaluate(item[1:])


def item_name(item: Item) -> str:
    if item[0] in CHUNKS:
        return f"{item[0]}{item[1]}"
    return item[2].canonical().replace(",", "-").replace("=", "")


def killed_item(item: Item, e: Exception) -> Any:
    if item[0] in CHUNKS:
        raise MoesimError(f"plan: bounding stopped: a worker killed ({e})")
    return killed(item[1:4], e)


def layout_key(req: Request, c: Candidate) -> tuple:
    """The group sizes that key a candidate's collectives (`CommTimer.layout_key`'s)."""
    return (req.gpus, c.tp, c.cp, c.pp, c.ep, 1)


def evaluate(args: tuple) -> dict[str, Any]:
    """Simulate one candidate (in a worker): its row of predictions, or its reason. First its
    bound with communication (`comm_bound`, in `comm_bound_s`); where that is no better than
    `best` (the best step when it was sent, default none), the candidate is not simulated
    (`_pruned`)."""
    req, c, recipe = args[:3]
    best = args[3] if len(args) > 3 else math.inf
    known: dict[tuple, float] = args[4] if len(args) > 4 else {}
    rec: dict[str, Any] = {**candidate_row(req, c), **choice_columns(c)}
    try:
        from sim.training.predict import parse_row

        run = parse_row({k: str(v) for k, v in candidate_row(req, c).items()}, 1)
        p = prepare(run, recipe)
        rec["max_connections"] = p.recipe.max_connections  # the queues it runs on
        shared = p.comm.shared()
        for k, v in known.items():  # what other workers simulated of this layout
            shared.setdefault(k, v)
        mine = p.comm.layout_key()
        before = {k for k in shared if k[:2] == mine}
        rec["_collectives"] = lambda: {
            k: v for k, v in shared.items() if k[:2] == mine and k not in before
        }
        model = BoundModel(screener(req, base_recipe(req)), p)
        overlap, speed = overlap_speed(p)
        rec["comm_bound_s"] = comm_bound(model, model.chunk_work(), overlap, speed)
        if rec["comm_bound_s"] >= best:
            rec["_pruned"] = True
        else:
            rec.update(predict_run(run, recipe))
    except MoesimError as e:
        rec["reason"] = str(e)
    if "_collectives" in rec:  # the layout's collectives simulated here, for the others
        rec["_collectives"] = rec["_collectives"]()
    return rec


def choice_columns(c: Candidate) -> dict[str, Any]:
    return {
        "ep_overlap": c.ep_overlap,
        "recompute": c.recompute,
        "recompute_layers": c.recompute_layers,
        "dispatcher": c.dispatcher,
        "comm_sms": c.comm_sms,
        "offload": c.offload,
        "pipeline": c.pipeline,
    }


def killed(args: tuple[Request, Candidate, Recipe], e: Exception) -> dict[str, Any]:
    """The record of a candidate that killed its Dask workers every time it ran (not
    journaled: a resumed plan tries it again)."""
    req, c, _ = args
    return {
        **candidate_row(req, c),
        **choice_columns(c),
        "reason": f"worker killed: {e}",
        "_lost": True,
    }
