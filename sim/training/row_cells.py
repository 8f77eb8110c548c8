"""The cells of a `moesim predict` row besides the layout (`sim.training.predict`): an
integer cell, the optional recipe-choice columns over the row's recipe (what `moesim plan`'s
candidates and its best.csv set) and the routing's imbalance."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.core.errors import ConfigError
from sim.hardware.costs.resources import MAX_CONNECTIONS
from sim.training.pipeline_kind import PIPELINES
from sim.training.recipe import Recipe

# optional columns over the row's recipe (empty: the recipe's): the EP dispatcher, EP overlap,
# the SMs the dispatcher's kernels hold (0: its default), the recomputation (none, selective:
# the recipe's modules or the default ones, full: every layer, or with `recompute_layers` N
# the first N of each model chunk; 0: every layer), the pipeline's stages (`even`,
# or a Megatron-Core layout string), layers offloaded per stage, MTP modules, the pipeline
# schedule (1f1b, dualpipe, dualpipev: `sim.training.pipeline_kind`); and the model's
# transformer layers (`num_layers`: a shortened model, as proxies of large ones are run,
# its first dense layers kept); the hardware queues the step's streams share
# (`max_connections`, CUDA_DEVICE_MAX_CONNECTIONS: 1 to 32)
CHOICES = (
    "dispatcher",
    "ep_overlap",
    "comm_sms",
    "recompute",
    "recompute_layers",
    "pipeline_layout",
    "offload_layers",
    "mtp",
    "pipeline",
    "num_layers",
    "max_connections",
)
DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
RECOMPUTE = ("none", "selective", "full")
ON_OFF = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def int_cell(
    cols: dict[str, Any], key: str, where: str, default: int | None = None, low: int = 1
) -> int:
    raw = str(cols.get(key, "") or "").strip()
    if raw == "":
        if default is None:
            raise ConfigError(f"{where}: {key}: a value is required")
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{where}: {key}: expected an integer, got {raw!r}") from None
    if not v.is_integer() or v < low or v > 1e9:
        raise ConfigError(f"{where}: {key}: expected an integer >= {low}, got {raw!r}")
    return int(v)


def parse_choices(cols: dict[str, Any], where: str) -> dict[str, Any]:
    """The row's CHOICES columns that are not empty, checked (one-line errors)."""
    out: dict[str, Any] = {}
    for k in CHOICES:
        raw = str(cols.get(k, "") or "").strip()
        if raw == "":
            continue
        if k == "dispatcher":
            if raw not in DISPATCHERS:
                raise ConfigError(
                    f"{where}: dispatcher: expected one of {DISPATCHERS}, got {raw!r}"
                )
            out[k] = raw
        elif k == "ep_overlap":
            if raw.lower() not in ON_OFF:
                raise ConfigError(f"{where}: ep_overlap: expected on or off, got {raw!r}")
            out[k] = ON_OFF[raw.lower()]
        elif k == "recompute":
            if raw not in RECOMPUTE:
                raise ConfigError(f"{where}: recompute: expected one of {RECOMPUTE}, got {raw!r}")
            out[k] = raw
        elif k == "pipeline_layout":
            out[k] = "" if raw == "even" else raw
        elif k == "pipeline":
            if raw not in PIPELINES:
                raise ConfigError(f"{where}: pipeline: expected one of {PIPELINES}, got {raw!r}")
            out[k] = raw
        elif k == "max_connections":
            out[k] = int_cell(cols, k, where)
            if out[k] > MAX_CONNECTIONS:
                raise ConfigError(
                    f"{where}: max_connections: expected 1 to {MAX_CONNECTIONS} hardware "
                    f"queues (CUDA_DEVICE_MAX_CONNECTIONS), got {raw!r}"
                )
        else:  # comm_sms, recompute_layers, offload_layers, mtp, num_layers
            out[k] = int_cell(cols, k, where, low=1 if k == "num_layers" else 0)
    if out.get("recompute_layers") and out.get("recompute", "full") != "full":
        raise ConfigError(
            f"{where}: recompute_layers: {out['recompute_layers']} layers fully recomputed, "
            f"but recompute is {out['recompute']!r} (expected full)"
        )
    return out


def with_choices(recipe: Recipe, choices: dict[str, Any], mla: bool) -> Recipe:
    """`recipe` with the CHOICES given over it (`moesim plan`'s candidates are built so)."""
    kw: dict[str, Any] = {}
    if "dispatcher" in choices:
        kw["dispatcher"] = choices["dispatcher"]
    if "ep_overlap" in choices:
        kw["ep_overlap"] = choices["ep_overlap"]
    if "comm_sms" in choices:
        kw["comm_sms"] = choices["comm_sms"] or None
    rc = choices.get("recompute")
    if rc is not None:
        modules: tuple[str, ...] = ()
        if rc == "selective":
            default = ("mla_up_proj",) if mla else ("layernorm", "moe_act")
            modules = recipe.recompute_modules or default
        kw.update(recompute_modules=modules, recompute_full=rc == "full", recompute_layers=None)
    if "recompute_layers" in choices:  # N: the first N layers of each model chunk; 0: all
        kw["recompute_layers"] = choices["recompute_layers"] or None
    for k in ("pipeline_layout", "offload_layers", "mtp", "pipeline", "max_connections"):
        if k in choices:
            kw[k] = choices[k]
    return replace(recipe, **kw) if kw else recipe


def imbalance_cell(cols: dict[str, Any], where: str) -> float:
    """The optional `routing_max_mean` column: routed rows of the hottest EP rank over the
    mean (UltraEP, arXiv 2606.04101, measured 1.30-4.01); empty: balanced routing (1)."""
    raw = str(cols.get("routing_max_mean", "") or "").strip()
    if raw == "":
        return 1.0
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not 1.0 <= v <= 1e6:  # nan fails too
        raise ConfigError(f"{where}: routing_max_mean: expected a number >= 1, got {raw!r}")
    return v
