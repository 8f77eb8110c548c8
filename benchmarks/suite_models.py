"""A topology preset's GPU cost models against a recorded GPU-suite run (issue 27: "re-run the
GEMM / attention model benchmarks against them").

    python benchmarks/suite_models.py reports/gpu-h200-2026-11-27 [--preset topologies/X.yaml]

Reads the folder `benchmarks/gpu_suite.py` wrote (`env.json`, `kernels/*.csv`) and scores,
without fitting anything (benchmarks/suite_models_score.py says how each row is mapped):

1. the GEMM tile model (`gpu.gemm`, sim.hardware.costs.gemm) on `kernels/gemm.csv` and on the
   `kernels/grouped.csv` rows that are one batched GEMM (`bmm`) or E GEMMs back to back
   (`loop`; `grouped_mm` as one batched GEMM, an aside): MAPE and worst row per group;
2. the training step's kernel model (`gpu.kernels`, sim.training.kernels) on attention (the
   fastest backend per shape and pass; cuDNN, flash and efficient apart), the grouped expert
   GEMMs (the fastest impl per case), the dense GEMMs, FP8, the memory-bound kernels and the
   device copies: MAPE per part, and per share the range of shares the rows imply and the
   best MAPE any single share could reach (where that is large, one share cannot fit the
   part: a finding about the model's form, not a figure to tune).

The preset is the one the suite matched (`env.json` `preset.file`) unless `--preset` names
another (a path or a preset name). Results: `benchmarks/results/suite_models_<device>.{json,md}`
(`_<preset>` appended when `--preset` is not the suite's own; `--out` another folder).

A dry-run (CPU) folder is scored too: the report says the device is a CPU, and the suite's
CPU stand-in preset (localhost-cpu) has neither model, so it scores nothing there unless
`--preset` names a GPU preset (whose errors then say nothing about it). A folder without
`kernels/`, or with no preset named and no `--preset`, or a preset that does not load, is a
one-line error and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from benchmarks.common import device_tag  # noqa: E402
from benchmarks.suite_models_score import (  # noqa: E402
    TILE_GROUPS,
    implied_by,
    read_env,
    read_kernels,
    score_kernels,
    score_tiles,
    summarise,
    tile_rows,
)
from sim.core.errors import MoesimError  # noqa: E402
from sim.core.io import atomic_write_text  # noqa: E402
from sim.hardware.costs.gemm import GemmModel  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from sim.training.kernels import GpuKernels  # noqa: E402

OUT = ROOT / "benchmarks/results"
ONE_SHARE_MAPE = 10.0  # above this, the report says a single share cannot fit the part


class Refused(Exception):
    """A one-line reason to exit 2."""


def device_slug(env: dict[str, Any]) -> str:
    """'h200' of 'NVIDIA H200', 'h100' of 'NVIDIA H100 80GB HBM3', 'cpu' of a CPU."""
    if env.get("device_type") not in (None, "cuda") or env.get("dry_run"):
        return "cpu"
    return device_tag(str(env.get("device") or "gpu"))


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def load_preset(folder: Path, env: dict[str, Any], given: str | None) -> tuple[Topology, str]:
    named = (env.get("preset") or {}).get("file")
    want = given or named
    if not want:
        raise Refused(f"{folder}: env.json names no preset; pass --preset")
    path = Path(want)
    if not path.is_absolute() and (ROOT / path).is_file():
        path = ROOT / path
    try:
        topo = Topology.load(path if path.is_file() else want, nodes=1)
    except (MoesimError, OSError, ValueError) as e:
        raise Refused(f"preset {want}: {str(e).splitlines()[0]}") from None
    source = Path(topo.source)
    return topo, _rel(source) if source.is_file() else str(want)


def score_folder(folder: Path, preset: str | None = None) -> dict[str, Any]:
    """Everything the report says, as data (json-able)."""
    if not (folder / "kernels").is_dir():
        raise Refused(f"{folder}: no kernels/ folder (not a GPU-suite output)")
    env = read_env(folder)
    topo, preset_file = load_preset(folder, env, preset)
    kernels = read_kernels(folder)
    smi = env.get("nvidia_smi") or {}
    out: dict[str, Any] = {
        "source": _rel(folder),
        "device": env.get("device", "?"),
        "device_type": env.get("device_type", "?"),
        "dry_run": bool(env.get("dry_run")),
        "slug": device_slug(env),
        "driver": smi.get("driver_version"),
        "software": {k: env.get(k) for k in ("torch", "cuda", "cudnn", "nccl", "python")},
        "clocks": {k: smi.get(k) for k in ("clocks.sm", "clocks.max.sm", "clocks.mem")},
        "preset": preset_file,
        "preset_is_suites": preset is None or preset_file == (env.get("preset") or {}).get("file"),
        "rows_read": {k: len(v) for k, v in kernels.items()},
    }
    why = "the preset has no gpu.gemm"
    try:
        gemm = GemmModel.from_gpu(topo.gpu)
    except MoesimError as e:
        gemm, why = None, str(e)
    if gemm is None:
        out["tile_model"] = {"why": why, "scores": {}, "rows": []}
    else:
        rows = tile_rows(kernels)
        scored, scores = score_tiles(gemm, rows)
        left = sorted(set(rows["dtype"]) - set(scored["dtype"])) if not rows.empty else []
        out["tile_model"] = {
            "why": "",
            "efficiency": gemm.efficiency,
            "launch_s": gemm.launch_s,
            "not_scored_dtypes": left,
            "scores": scores,
            "rows": scored.to_dict("records"),
        }
    try:
        gpu = GpuKernels.from_gpu(topo.gpu, preset_file)
    except MoesimError as e:
        out["kernel_model"] = {"why": str(e), "parts": {}, "rows": [], "skipped": []}
        return out
    scored, skipped = score_kernels(gpu, kernels)
    out["kernel_model"] = {
        "why": "",
        "figures": {
            "gemm": gpu.gemm,
            "grouped_gemm": gpu.grouped_gemm,
            "attention_fwd": gpu.attention_fwd,
            "attention_bwd": gpu.attention_bwd,
            "attention_shape": (
                dataclasses.asdict(gpu.attention_shape) if gpu.attention_shape else None
            ),
            "memory_bound": gpu.memory_bound,
            "launch_s": gpu.launch_s,
            "kernel_s": gpu.kernel_s,
            "mem_bw": gpu.mem_bw,
        },
        "parts": summarise(scored),
        "implied": {
            "attention (fastest) by pass and L": implied_by(
                scored, "attention (fastest)", ("layout", "L")
            ),
            "attention (fastest) by pass and d_qk": implied_by(
                scored, "attention (fastest)", ("layout", "d_qk")
            ),
            "grouped (best impl) by tokens per expert": implied_by(
                scored, "grouped (best impl)", ("tokens",)
            ),
        },
        "skipped": skipped,
        "rows": scored.to_dict("records"),
    }
    return out


# -- the report -------------------------------------------------------------------------------
def _num(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _mape(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}%"


def findings(r: dict[str, Any]) -> list[str]:
    """One line per share that no single figure fits within ONE_SHARE_MAPE."""
    out = []
    for part, p in r["kernel_model"]["parts"].items():
        for share, s in p["shares"].items():
            if s["best_single_mape_pct"] > ONE_SHARE_MAPE:
                out.append(
                    f"- **{part}**: its rows imply `{share}` from {_num(s['implied_min'])} to "
                    f"{_num(s['implied_max'])} (the preset: {_num(s['preset'])}); the best "
                    f"single figure ({_num(s['best_single'])}) still leaves "
                    f"{s['best_single_mape_pct']:.1f}% MAPE over its {s['rows']} rows."
                )
    return out


def report(r: dict[str, Any]) -> str:
    sw = r["software"]
    cpu = r["slug"] == "cpu"
    lines = [
        f"# Cost models against a GPU-suite run: {r['device']}",
        "",
        f"Source: `{r['source']}` (made by `benchmarks/gpu_suite.py`). Preset: "
        f"`{r['preset']}`. Made by `python benchmarks/suite_models.py {r['source']}"
        + ("" if r["preset_is_suites"] else f" --preset {r['preset']}")
        + "`. Nothing is fitted here.",
        "",
        f"- device: {r['device']}"
        + (f"; driver {r['driver']}" if r["driver"] else "")
        + (f"; SM clock {r['clocks']['clocks.sm']}" if r["clocks"].get("clocks.sm") else ""),
        f"- torch {sw['torch']}, CUDA {sw['cuda']}, cuDNN {sw['cudnn']}, NCCL {sw['nccl']}, "
        f"Python {sw['python']}",
        "- rows read: " + ", ".join(f"{k} {v}" for k, v in r["rows_read"].items()),
    ]
    if cpu:
        lines += [
            "",
            "**The device is a CPU (a dry run).** Its times say nothing about a GPU preset; "
            "this report only shows that the scoring runs.",
        ]
    t = r["tile_model"]
    lines += ["", "## 1. The GEMM tile model (`gpu.gemm`)", ""]
    if t["why"]:
        lines.append(f"Not scored: {t['why']}.")
    else:
        lines += [
            "Predicted by sim.hardware.costs.gemm as `benchmarks/gpu_model_h100.py` does "
            "(layouts fwd / dgrad / wgrad = nn / nt / tn); a `loop` row is E times one "
            "expert's GEMM, each with the model's `launch_s` "
            f"({t['launch_s'] * 1e6:.1f} us). Error = predicted / measured - 1."
            + (
                f" Not scored (no efficiency for them): {', '.join(t['not_scored_dtypes'])}."
                if t["not_scored_dtypes"]
                else ""
            ),
            "",
            "| group | rows | MAPE | mean error | worst | worst row |",
            "|---|---:|---:|---:|---:|---|",
        ]
        rows = pd.DataFrame(t["rows"])
        for g in (*TILE_GROUPS, "all"):
            s = t["scores"].get(g)
            if not s:
                continue
            d = rows if g == "all" else rows[rows["group"] == g]
            mean = 100 * float(d["error"].mean())
            lines.append(
                f"| {g} | {s['rows']} | {s['mape_pct']:.1f}% | {mean:+.1f}% | "
                f"{s['worst_pct']:.1f}% | {s['worst']} |"
            )
    k = r["kernel_model"]
    lines += ["", "## 2. The training step's kernel model (`gpu.kernels`)", ""]
    if k["why"]:
        lines.append(f"Not scored: {k['why']}.")
        return "\n".join(lines) + "\n"
    f = k["figures"]
    lines += [
        "Each row charged as sim.training.step charges its kernels after a host sync: "
        "max(GpuKernels.seconds + kernels x kernel_s, kernels x launch_s), with the preset's "
        "gemm "
        + ", ".join(f"{d} {v}" for d, v in f["gemm"].items())
        + f", grouped_gemm {f['grouped_gemm']}, attention_fwd "
        f"{f['attention_fwd']}, attention_bwd {f['attention_bwd']}"
        + (
            f" at head dim 128 and L {f['attention_shape']['ref_len']:g}, carried to each "
            f"row's L and head dim by attention_shape (len0 {f['attention_shape']['len0']}; "
            "fitted to this sweep's attention rows: in-sample, benchmarks/attention_shape.py)"
            if f.get("attention_shape")
            else ""
        )
        + f", memory_bound "
        f"{f['memory_bound']}, launch_s {f['launch_s'] * 1e6:.1f} us, kernel_s "
        f"{f['kernel_s'] * 1e6:.2f} us. Error = charged / measured - 1.",
        "",
        "| part | rows | MAPE | mean error | worst | worst row | host-bound |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for part, p in k["parts"].items():
        lines.append(
            f"| {part} | {p['rows']} | {p['mape_pct']:.1f}% | {p['mean_error_pct']:+.1f}% | "
            f"{p['worst_pct']:+.1f}% | {p['worst']} | {p['host_bound_rows']} |"
        )
    if k["skipped"]:
        lines += ["", f"Not charged ({len(k['skipped'])}):"]
        lines += [f"- {s}" for s in k["skipped"]]
    lines += [
        "",
        "### Can one share fit each part?",
        "",
        "Implied share: the figure that would make a row's charge exact. Best single: the one "
        "figure with the lowest MAPE over the part's rows, and that MAPE.",
        "",
        "| part | share | preset | implied min | implied max | best single | its MAPE |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for part, p in k["parts"].items():
        for share, s in p["shares"].items():
            lines.append(
                f"| {part} | `{share}` | {_num(s['preset'])} | {_num(s['implied_min'])} | "
                f"{_num(s['implied_max'])} | {_num(s['best_single'])} | "
                f"{_mape(s['best_single_mape_pct'])} |"
            )
    found = findings(r)
    if found:
        lines += ["", f"Where no single share fits within {ONE_SHARE_MAPE:.0f}%:", "", *found]
    for title, by in k["implied"].items():
        if by:
            lines += [
                "",
                f"Median implied share, {title}: "
                + ", ".join(f"{key} {v:.3g}" for key, v in by.items()),
            ]
    lines += [
        "",
        "## Every row",
        "",
        "### Tile model",
        "",
        "| group | GEMM | dtype | batch | m | n | k | layout | measured us | model us | error |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for x in t.get("rows", []):
        lines.append(
            f"| {x['group']} | {x['bench']} | {x['dtype']} | {_batch(x)} | {x['m']} | "
            f"{x['n']} | {x['k']} | {x['layout']} | {x['seconds'] * 1e6:.1f} | "
            f"{x['predicted'] * 1e6:.1f} | {100 * x['error']:+.1f}% |"
        )
    lines += [
        "",
        "### Kernel model",
        "",
        "| part | name | impl | pass | shape | dtype | measured us | charged us | error | "
        "bound | share | implied |",
        "|---|---|---|---|---|---|---:|---:|---:|---|---|---:|",
    ]
    for x in k["rows"]:
        lines.append(
            f"| {x['group']} | {x['name']} | {x['impl']} | {x['layout']} | {x['shape']} | "
            f"{x['dtype']} | {x['measured_s'] * 1e6:.1f} | {x['charged_s'] * 1e6:.1f} | "
            f"{100 * x['error']:+.1f}% | {x['bound']} | {x['share']} | "
            f"{_num(x['implied_share'])} |"
        )
    return "\n".join(lines) + "\n"


def _batch(x: dict[str, Any]) -> str:
    """A row's batch; a loop's as `E x 1` (E GEMMs of one expert each)."""
    return f"{x['repeat']} x {x['batch']}" if x.get("repeat", 1) > 1 else str(x["batch"])


def _no_nan(x: Any) -> Any:
    """The data with NaN as null (strict JSON)."""
    if isinstance(x, float):
        return None if math.isnan(x) else x
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_no_nan(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a GPU-suite output folder")
    ap.add_argument("--preset", help="topology preset (path or name); default: the suite's")
    ap.add_argument("--out", type=Path, default=OUT, help="results folder (%(default)s)")
    a = ap.parse_args(argv)
    try:
        r = score_folder(a.folder, a.preset)
    except Refused as e:
        print(f"suite_models: {e}", file=sys.stderr)
        return 2
    name = f"suite_models_{r['slug']}"
    if not r["preset_is_suites"]:
        name += "_" + re.sub(r"[^a-z0-9]+", "-", Path(r["preset"]).stem.lower())
    a.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_no_nan(r), indent=1, default=str, allow_nan=False)
    atomic_write_text(a.out / f"{name}.json", text + "\n")
    atomic_write_text(a.out / f"{name}.md", report(r))
    print(f"{r['device']} ({r['source']}) against {r['preset']}:")
    for g, s in (r["tile_model"].get("scores") or {}).items():
        print(f"  tile model  {g:22s} {s['rows']:4d} rows  MAPE {s['mape_pct']:5.1f}%")
    for g, p in (r["kernel_model"].get("parts") or {}).items():
        print(f"  kernels     {g:22s} {p['rows']:4d} rows  MAPE {p['mape_pct']:5.1f}%")
    for why in (r["tile_model"]["why"], r["kernel_model"]["why"]):
        if why:
            print(f"  not scored: {why}")
    print(f"wrote {_rel(a.out / name)}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
