"""The space `moesim plan` searches (`sim.training.plan`): the layout grids and the
communication choices, a request and a candidate, the recipe a candidate runs, and the
checks of a grid and of a given layout (their text forms: `sim.training.plan_parse`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from sim.core.errors import ConfigError
from sim.hardware.costs.resources import MAX_CONNECTIONS
from sim.training.pipeline_kind import PIPELINES, check_pipeline, runs
from sim.training.recipe import Recipe, recipe_for
from sim.training.row_cells import with_choices

TP = (1, 2, 4, 8)
CP = (1, 2, 4)
PP = (1, 2, 4, 8, 16, 32)
VP = (1, 2, 3, 4, 5, 6, 8, 12)
EP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MBS = (1, 2, 4)
RECOMPUTE = ("none", "selective", "full")
DISPATCHER = ("alltoall", "deepep", "hybridep")  # the EP dispatchers the step model tells apart
SEARCHED_DISPATCHERS = ("alltoall", "deepep")  # and HybridEP where `plan_grid` says
COMM_SMS = (0,)  # SMs DeepEP's kernels hold; 0: DeepEP's default (sim.training.step)
# the GPU's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 1 to 32); 0: as Megatron-Bridge's
# scripts set them for the candidate (`recipe.bridge_queues`: one on Hopper where TP or CP
# communication overlaps without EP overlap). More queues never slow the step model, which
# knows no cost of a kernel scheduled out of the host's order, so the default searches none
QUEUES = (0,)
# layers whose activations go to the host (PP 1, no recomputation: Megatron-Core's limits);
# a plan adds the request's recipe's count (`plan_grid`)
OFFLOAD = (0,)
# the pipeline's schedule (`sim.training.pipeline_kind`): DualPipe and DualPipeV where the
# layout runs them (vp 1, pp >= 2, even for DualPipe, enough micro-batches)
PIPELINE = PIPELINES
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
    # whose recorded recipe the candidates start from (recipes.yaml); "": the newest recorded
    # for the model, system and precision
    release: str = ""


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
    offload: int = 0  # layers whose activations are offloaded to the host
    pipeline: str = "1f1b"  # 1f1b | dualpipe | dualpipev
    # with recompute full: the first N layers of each model chunk recomputed (0: every layer)
    recompute_layers: int = 0
    queues: int = 0  # the GPU's hardware queues; 0: as the scripts set them (QUEUES)

    def key(self) -> tuple:
        return tuple(vars(self).values())

    def canonical(self) -> str:
        """The candidate as text, every field named (offload and recompute_layers only where
        some, the pipeline only where not 1F1B): its key in a plan's journal (a journal
        written before those were choices still reads)."""
        default = {"offload": 0, "pipeline": "1f1b", "recompute_layers": 0, "queues": 0}
        return ",".join(
            f"{k}={v}" for k, v in vars(self).items() if k not in default or v != default[k]
        )

    def screen_key(self) -> tuple:
        """What the memory model and the bound read: not the communication choices."""
        return (
            self.tp,
            self.cp,
            self.pp,
            self.vp,
            self.ep,
            self.mbs,
            self.recompute,
            self.fsdp,
            self.offload,
            self.pipeline,
            self.recompute_layers,
        )

    def label(self) -> str:
        s = f"TP{self.tp} CP{self.cp} PP{self.pp} VP{self.vp} EP{self.ep} MBS{self.mbs}"
        s += " FSDP" if self.fsdp else ""
        s += f" {self.dispatcher}" if self.dispatcher and self.ep > 1 else ""
        s += f" sms={self.comm_sms}" if self.comm_sms else ""
        s += f" offload={self.offload}" if self.offload else ""
        s += f" {self.pipeline}" if self.pipeline != "1f1b" else ""
        s += " overlap" if self.ep_overlap else ""
        s += f" queues={self.queues}" if self.queues else ""
        n = self.recompute_layers
        return s + f" recompute={self.recompute}" + (f":{n}" if n else "")


def recipe_of(base: Recipe, c: Candidate, mla: bool) -> Recipe:
    """The candidate's recipe: the request's with the candidate's choices over it, the
    pipeline split evenly (the recipe's layout string is tuned for its published layout) and
    the candidate's offloading, as `moesim predict` builds a row with those choices
    (`best_choices`)."""
    choices = {
        **best_choices(c),
        "dispatcher": c.dispatcher or base.dispatcher,
        "max_connections": c.queues or None,  # None: the scripts' count for the candidate
    }
    return replace(with_choices(base, choices, mla), source=f"plan: {c.label()}")


def best_choices(c: Candidate) -> dict[str, Any]:
    """The candidate's choices as `moesim predict`'s CHOICES (a plan keeps the
    architecture's MTP modules whatever the recipe says: `base`'s mtp is None)."""
    out: dict[str, Any] = {
        "dispatcher": c.dispatcher,
        "ep_overlap": c.ep_overlap,
        "comm_sms": c.comm_sms,
        "recompute": c.recompute,
        "recompute_layers": c.recompute_layers,
        "pipeline_layout": "",
        "offload_layers": c.offload,
        "pipeline": c.pipeline,
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
    "dispatcher": SEARCHED_DISPATCHERS,
    "comm_sms": COMM_SMS,
    "queues": QUEUES,
    "offload": OFFLOAD,
    "pipeline": PIPELINE,
}


def plan_grid(
    base: Recipe, grid: dict[str, tuple] | None, hybridep: bool = False
) -> dict[str, tuple]:
    """The grid a plan searches: `grid` over GRID, with the request's recipe's offloaded
    layers as a choice besides none where the recipe offloads and `grid` does not say (the
    Megatron-Bridge recipes that offload, e.g. Llama 3 70B on GB200 with FSDP: 40 layers),
    and HybridEP among the dispatchers where `hybridep` (the GPU gives its kernels' share of
    the links, `gpu.kernels.hybridep_link_share`) and `grid` does not name them."""
    g = {**GRID, **(grid or {})}
    if base.offload_layers and "offload" not in (grid or {}):
        g["offload"] = (0, base.offload_layers)
    if hybridep and "dispatcher" not in (grid or {}):
        g["dispatcher"] = (*SEARCHED_DISPATCHERS, "hybridep")
    return g


def candidates(
    req: Request,
    arch: Any,
    gpus_per_node: int,
    grid: dict[str, tuple] | None = None,
    selective: tuple[str, ...] = (),
) -> Iterator[Candidate]:
    """Every layout and choice the request's sizes allow (unchecked beyond divisibility and
    Megatron-Core's own refusals: `overlap_refusal`, offloading), over `grid` (the module's
    value lists, or narrower ones); `selective`: the recipe's selectively recomputed
    modules."""
    g = {**GRID, **(grid or {})}
    offloads = sorted(set(g.get("offload", OFFLOAD)) | {0})
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
            comms = comm_choices(g) if arch.moe and ep > 1 else [("", 0)]
            ga = req.gbs // (mbs * dp)
            pipes = [k for k in g.get("pipeline", PIPELINE) if runs(k, pp, vp, ga, arch.layers)]
            for rc, fs, ov, (disp, sms), pl in itertools.product(
                g["recompute"], shards, overlaps, comms, pipes
            ):
                # Megatron-Core offloads only without a pipeline and without recomputation
                # (TransformerConfig.__post_init__), fewer layers than the model has
                for off, q in itertools.product(
                    offloads if pp == 1 and rc == "none" else (0,), g["queues"]
                ):
                    c = Candidate(tp, cp, pp, vp, ep, mbs, ov, rc, fs, disp, sms, off, pl, 0, q)
                    if off < arch.layers and not overlap_refusal(c, selective):
                        yield c


def overlap_refusal(c: Candidate, selective: tuple[str, ...] = ()) -> str:
    """Why Megatron-Core refuses its EP all-to-all overlap on this candidate ("": it runs it):
    `TransformerConfig.__post_init__` asserts, with `overlap_moe_expert_parallel_comm`, a
    virtual pipeline when pp > 1, no full recomputation and no recomputed `moe` module
    (`selective`: the modules the recipe's selective recomputation names). DualPipe's
    overlapped chunk pairs are its own schedule's, not Megatron-Core's."""
    if not c.ep_overlap or c.pipeline != "1f1b":
        return ""
    if c.pp > 1 and c.vp == 1:
        return "needs the interleaved schedule (vp > 1) with a pipeline (pp > 1)"
    if c.recompute == "full":
        return "refuses full recomputation"
    if c.recompute == "selective" and "moe" in selective:
        return "refuses the recomputed moe module"
    return ""


def comm_choices(g: dict[str, tuple]) -> list[tuple[str, int]]:
    """(dispatcher, SMs) pairs: SMs only for DeepEP, whose simulated kernels depend on them."""
    return [(d, sms) for d in g["dispatcher"] for sms in (g["comm_sms"] if d == "deepep" else (0,))]


def check_grid(req: Request, grid: dict[str, tuple] | None, sms: int = 0, layers: int = 0) -> None:
    """One-line errors for grid values no candidate can take; `sms`: the GPU's SM count (0:
    unknown), which the dispatcher's SMs must leave some of to the GEMMs; `layers`: the
    model's (0: unknown), which bound the layers offloaded."""
    unknown = sorted(set(grid or {}) - set(GRID))
    if unknown:
        raise ConfigError(f"{req.where}: grid: unknown key(s) {unknown} (keys: {sorted(GRID)})")
    many = [n for n in (grid or {}).get("offload", ()) if layers and n > layers]
    if many:
        raise ConfigError(f"{req.where}: grid: offload {many[0]}: the model has {layers} layers")
    many = [n for n in (grid or {}).get("queues", ()) if n > MAX_CONNECTIONS]
    if many:
        raise ConfigError(
            f"{req.where}: grid: queues {many[0]}: expected 1 to {MAX_CONNECTIONS} hardware "
            "queues (CUDA_DEVICE_MAX_CONNECTIONS), or 0 for the scripts' count"
        )
    over = [n for n in (grid or {}).get("comm_sms", ()) if sms and n >= sms]
    if over:
        raise ConfigError(
            f"{req.where}: grid: comm_sms {over[0]}: expected fewer than the GPU's {sms} SMs"
        )
    for pl in (grid or {}).get("pipeline", ()):
        if pl not in PIPELINES:
            raise ConfigError(f"{req.where}: grid: pipeline {pl!r}: expected one of {PIPELINES}")
    for d in (grid or {}).get("dispatcher", ()):
        if d not in DISPATCHER:
            raise ConfigError(
                f"{req.where}: grid: dispatcher {d!r}: the step model tells apart "
                f"{', '.join(DISPATCHER)} (allgather moves tokens as alltoall)"
            )


def check_given(
    req: Request, c: Candidate, sms: int, layers: int, selective: tuple[str, ...] = ()
) -> None:
    """One-line errors for a given layout's choices that mean nothing: SMs for a dispatcher
    that holds none (only DeepEP's kernels hold SMs), or not fewer than the GPU has; more
    offloaded layers than the model has, or offloading or the EP overlap where Megatron-Core
    refuses them (`overlap_refusal`); a pipeline schedule the layout cannot run
    (`pipeline_kind.check_pipeline`)."""
    why = overlap_refusal(c, selective)
    if why:
        raise ConfigError(
            f"{req.where}: --layout: overlap=on: Megatron-Core's EP all-to-all overlap {why}"
        )
    if c.pipeline != "1f1b":
        dp = req.gpus // (c.tp * c.cp * c.pp)
        # a batch that does not split is the layout's own error (`Layout`), not this one
        ga = req.gbs // (c.mbs * dp) if dp and req.gbs % (c.mbs * dp) == 0 else 1 << 30
        fsdp = dp if c.fsdp else 0
        check_pipeline(c.pipeline, c.pp, c.vp, ga, f"{req.where}: --layout", fsdp, layers)
    if c.offload > layers:
        raise ConfigError(
            f"{req.where}: --layout: offload={c.offload}: the model has {layers} layers"
        )
    if c.offload and (c.pp > 1 or c.recompute != "none"):
        raise ConfigError(
            f"{req.where}: --layout: offload={c.offload}: Megatron-Core offloads activations "
            "only without a pipeline (pp=1) and without recomputation"
        )
    if not c.comm_sms:
        return
    if c.dispatcher != "deepep":
        raise ConfigError(
            f"{req.where}: --layout: sms={c.comm_sms}: only the deepep dispatcher holds SMs "
            f"(this layout's: {c.dispatcher or 'none'}); add dispatcher=deepep or drop sms"
        )
    if sms and c.comm_sms >= sms:
        raise ConfigError(
            f"{req.where}: --layout: sms={c.comm_sms}: expected fewer than the GPU's {sms} SMs"
        )


def check_request(req: Request) -> None:
    """One-line errors for sizes no layout can take."""
    for k in ("gpus", "gbs", "seq_len"):
        v = getattr(req, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{req.where}: {k}: expected an integer >= 1, got {v!r}")


def candidate_row(req: Request, c: Candidate) -> dict[str, Any]:
    """The candidate as a row of `moesim predict`."""
    return {
        "release": req.release,
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


def base_recipe(req: Request) -> Recipe:
    """The recipe a request's candidates start from: the recorded one (its release's), expert-TP
    1 and the architecture's MTP modules."""
    rec = recipe_for(req.model, req.system, req.precision, req.release)
    return replace(rec, etp=1, mtp=None)
