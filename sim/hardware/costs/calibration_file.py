"""The calibration file: its format, the checks every number passes (when written and when
read, by the same rules), older formats, and what it stands for as `costs:`.

Format 2 (this one):

  format: 2
  meta:          who measured what: backend, nprocs, device (type, name, capability, SMs),
                 host, cpu, python, torch, cuda, nccl versions, when; `stand_ins` maps a graph
                 dtype to the dtype the device really ran it in (on CPU every dtype runs as
                 fp32: exec.runtime.ops.STAND_INS); `warnings` from the fit
  compute:       op -> {alpha, beta, r2, mean_error, sizes}, or for GEMMs dtype -> that
  collectives:   op -> [{ranks (>= 2), alpha, beta, r2, mean_error, n}]
  interference:  stream kind -> {other kinds: relative speed in [SPEED_FLOOR, 1]}
  dispatch:      stream | cross -> {mean, median, n}
  gemm_shapes:   [{batch, m, n, k, dtype, layout, seconds}]
  jitter:        op -> quantiles of time / median

Format 1 (no `format` key) had one GEMM fit for every dtype, measured in fp32, and fitted
one-rank collectives as network costs: on a GPU that made bf16 graphs ~10x too slow. It is
read with a warning: its GEMM fits and shapes count as fp32 (what was measured; on a CPU fp32
stands in for every dtype, as it did), one-rank collectives and what was derived from them
are dropped.

A calibration applied to a topology whose GPU is of another family than the device it was
measured on (an H100 file on `dgx-a100`, a CPU file on `dgx-h100`) is reported with a warning.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from sim.core import schema
from sim.core.errors import ConfigError
from sim.hardware.calibration_schema import (
    FORMAT,
    SPEED_FLOOR,
    CalibrationFile,
    CalibrationFileV1,
)
from sim.hardware.costs.gemm import DTYPE_BYTES

__all__ = [
    "FORMAT",
    "SPEED_FLOOR",
    "CalibrationWarning",
    "check",
    "clip_to_range",
    "cost_spec",
    "read",
]
CPU_STAND_INS = {"bf16": "fp32", "fp16": "fp32", "tf32": "fp32", "fp8": "fp32", "fp4": "fp32"}


class CalibrationWarning(UserWarning):
    """A calibration that is usable but stale, foreign or of doubtful quality."""


def is_fit(entry: Any) -> bool:
    """A compute entry is one fit ({alpha, beta, ...}) or a mapping dtype -> fit."""
    return isinstance(entry, dict) and "alpha" in entry


# -- reading ---------------------------------------------------------------------------------
def read(path: str | Path) -> dict[str, Any]:
    """The file as a format-2 mapping, checked; older formats upgraded with a warning."""
    from sim.core.safeload import load_yaml  # regular file, UTF-8, no alias bombs

    p = Path(path)
    raw: object = load_yaml(p, "calibration file")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"calibration file {p}: expected a mapping with 'compute' and/or "
            f"'collectives', got {type(raw).__name__}"
        )
    fmt = raw.get("format", 1)
    if type(fmt) is not int or fmt < 1:
        raise ConfigError(f"calibration file {p}: format: expected an integer >= 1, got {fmt!r}")
    if fmt > FORMAT:
        raise ConfigError(
            f"calibration file {p}: format {fmt} is newer than this moesim reads ({FORMAT})"
        )
    if fmt < FORMAT:
        if "format" in raw:
            raise ConfigError(f"calibration file {p}: format 1 files have no 'format' key")
        schema.check(CalibrationFileV1, raw, f"calibration file {p} (format 1)")
        raw = upgrade_v1(raw)
    check(raw, f"calibration file {p}")
    if fmt < FORMAT:  # usable, but say what the upgrade changed
        warnings.warn(
            CalibrationWarning(
                f"calibration file {p} is stale (format {fmt}, from an older moesim): its GEMMs "
                f"were measured in fp32 only, so they now count for fp32 graphs"
                + (" (and, on this CPU, for every dtype)" if _is_cpu(raw["meta"]) else "")
                + "; one-rank collectives are dropped. Run `moesim calibrate` again for "
                "per-dtype fits."
            ),
            stacklevel=2,
        )
    return raw


def _is_cpu(meta: dict[str, Any]) -> bool:
    return (
        meta.get("device_type") == "cpu"
        or str(meta.get("device", "")).startswith("cpu")
        or (meta.get("backend") == "gloo")
    )


def upgrade_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A format-1 mapping (already checked against CalibrationFileV1) as format 2."""
    meta = dict(raw.get("meta") or {})
    cpu = _is_cpu(meta)
    if cpu:
        meta.setdefault("device_type", "cpu")
        meta.setdefault("stand_ins", dict(CPU_STAND_INS))
    compute = dict(raw.get("compute") or {})
    if is_fit(compute.get("gemm")):
        compute["gemm"] = {"fp32": compute["gemm"]}
    collectives = {
        op: [f for f in fits if f["ranks"] >= 2]
        for op, fits in (raw.get("collectives") or {}).items()
    }
    collectives = {op: fits for op, fits in collectives.items() if fits}
    inter = raw.get("interference") or {}
    if not collectives:  # one rank: the comm stream ran local copies, not communication
        inter = {
            s: {k: v for k, v in row.items() if "comm" not in k.split("+")}
            for s, row in inter.items()
            if s != "comm"
        }
    shapes = [{**r, "dtype": r.get("dtype", "fp32")} for r in raw.get("gemm_shapes") or []]
    return {
        "format": FORMAT,
        "meta": meta,
        "compute": compute,
        "collectives": collectives,
        "interference": {s: row for s, row in inter.items() if row},
        "dispatch": raw.get("dispatch") or {},
        "gemm_shapes": shapes,
        "jitter": raw.get("jitter") or {},
    }


# -- the checks ------------------------------------------------------------------------------
def check(raw: Any, where: str) -> None:
    """Raise ConfigError naming every number of the file that is not usable, in one line
    (sim.hardware.calibration_schema: the same rules when written and when read)."""
    schema.check(CalibrationFile, raw, where)


# Bounds a measurement can cross on a busy host (a jitter factor of 1,425, an interference
# speed of 0.03): pydantic's error types with the bound's name in the error's context.
_BOUNDS = {
    "less_than_equal": "le",
    "less_than": "lt",
    "greater_than_equal": "ge",
    "greater_than": "gt",
}


def clip_to_range(raw: dict[str, Any]) -> list[str]:
    """Clip, in place, every number of a calibration about to be written that lies outside
    the range the file's schema accepts, and say what was clipped (one sentence each).

    A long measurement is never thrown away for one wild number: the file is written with the
    value at the nearest bound and the sentence among its warnings, so `validate` can run
    and say how far to trust it. What is not a number out of range is left for `check`."""
    import math

    from pydantic import ValidationError

    notes: list[str] = []
    for _ in range(8):  # a clip can only reveal others below it (a union's other branch)
        try:
            CalibrationFile.model_validate(raw)
            return notes
        except ValidationError as e:
            errors = e.errors(include_url=False)
        clipped = 0
        for err in errors:
            op = _BOUNDS.get(err["type"])
            got = err.get("input")
            if op is None or not isinstance(got, (int, float)) or isinstance(got, bool):
                continue
            bound = float(err["ctx"][op])
            to = {
                "le": bound,
                "ge": bound,
                "lt": math.nextafter(bound, -math.inf),
                "gt": math.nextafter(bound, math.inf),
            }[op]
            path = _set(raw, err["loc"], to)
            if path is not None:
                clipped += 1
                notes.append(
                    f"{path}: measured {got:g}, outside the model's range ({op} {bound:g}); "
                    f"clipped to {to:g} (a busy host? calibrate again on a quiet one)"
                )
        if not clipped:
            return notes
    return notes


def _set(raw: Any, loc: tuple[Any, ...], value: float) -> str | None:
    """Set the number at a pydantic error location (skipping the names pydantic adds for
    union members and validators); its dotted path, or None where the path is not in
    `raw`."""
    node: Any = raw
    path: list[Any] = []
    for i, key in enumerate(loc):
        present = (isinstance(node, dict) and key in node) or (
            isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)
        )
        if not present:
            continue  # a union member's or validator's name, not a key of the file
        if i == len(loc) - 1:
            node[key] = value
            return ".".join(map(str, [*path, key]))
        node, path = node[key], [*path, key]
    return None


# -- as costs --------------------------------------------------------------------------------
def cost_spec(raw: dict[str, Any]) -> dict[str, Any]:
    """The `costs:` overlay a (checked, format-2) calibration stands for (CostModel.build).

    A dtype the device ran as another (meta.stand_ins) gets that dtype's fits and shapes."""
    stand_ins = (raw.get("meta") or {}).get("stand_ins") or {}
    spec: dict[str, Any] = {}
    compute = raw.get("compute") or {}
    if compute:
        spec["compute"] = "alpha_beta"
        ab: dict[str, Any] = {}
        for op, entry in compute.items():
            if is_fit(entry):
                ab[op] = {"alpha": entry["alpha"], "beta": entry["beta"]}
                continue
            per = {dt: {"alpha": f["alpha"], "beta": f["beta"]} for dt, f in entry.items()}
            for graph_dt, ran in stand_ins.items():
                if graph_dt not in per and ran in per:
                    per[graph_dt] = per[ran]
            # one fit standing for every dtype (a CPU's fp32): a fit for any dtype, which
            # dtype-blind readers (PipeMoE's selector) understand too
            only = {id(f) for f in per.values()}
            ab[op] = (
                next(iter(per.values())) if set(per) >= set(DTYPE_BYTES) and len(only) == 1 else per
            )
        spec["alpha_beta"] = ab
    if raw.get("collectives"):
        spec["network"] = "collective"
        spec["collectives"] = {
            k: [{"ranks": f["ranks"], "alpha": f["alpha"], "beta": f["beta"]} for f in v]
            for k, v in raw["collectives"].items()
        }
    if raw.get("interference"):
        spec["interference"] = raw["interference"]
    shapes = list(raw.get("gemm_shapes") or [])
    if shapes:

        def key(r: dict[str, Any], dt: Any) -> tuple[Any, ...]:
            return (r.get("batch", 1), r["m"], r["n"], r["k"], dt, r.get("layout", "nn"))

        have = {key(r, r.get("dtype")) for r in shapes}
        for r in list(shapes):
            for graph_dt, ran in stand_ins.items():
                k = key(r, graph_dt)
                if r.get("dtype") == ran and k not in have:
                    shapes.append({**r, "dtype": graph_dt})
                    have.add(k)
        spec["gemm_shapes"] = shapes
    if raw.get("jitter"):
        spec["jitter"] = {"quantiles": raw["jitter"]}
    if raw.get("dispatch"):
        spec["dispatch"] = {k: v["mean"] for k, v in raw["dispatch"].items()}
    if raw.get("launch"):
        spec["launch"] = {k: v["mean"] for k, v in raw["launch"].items()}
    return spec


# -- foreign devices -------------------------------------------------------------------------
_FAMILY = re.compile(r"(?<![A-Za-z0-9])([ABHLTV]\d{2,3}|\d{4}(?=[- ]?Ti)|(?<=RTX[- ])\d{4})")


def family(name: str) -> str | None:
    """'H100' of 'NVIDIA H100 80GB HBM3' and of 'H100-SXM5-80GB'; 'cpu' of a CPU."""
    if re.search(r"\bcpu\b", name, re.IGNORECASE):
        return "cpu"
    m = _FAMILY.search(name)
    return m.group(1) if m else None


def foreign(meta: dict[str, Any], gpu_model: str, topology: str) -> str | None:
    """A warning when the calibration was measured on another kind of device than the
    topology's GPU; None when they agree or either is unknown."""
    measured = "cpu" if _is_cpu(meta) else str(meta.get("device_name") or "")
    a, b = family(measured), family(gpu_model)
    if a is None or b is None or a == b:
        return None
    return (
        f"calibration measured on {measured!r} applied to topology {topology!r} "
        f"({gpu_model}): its compute costs and interference are that device's, not this one's"
    )
