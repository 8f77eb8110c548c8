"""How a run is executed beyond its layout: the settings of the Megatron-Bridge recipe that
change its speed (dispatcher, overlaps, recomputation, CUDA graphs, FP8 recipe, ...).

`recipes.yaml` records, per (model, system, precision) of the published table, what the
recipe in NVIDIA-NeMo/Megatron-Bridge `scripts/performance/` sets, with the file it comes
from. A row without an entry runs Megatron-Core's defaults as the performance scripts set them
for every model (`Recipe()`'s defaults, below).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sim.hardware.costs.resources import MAX_CONNECTIONS

DATA = Path(__file__).with_name("recipes.yaml")


@dataclass(frozen=True)
class Recipe:
    dispatcher: str = "alltoall"  # alltoall | allgather | deepep | hybridep
    ep_overlap: bool = False  # --overlap-moe-expert-parallel-comm (merged 1F1B)
    comm_sms: int | None = None  # SMs the EP dispatcher's kernels hold (None: its default)
    recompute_modules: tuple[str, ...] = ()  # --recompute-modules (selective)
    recompute_full: bool = False  # --recompute-granularity full
    recompute_layers: int | None = None  # full recompute of the first N layers per model chunk
    offload_layers: int = 0  # layers whose activations are offloaded to the host
    gpus_per_domain: int | None = None  # GPUs a job uses per NVLink domain (None: all)
    cuda_graph_scope: tuple[str, ...] = ()  # modules captured in CUDA graphs
    tp_comm_overlap: bool = False  # TP all-gather / reduce-scatter overlapped with GEMMs
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    grad_reduce_bytes: int = 4  # fp32 gradient reduction (grad_reduce_in_fp32)
    fp8_recipe: str = ""  # tensorwise | blockwise | mxfp8 | nvfp4 | "" (as the precision)
    fp8_param_gather: bool = False
    # Megatron-Core's --use-precision-aware-optimizer (Megatron-Bridge sets it for BF16 runs)
    # and the bytes of Adam's moments it keeps (`exp_avg_dtype`, `exp_avg_sq_dtype`)
    precision_aware_optimizer: bool = False
    exp_avg_bytes: int = 4
    exp_avg_sq_bytes: int = 4
    etp: int = 1  # expert tensor parallelism
    mtp: int | None = None  # MTP modules; None: the architecture's
    pipeline_layout: str = ""  # Megatron-Core's layout string (sim.training.stages)
    pipeline: str = "1f1b"  # 1f1b | dualpipe | dualpipev (sim.training.pipeline_kind)
    # the GPU's hardware queues the run's streams share (CUDA_DEVICE_MAX_CONNECTIONS, as the
    # recipe's row records it); None: as Megatron-Bridge's scripts set them (`bridge_queues`)
    max_connections: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    source: str = "defaults"
    notes: dict[str, Any] = field(default_factory=dict)


def _as_recipe(raw: dict[str, Any]) -> Recipe:
    kw: dict[str, Any] = {}
    if raw.get("dispatcher"):
        kw["dispatcher"] = str(raw["dispatcher"])
    for k in (
        "ep_overlap",
        "tp_comm_overlap",
        "overlap_grad_reduce",
        "overlap_param_gather",
        "fp8_param_gather",
        "account_for_embedding",
        "account_for_loss",
    ):
        if isinstance(raw.get(k), bool):
            kw[k] = raw[k]
    rc = raw.get("recompute") or {}
    if isinstance(rc, dict):  # a module list without granularity is inactive in Megatron-Core
        if rc.get("granularity") == "full":
            kw["recompute_full"] = True
            if isinstance(rc.get("num_layers"), int):
                kw["recompute_layers"] = rc["num_layers"]
        if rc.get("granularity") == "selective":
            kw["recompute_modules"] = tuple(str(m) for m in rc.get("modules") or ())
    cg = raw.get("cuda_graphs") or {}
    if isinstance(cg, dict) and cg.get("enable_cuda_graph") is True:
        kw["cuda_graph_scope"] = ("full",)  # Megatron-Core's per-layer graphs: whole layers
    elif isinstance(cg, dict) and cg.get("impl") not in (None, "none", False):
        scope = cg.get("scope") or ["full"]
        scopes = scope if isinstance(scope, list) else [scope]
        kw["cuda_graph_scope"] = tuple(str(x) for x in scopes)
    if raw.get("grad_reduce_dtype") == "bf16":
        kw["grad_reduce_bytes"] = 2
    if raw.get("fp8_recipe"):
        kw["fp8_recipe"] = str(raw["fp8_recipe"])
    other = raw.get("other") or {}
    off = other.get("activation_cpu_offloading") if isinstance(other, dict) else None
    if isinstance(off, dict) and isinstance(off.get("num_layers"), int):
        kw["offload_layers"] = off["num_layers"]
    kw.update(
        _optimizer(other.get("precision_aware_optimizer") if isinstance(other, dict) else None)
    )
    domain = (
        other.get("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN") if isinstance(other, dict) else None
    )
    if isinstance(domain, int) and domain > 0:
        kw["gpus_per_domain"] = domain
    queues = other.get("CUDA_DEVICE_MAX_CONNECTIONS") if isinstance(other, dict) else None
    if isinstance(queues, int) and 1 <= queues <= MAX_CONNECTIONS:
        kw["max_connections"] = queues
    etp = raw.get(
        "etp", other.get("expert_tensor_parallel_size") if isinstance(other, dict) else None
    )
    if isinstance(etp, int) and etp >= 1:
        kw["etp"] = etp
    if isinstance(raw.get("pipeline_layout"), str):
        kw["pipeline_layout"] = raw["pipeline_layout"]
    if isinstance(raw.get("mtp_layers"), int):
        kw["mtp"] = raw["mtp_layers"]
    kw["source"] = str(raw.get("source", "recipes.yaml"))
    known = {f.name for f in fields(Recipe)}
    kw["notes"] = {k: v for k, v in raw.items() if k not in known}
    return Recipe(**kw)


def _optimizer(raw: Any) -> dict[str, Any]:
    """The recipe's `precision_aware_optimizer`: a flag, or {enabled, exp_avg, exp_avg_sq, ...}
    with the moments' dtypes (Megatron-Core's OptimizerConfig defaults them to fp32)."""
    if isinstance(raw, bool):
        return {"precision_aware_optimizer": raw}
    if not isinstance(raw, dict) or not raw.get("enabled"):
        return {}
    size = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
    return {
        "precision_aware_optimizer": True,
        "exp_avg_bytes": size.get(str(raw.get("exp_avg", "fp32")), 4),
        "exp_avg_sq_bytes": size.get(str(raw.get("exp_avg_sq", "fp32")), 4),
    }


@functools.cache
def _recipes() -> dict[tuple[str, str, str, str], Recipe]:
    if not DATA.exists():
        return {}
    import yaml

    out = {}
    for raw in yaml.safe_load(DATA.read_text()) or []:
        if isinstance(raw, dict) and {"model", "system", "precision"} <= raw.keys():
            releases = raw.get("release", "")
            for rel in releases if isinstance(releases, list) else [releases]:
                key = (str(raw["model"]), str(raw["system"]), str(raw["precision"]), str(rel))
                out[key] = _as_recipe(raw)
    return out


def releases(model: str, system: str, precision: str) -> list[str]:
    """The releases whose recipe is recorded for this model, system and precision, oldest
    first."""
    return sorted(k[3] for k in _recipes() if k[:3] == (model, system, precision))


def recipe_for(model: str, system: str, precision: str, release: str = "") -> Recipe:
    """The recorded recipe of a table row (its release's, else the newest recorded for the
    same model, system and precision), else Megatron-Core's defaults."""
    table = _recipes()
    if (model, system, precision, release) in table:
        return table[(model, system, precision, release)]
    same = releases(model, system, precision)
    return table[(model, system, precision, same[-1])] if same else Recipe()


RAN_KEYS = ("tp", "pp", "cp", "vp", "ep", "mbs")  # the layout fields a `ran_layout` may set


def layout_ran(model: str, system: str, precision: str, release: str) -> tuple[dict[str, int], str]:
    """The layout fields a table row's own release's recipe ran where the row prints a
    layout that cannot be what ran, and why (`ran_layout` in recipes.yaml: the fields that
    differ, and `why`); ({}, "") where none is recorded. Only the row's own release counts:
    a later release's recipe says nothing about what an earlier table printed."""
    r = _recipes().get((model, system, precision, release))
    ran = r.notes.get("ran_layout") if r is not None else None
    if not isinstance(ran, dict):
        return {}, ""
    return {k: int(v) for k, v in ran.items() if k in RAN_KEYS}, str(ran.get("why", ""))


# SMs the EP dispatcher's kernels hold while they run beside compute: HybridEP's
# `moe_hybridep_num_sms: 32` (Megatron-Bridge recipes, recipes.yaml), DeepEP's normal kernels
# 24 (DeepEP's Buffer default, as `megatron_ep`'s `sms`), NCCL's all-to-all one block per
# channel (assumed 32 channels, NCCL's maximum on NVSwitch systems)
COMM_SMS = {"hybridep": 32, "deepep": 24, "alltoall": 32, "allgather": 32}


def comm_sms(recipe: Recipe) -> int:
    """SMs the recipe's EP dispatcher holds: the recipe's `comm_sms` (DeepEP's
    `Buffer.set_num_sms`, HybridEP's `moe_hybridep_num_sms`), else the dispatcher's default."""
    return recipe.comm_sms or COMM_SMS.get(recipe.dispatcher, COMM_SMS["alltoall"])


def bridge_queues(major: int, tp: int, cp: int, ep_overlap: bool, dispatcher: str) -> int:
    """The hardware queues Megatron-Bridge's performance scripts give a run
    (CUDA_DEVICE_MAX_CONNECTIONS; v0.3.0 `scripts/performance/perf_plugins.py`
    `_set_num_cuda_device_max_connections`): 8, 32 with DeepEP or HybridEP and on Blackwell
    and newer (compute capability `major` >= 10: "extra connections to avoid serialization
    of streams"); on Hopper and older one queue where TP or CP communication overlaps GEMMs
    without Megatron-Core's EP overlap (the queue keeps the host's order, so the
    communication kernel is scheduled before the persistent GEMM it overlaps). 25.09's
    `training/comm_overlap.py` sets one queue in the same cases at runtime; its other
    counts (8 or 32) give each stream of the step's graph a queue, as these do."""
    if major < 10 and (tp > 1 or cp > 1) and not ep_overlap:
        return 1
    return 32 if major >= 10 or dispatcher in ("deepep", "hybridep") else 8


# CUDA-graph scope names (Megatron-Core `--cuda-graph-scope`) -> the modules they capture
GRAPH_SCOPES = {
    "attn": {"attn", "core_attn", "layernorm", "mla_up_proj"},
    "mlp": {"mlp"},
    "moe_router": {"moe_router"},
    "moe_preprocess": {"moe_preprocess"},
    "moe": {"moe_router", "moe_preprocess", "moe", "moe_act", "shared_experts"},
    "full": {
        "attn",
        "core_attn",
        "layernorm",
        "mla_up_proj",
        "mlp",
        "moe",
        "moe_act",
        "moe_router",
        "moe_preprocess",
        "shared_experts",
        "embedding",
        "head",
        "mtp",
    },
}
GRAPH_SCOPES["full_iteration"] = GRAPH_SCOPES["full"]
