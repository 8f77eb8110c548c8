"""The text forms of `moesim plan`'s choices (`sim.training.plan_space`): a given layout
(`--layout tp=1,pp=2,...`) as a candidate and `--grid KEY=V1,V2,...` as the values a plan
tries, with one-line errors naming the key."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.hardware.costs.resources import MAX_CONNECTIONS
from sim.training.pipeline_kind import PIPELINES
from sim.training.plan_space import DISPATCHER, GRID, LAYOUT_KEYS, RECOMPUTE, Candidate


def parse_layout(text: str, where: str = "--layout") -> Candidate:
    """`tp=1,pp=2,vp=12,ep=8,mbs=1[,cp=1,overlap=on,recompute=full,recompute_layers=2,
    fsdp=off,dispatcher=deepep,sms=24,offload=0,pipeline=1f1b,queues=1]` as a candidate."""
    vals: dict[str, Any] = {"tp": 1, "cp": 1, "pp": 1, "vp": 1, "ep": 1, "mbs": 1}
    extra: dict[str, Any] = {}
    seen: set[str] = set()
    for part in filter(None, text.split(",")):
        if "=" not in part:
            raise ConfigError(f"{where}: {part!r}: expected KEY=VALUE")
        k, v = (x.strip() for x in part.split("=", 1))
        if k in seen:  # the last would win silently: which one the user meant is unknown
            raise ConfigError(f"{where}: {k}: given twice")
        seen.add(k)
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
        elif k == "pipeline":
            if v not in PIPELINES:
                raise ConfigError(f"{where}: pipeline: expected one of {PIPELINES}, got {v!r}")
            extra["pipeline"] = v
        elif k in ("sms", "offload", "recompute_layers", "queues"):
            low = int(k == "recompute_layers")
            if not v.isdigit() or int(v) < low or k == "queues" and int(v) > MAX_CONNECTIONS:
                top = f" and <= {MAX_CONNECTIONS}" if k == "queues" else ""
                raise ConfigError(f"{where}: {k}: expected an integer >= {low}{top}, got {v!r}")
            extra["comm_sms" if k == "sms" else k] = int(v)
        else:
            raise ConfigError(
                f"{where}: unknown key {k!r} (keys: {', '.join(LAYOUT_KEYS)}, overlap, "
                "recompute, recompute_layers, fsdp, dispatcher, sms, offload, pipeline, queues)"
            )
    if extra.get("recompute_layers") and extra.get("recompute") != "full":
        raise ConfigError(f"{where}: recompute_layers: needs recompute=full (its first N layers)")
    return Candidate(**vals, **extra)


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
        if k in grid:
            raise ConfigError(f"{where}: {k}: given twice (list its values in one {k}=...)")
        vals = [x.strip() for x in v.split(",") if x.strip()]
        if not vals:
            raise ConfigError(f"{where}: {k}: no values")
        if isinstance(GRID[k][0], int):
            try:
                grid[k] = tuple(int(x) for x in vals)
            except ValueError:
                raise ConfigError(f"{where}: {k}: expected integers, got {v!r}") from None
            low = 0 if k in ("comm_sms", "offload", "queues") else 1
            if min(grid[k]) < low:
                raise ConfigError(f"{where}: {k}: expected integers >= {low}, got {v!r}")
        else:
            allowed = {"recompute": RECOMPUTE, "dispatcher": DISPATCHER, "pipeline": PIPELINES}[k]
            bad = [x for x in vals if x not in allowed]
            if bad:
                raise ConfigError(f"{where}: {k}: {bad[0]!r} is not one of {', '.join(allowed)}")
            grid[k] = tuple(vals)
    return grid
